package rootfs

import (
	"context"
	"errors"
	"log/slog"
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
