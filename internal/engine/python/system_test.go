package python

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
)

// The system tier's probe of a python3 that does not start fails with
// what it printed, and what it left running in its process group is
// killed with it (the probe runs through sandbox.RunHelper): here a
// "python3" that starts a long sleep in the background, says why it
// fails, and exits.
func TestSystemProbeSaysWhyAndLeavesNothingRunning(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	sb := fakePython3(t, "sleep 1000 </dev/null >/dev/null 2>&1 &\necho $! > "+pidFile+"\necho 'Fatal Python error: no encodings module' >&2\nexit 1\n")
	err := NewSystem(sb).Probe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not start: exit status 1: Fatal Python error: no encodings module") {
		t.Fatalf("probe of a python3 that fails: %v, want it to say it does not start, with its stderr", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The background sleep is killed, not left for 1000 s: wait for its
	// end on a pidfd (an event), bounded so that a survivor fails rather
	// than hangs. Gone already (killed and reaped) is as good.
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return
	}
	if err != nil {
		t.Fatalf("pidfd of the background sleep %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("the background sleep %d of the failed probe still runs 10 s after it: its process group was not killed", pid)
		}
		return
	}
}

// The system tier's verdict is kept for the process by the python3's
// path: a second System (a second App's) does not start that python3
// again, and gets the same verdict; a probe its context cut short gives
// none and is not kept.
func TestSystemProbeVerdictIsKeptPerProcess(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	sb := fakePython3(t, "echo run >> "+runs+"\necho 'Fatal Python error: kept' >&2\nexit 1\n")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewSystem(sb).Probe(canceled); err == nil {
		t.Fatal("a probe with a canceled context passed")
	}
	var errs []error
	for range 2 {
		errs = append(errs, NewSystem(sb).Probe(context.Background()))
	}
	for _, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "Fatal Python error: kept") {
			t.Fatalf("verdicts %v, want both to say it does not start", errs)
		}
	}
	b, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "run\n"); n != 1 {
		t.Fatalf("python3 started %d times for two probes after a canceled one, want 1", n)
	}
}

// fakePython3 is a sandbox whose PATH finds only a "python3" that is the
// shell script body, in a directory of the test's own.
func fakePython3(t *testing.T, body string) *sandbox.Sandbox {
	t.Helper()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "python3"), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.New(&sandbox.Options{Path: bin})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}
