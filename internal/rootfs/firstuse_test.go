package rootfs

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A call whose deadline comes first is told the install is pending (with
// its last step) and the install goes on; later calls join it rather than
// start another; a failure reaches the call waiting for it, and the next
// call tries again.
func TestOnFirstUseJoinsAndRetries(t *testing.T) {
	m := New(filepath.Join(t.TempDir(), "rootfs"))
	var calls atomic.Int32
	stepped, release := make(chan struct{}), make(chan error)
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		calls.Add(1)
		progress("I: step 1")
		stepped <- struct{}{}
		if err := <-release; err != nil {
			return err
		}
		fakeUserland(t, target)
		return nil
	}
	f := &OnFirstUse{M: m, Log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	var pending *PendingError
	if err := f.Wait(ctx, "default", time.Now()); !errors.As(err, &pending) || pending.Name != "default" {
		t.Fatalf("deadline passed: %v", err)
	}
	<-stepped
	if err := f.Wait(ctx, "default", time.Now()); !errors.As(err, &pending) || pending.Last != "I: step 1" {
		t.Fatalf("joined, deadline passed: %v %+v", err, pending)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Wait(canceled, "default", time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	// The one install fails: the call waiting for it hears why.
	waited := make(chan error)
	go func() { waited <- f.Wait(ctx, "default", time.Now().Add(time.Hour)) }()
	release <- errors.New("mirror unreachable")
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "mirror unreachable") || m.Ready("default") {
		t.Fatalf("failed install: %v (ready %v)", err, m.Ready("default"))
	}
	// The next call tries again, and this time it works.
	go func() { waited <- f.Wait(ctx, "default", time.Now().Add(time.Hour)) }()
	<-stepped
	release <- nil
	if err := <-waited; err != nil || !m.Ready("default") {
		t.Fatalf("second install: %v (ready %v)", err, m.Ready("default"))
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("installer ran %d times, want 2", n)
	}
	// Ready: nothing is started.
	if err := f.Wait(ctx, "default", time.Now()); err != nil || calls.Load() != 2 {
		t.Errorf("ready rootfs: %v, %d installs", err, calls.Load())
	}
}

// What a call waiting for an install on first use reads names no host
// path: not debootstrap's command line (the last step while it runs), nor
// the lines of a real debootstrap that failed on a directory of the data
// directory's; the server log has the whole text.
func TestOnFirstUseNamesNoHostPath(t *testing.T) {
	if _, err := exec.LookPath("debootstrap"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs debootstrap and root")
	}
	m := New(filepath.Join(t.TempDir(), "rootfs"))
	stepped, goOn := make(chan struct{}), make(chan struct{})
	m.Installer = func(ctx context.Context, target, cache string, o InstallOptions, progress func(string)) error {
		// A cache directory that is not there: debootstrap fails at once,
		// naming it, before it reaches for the (unreachable) mirror.
		o.Mirror = "http://127.0.0.1:9/debian"
		first := true
		return Debootstrap(ctx, target, filepath.Join(cache, "missing"), o, func(line string) {
			progress(line)
			if first {
				first = false
				stepped <- struct{}{}
				<-goOn
			}
		})
	}
	var logged bytes.Buffer
	f := &OnFirstUse{M: m, Log: slog.New(slog.NewTextHandler(&logged, nil))}
	ctx := context.Background()
	waited := make(chan error)
	go func() { waited <- f.Wait(ctx, "default", time.Now().Add(time.Hour)) }()
	<-stepped
	var pending *PendingError
	if err := f.Wait(ctx, "default", time.Now()); !errors.As(err, &pending) || !strings.HasPrefix(pending.Last, "debootstrap --variant=minbase") {
		t.Fatalf("while debootstrap runs: %v", err)
	}
	if strings.Contains(pending.Last, m.Dir) {
		t.Errorf("the last step names the data directory: %q", pending.Last)
	}
	close(goOn)
	err := <-waited
	if !errors.Is(err, ErrInstallFailed) || !strings.Contains(err.Error(), "missing: No such directory") {
		t.Fatalf("the failed install: %v", err)
	}
	if strings.Contains(err.Error(), m.Dir) {
		t.Errorf("the failure names the data directory: %q", err)
	}
	if !strings.Contains(logged.String(), filepath.Join(m.Dir, ".cache")) {
		t.Errorf("the server log does not have the whole text: %q", logged.String())
	}
}
