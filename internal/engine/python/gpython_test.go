package python

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

func TestGPython(t *testing.T) {
	t.Parallel()
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGPython(sb)
	if err := g.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: "g", Dir: filepath.Join(t.TempDir(), "s")}
	os.MkdirAll(s.Workspace(), 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	for _, tc := range []struct {
		name, code      string
		timeout         time.Duration
		exit            int
		out, err, error string
	}{
		{name: "print", code: "def f(n):\n    return n * 2\nprint(f(21))", out: "42\n"},
		{name: "exception", code: "x = 1\n1/0", exit: 1, err: "ZeroDivisionError"},
		{name: "sys.exit", code: "import sys\nsys.exit(5)", exit: 5},
		// The budget covers the sandbox's start too (the timeout is the
		// context's): 300 ms ran out before the child started on a loaded machine.
		{name: "timeout kills the child", code: "while True:\n    pass", timeout: 2 * time.Second, exit: 137, error: "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Minute
			}
			// The run's own timeout is the request's; the context only
			// bounds the test (a start on a loaded machine may take
			// longer than a short run's timeout).
			ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
			defer cancel()
			var out, errb bytes.Buffer
			res, err := g.Run(ctx, &runcode.Request{Code: tc.code, Session: s, Timeout: timeout, Stdout: &out, Stderr: &errb})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.exit || out.String() != tc.out || !strings.Contains(errb.String(), tc.err) || !strings.Contains(res.Error, tc.error) {
				t.Fatalf("exit %d out %q err %q error %q", res.ExitCode, out.String(), errb.String(), res.Error)
			}
			if len(res.Notes) == 0 || !strings.HasPrefix(res.Notes[0], "Python subset (gpython)") {
				t.Fatalf("notes %q", res.Notes)
			}
		})
	}
}
