//go:build !slim

package python

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/rootfs/rootfstest"
	"github.com/quro-dev/quro/internal/runcode"
)

// sharedRootfs is the shared ready Debian rootfs "default", built once per
// machine by whichever package's test needs it first (rootfstest.Default).
func sharedRootfs(t testing.TB) *rootfs.Manager {
	t.Helper()
	m := rootfstest.Default(t)
	if !testSB.Boxed() {
		t.Skip("no bubblewrap box: a rootfs cannot be shown")
	}
	return m
}

func runIn(t *testing.T, e *Rootfs, name, code string, via Via, timeout time.Duration) ran {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := e.RunIn(ctx, name, &runcode.Request{Code: code, Lang: "python", Session: newSession(t), Timeout: timeout, Stdout: &out, Stderr: &errb}, via)
	if err != nil {
		t.Fatalf("RunIn(%q): %v", code, err)
	}
	return ran{res, out.String(), errb.String()}
}

// The engine's Run leaves to the next tier a session that has no rootfs or
// whose rootfs is not installed, and refuses NUL bytes as Python would,
// without starting anything.
func TestRootfsEngineFallsThroughAndRefusesNUL(t *testing.T) {
	e := NewRootfs(testSB, rootfs.New(t.TempDir()))
	s := newSession(t)
	var out, errb bytes.Buffer
	req := &runcode.Request{Code: "print(1)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: &errb}
	if _, err := e.Run(context.Background(), req); !errors.Is(err, ErrNoRootfs) {
		t.Errorf("host session: %v, want ErrNoRootfs", err)
	}
	s.Rootfs = "missing"
	if _, err := e.Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), `rootfs "missing" is not installed`) {
		t.Errorf("missing rootfs: %v", err)
	}
	for _, via := range []Via{ViaStdin, ViaArg} {
		r := runIn(t, e, "missing", "print(1)\nx = '\x00'", via, time.Minute)
		if r.ExitCode != 1 || !strings.HasPrefix(r.err, "SyntaxError: source code cannot contain null bytes (first at line 2)") || r.out != "" {
			t.Errorf("via %d: %+v %q", via, r.Result, r.err)
		}
	}
}

// RunIn runs the rootfs's python3, not the host's, in the session's
// workspace, with the code on stdin or as -c's argument; how a run ended
// is runcode.ExitResult's (here a timeout, with the output so far kept).
func TestRootfsRunInRealRootfs(t *testing.T) {
	t.Parallel()
	e := NewRootfs(testSB, sharedRootfs(t))
	const probe = "import os, sys\nprint(sys.argv[0], sys.flags.isolated, open('/etc/debian_version').read().strip()[:2], os.path.exists('/usr/share/debootstrap'))"
	for via, argv0 := range map[Via]string{ViaStdin: "-", ViaArg: "-c"} {
		r := runIn(t, e, rootfs.DefaultName, probe, via, time.Minute)
		if r.ExitCode != 0 || r.Error != "" || r.out != argv0+" 1 12 False\n" {
			t.Errorf("via %d: %+v out %q err %q", via, r.Result, r.out, r.err)
		}
	}
	r := runIn(t, e, rootfs.DefaultName, "import sys\nprint('before', flush=True)\nimport time\ntime.sleep(600)", ViaArg, 20*time.Second) // the budget covers the box's start (3 s was too short at a make test's load)
	if !r.TimedOut || !r.Interrupted || r.out != "before\n" || !strings.Contains(r.Error, "timed out after 20s") {
		t.Errorf("timeout: %+v out %q", r.Result, r.out)
	}
	// Through Run the session's own rootfs is used, without a note: the
	// session chose it.
	s := newSession(t)
	s.Rootfs = rootfs.DefaultName
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := e.Run(ctx, &runcode.Request{Code: "print(6*7)", Session: s, Timeout: time.Minute, Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 || out.String() != "42\n" || len(res.Notes) != 0 {
		t.Errorf("Run: %v %+v %q %q", err, res, out.String(), errb.String())
	}
}
