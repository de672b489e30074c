package terminal

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// TestPTYEndsWhileABackgroundJobHoldsTheTerminal: the shell exits while
// a job it started in the background still has the terminal open (as its
// stdin, stdout and stderr). The viewers are told the end (their channel
// closes, which the WebSocket route turns into its exit message) at once,
// not when that job ends.
func TestPTYEndsWhileABackgroundJobHoldsTheTerminal(t *testing.T) {
	sb, err := sandbox.New(&sandbox.Options{SessionBoxes: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.CloseBoxes)
	s := &session.Session{ID: "0123456789abcdef0123456789abcdef", Name: "t", Dir: t.TempDir()}
	os.MkdirAll(s.Workspace(), 0o755)
	os.MkdirAll(s.TmpDir(), 0o755)
	p, err := StartPTY(PTYOptions{Sandbox: sb, Session: s, Cols: 80, Rows: 24, Env: map[string]string{"PS1": "$ "}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	v, _ := p.Attach()
	var seen strings.Builder
	p.Write([]byte("sleep 120 & echo started-$((6*7))\n"))
	readUntil(t, v, &seen, "started-42")
	p.Write([]byte("exit 3\n"))
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the shell did not exit")
	}
	deadline := time.After(15 * time.Second)
	for {
		select {
		case _, ok := <-v.C:
			if !ok {
				if code, _ := p.ExitCode(); code != 3 {
					t.Fatalf("exit code %d, want 3", code)
				}
				return
			}
		case <-deadline:
			t.Fatal("the viewer was not told the end 15 s after the shell exited: the PTY's reader still waits on the terminal the background job holds")
		}
	}
}
