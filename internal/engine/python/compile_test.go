//go:build !slim

package python

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCanceledCompileLeavesNoWorker: an interpreter that, like compileall
// -j 0, starts workers holding the output pipe and is then canceled
// mid-way: compileTree returns, and every process of its group is gone.
// Before, only the parent was killed and the call waited on the pipe for
// as long as the workers ran.
func TestCanceledCompileLeavesNoWorker(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pids")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A stand-in interpreter: two workers in its process group (one of
	// them a grandchild), all holding stdout and stderr, then it reports
	// the pids and waits. It also checks its environment is the fixed one.
	fake := filepath.Join(dir, "python")
	os.WriteFile(fake, []byte(`#!/bin/sh
[ "$QURO_TEST_LEAK" = "" ] || { echo "server environment leaked" > `+fifo+`; exit 99; }
sleep 1000 &
w1=$!
sh -c 'sleep 1000 & echo $! > `+dir+`/w2; wait' &
w0=$!
while [ ! -s `+dir+`/w2 ]; do :; done
echo $$ $w1 $w0 $(cat `+dir+`/w2) > `+fifo+`
wait
`), 0o755)
	t.Setenv("QURO_TEST_LEAK", "x")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- compileTree(ctx, fake, dir, dir, dir, 1, func(string, int64, int64) {}) }()

	f, err := os.Open(fifo) // blocks until the script opens it
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	f.Close()
	if err != nil {
		t.Fatalf("the stand-in did not report its pids: %v", err)
	}
	if strings.Contains(line, "leaked") {
		t.Fatal("the server's environment reached the byte-compile")
	}
	var pidfds []int
	for _, s := range strings.Fields(line) {
		pid, _ := strconv.Atoi(s)
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatalf("pidfd %d: %v", pid, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		pidfds = append(pidfds, fd)
	}
	if len(pidfds) != 4 {
		t.Fatalf("pids %q", line)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("compileTree: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("compileTree did not return after its context was canceled")
	}
	// Each process has ended: its pidfd is readable (no sleep, no polling
	// loop; the bound is only a failure guard).
	for i, fd := range pidfds {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 60_000)
		if err != nil || n != 1 {
			t.Errorf("process %d of the group (%s) survived: %v", i, strings.Fields(line)[i], err)
		}
	}
}
