package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// kernelWatches counts the watch descriptors the kernel holds on
// tenant's instance of h (its fdinfo lists one line per descriptor).
func kernelWatches(t *testing.T, h *Hub, tenant string) int {
	t.Helper()
	h.mu.Lock()
	g := h.groups[tenant]
	h.mu.Unlock()
	if g == nil {
		return 0
	}
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(g.in.fd))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "inotify wd:")
}

// first is the first event, which must be about name.
func first(t *testing.T, events chan Event, name string) {
	t.Helper()
	if e := <-events; e.Name != name {
		t.Fatalf("first event %+v, want one about %s", e, name)
	}
}

// watchAll runs a Watch that takes every event and keeps none, until the
// test ends; it returns once the watches are in place.
func watchAll(t *testing.T, w *FS, p string, o WatchOptions) (done chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ready, done := make(chan struct{}), make(chan error, 1)
	o.Ready = func() { close(ready) }
	go func() { done <- w.Watch(ctx, p, o, func(Event) {}) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("watch %q: %v", p, err)
	}
	return done
}

// The watches of a tenant share one inotify instance (another tenant has
// its own), and one kernel watch per directory: two watches of the same
// directory hold it together, and the last to end removes it. An event
// reaches only the watches of its directory, named relative to each:
// never another workspace's.
func TestWatchesShareTheirTenantsInstance(t *testing.T) {
	h := NewHub(HubLimits{})
	w1, ws1, _ := setup(t, Options{})
	w2, ws2, _ := setup(t, Options{})
	w3, ws3, _ := setup(t, Options{})
	if err := os.Mkdir(filepath.Join(ws1, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	evA, doneA, cancelA := watch(t, w1, ".", WatchOptions{Recursive: true, Hub: h, Tenant: "a"})
	evB, doneB, cancelB := watch(t, w1, "d", WatchOptions{Hub: h, Tenant: "a"})
	evC, doneC, cancelC := watch(t, w2, ".", WatchOptions{Hub: h, Tenant: "a"})
	evD, doneD, cancelD := watch(t, w3, ".", WatchOptions{Hub: h, Tenant: "b"})
	if st := h.Stats(); st.Instances != 2 || st.Watches != 4 || st.Dirs != 5 {
		t.Fatalf("stats %+v, want 2 instances, 4 watches, 5 directories", st)
	}
	if n, d := h.Tenant("a"); n != 3 || d != 4 {
		t.Fatalf("tenant a: %d watches, %d directories; want 3, 4", n, d)
	}
	if n := kernelWatches(t, h, "a"); n != 3 { // ws1, ws1/d (shared), ws2
		t.Fatalf("tenant a's instance has %d kernel watches, want 3", n)
	}

	write(t, filepath.Join(ws1, "d/f"), "x")
	next(t, evA, "d/f", EventCreate)
	next(t, evB, "f", EventCreate)
	// The other workspaces' watches saw nothing of it: their first event
	// is their own marker, written after.
	write(t, filepath.Join(ws2, "m"), "m")
	write(t, filepath.Join(ws3, "m"), "m")
	first(t, evC, "m")
	first(t, evD, "m")

	// B ends: A still holds d.
	cancelB()
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	if n := kernelWatches(t, h, "a"); n != 3 {
		t.Fatalf("after one of d's watches ended: %d kernel watches, want 3", n)
	}
	write(t, filepath.Join(ws1, "d/g"), "x")
	next(t, evA, "d/g", EventCreate)
	// A ends: ws1 and d are no one's.
	cancelA()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if n := kernelWatches(t, h, "a"); n != 1 {
		t.Fatalf("after both of d's watches ended: %d kernel watches, want 1", n)
	}
	for _, c := range []struct {
		cancel func()
		done   chan error
	}{{cancelC, doneC}, {cancelD, doneD}} {
		c.cancel()
		if err := <-c.done; err != nil {
			t.Fatal(err)
		}
	}
	if st := h.Stats(); st.Instances != 0 || st.Watches != 0 || st.Dirs != 0 {
		t.Fatalf("after every watch ended: %+v", st)
	}
}

// A tenant at its cap of watches is refused, naming the cap; another
// tenant still watches, up to the server's cap; and whatever the tenants
// hold, another process of the server's user (this test's) still gets an
// inotify instance of its own.
func TestWatchCapsPerTenantAndServer(t *testing.T) {
	h := NewHub(HubLimits{TenantWatches: 2, Watches: 3})
	w, _, _ := setup(t, Options{})
	start := func(tenant string) error {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ready, done := make(chan struct{}), make(chan error, 1)
		go func() {
			done <- w.Watch(ctx, ".", WatchOptions{Hub: h, Tenant: tenant, Ready: func() { close(ready) }}, func(Event) {})
		}()
		select {
		case <-ready:
			return nil
		case err := <-done:
			return err
		}
	}
	for i := range 2 {
		if err := start("a"); err != nil {
			t.Fatalf("tenant a's watch %d: %v", i+1, err)
		}
	}
	err := start("a")
	if !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), `tenant "a" has 2 watches running, the most one tenant may`) {
		t.Fatalf("tenant a's third watch: %v", err)
	}
	if err := start("b"); err != nil {
		t.Fatalf("tenant b: %v", err)
	}
	err = start("c")
	if !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "the server runs 3 watches, the most it may") {
		t.Fatalf("past the server's cap: %v", err)
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("another process of the server's user gets no inotify instance: %v", err)
	}
	syscall.Close(fd)
	st := h.Stats()
	if st.Instances != 2 || st.Watches != 3 || st.Refused[CapTenantWatches] != 1 || st.Refused[CapWatches] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Directories are capped too, per tenant and for the server: a recursive
// watch past a cap is refused, naming it, and what it had taken is
// given back.
func TestWatchedDirsCapped(t *testing.T) {
	h := NewHub(HubLimits{TenantDirs: 4, Dirs: 6})
	w, ws, _ := setup(t, Options{})
	if err := os.MkdirAll(filepath.Join(ws, "a/b/c/d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err := w.Watch(ctx, ".", WatchOptions{Recursive: true, Hub: h, Tenant: "a"}, func(Event) {})
	if !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), `tenant "a" watches 4 directories, the most one tenant may`) {
		t.Fatalf("6 directories for a tenant capped at 4: %v", err)
	}
	if st := h.Stats(); st.Dirs != 0 || st.Watches != 0 || st.Instances != 0 {
		t.Fatalf("the refused watch kept %+v", st)
	}
	watch(t, w, "a/b/c", WatchOptions{Recursive: true, Hub: h, Tenant: "a"})
	watch(t, w, "a/b/c", WatchOptions{Recursive: true, Hub: h, Tenant: "b"})
	err = w.Watch(ctx, ".", WatchOptions{Hub: h, Tenant: "c"}, func(Event) {})
	if !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "the server watches 6 directories, the most it may") {
		t.Fatalf("past the server's cap: %v", err)
	}
	if st := h.Stats(); st.Dirs != 6 || st.Refused[CapTenantDirs] != 1 || st.Refused[CapDirs] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A watch that reads slowly overflows its own queue and ends
// (ErrOverflow); the other watches of its directory, on the same
// instance, miss nothing.
func TestSlowWatchOverflowsAlone(t *testing.T) {
	h := NewHub(HubLimits{Queue: 16})
	w, ws, _ := setup(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, release := make(chan struct{}), make(chan struct{})
	ready, slow := make(chan struct{}), make(chan error, 1)
	go func() {
		once := false
		slow <- w.Watch(ctx, ".", WatchOptions{Hub: h, Tenant: "a", Ready: func() { close(ready) }}, func(Event) {
			if !once {
				once = true
				close(held)
				<-release
			}
		})
	}()
	<-ready
	events, done, _ := watch(t, w, ".", WatchOptions{Hub: h, Tenant: "a"})
	write(t, filepath.Join(ws, "f0"), "")
	<-held
	next(t, events, "f0", EventCreate)
	// In rounds of 10 files (one event each), fewer than a queue holds,
	// each read by the other watch before the next: the slow watch's
	// queue alone fills.
	for i := 1; i < 100; i += 10 {
		for j := i; j < i+10; j++ {
			write(t, filepath.Join(ws, fmt.Sprint("f", j)), "")
		}
		for j := i; j < i+10; j++ {
			next(t, events, fmt.Sprint("f", j), EventCreate)
		}
	}
	close(release)
	if err := <-slow; !errors.Is(err, ErrOverflow) {
		t.Fatalf("the slow watch ended with %v, want ErrOverflow", err)
	}
	write(t, filepath.Join(ws, "after"), "")
	next(t, events, "after", EventCreate)
	select {
	case err := <-done:
		t.Fatalf("the other watch ended: %v", err)
	default:
	}
	if st := h.Stats(); st.Overflows["watch"] != 1 || st.Watches != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// When the kernel's queue of an instance overflows, every watch of that
// instance is told (ErrOverflow: which of them lost events is not known),
// not left to miss them silently; another tenant's instance carries on.
// The instance's reader is held (by the Hub's lock) while more events
// than its queue holds are made.
func TestKernelOverflowReachesItsInstancesWatches(t *testing.T) {
	h := NewHub(HubLimits{Queue: 1 << 20})
	w1, ws1, _ := setup(t, Options{})
	w2, _, _ := setup(t, Options{})
	w3, ws3, _ := setup(t, Options{})
	done1 := watchAll(t, w1, ".", WatchOptions{Hub: h, Tenant: "a"})
	done2 := watchAll(t, w2, ".", WatchOptions{Hub: h, Tenant: "a"})
	events3, done3, _ := watch(t, w3, ".", WatchOptions{Hub: h, Tenant: "b"})
	queued := 16384
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events"); err == nil {
		queued, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	a, b := filepath.Join(ws1, "a"), filepath.Join(ws1, "b")
	write(t, a, "")
	write(t, b, "")
	h.mu.Lock()
	// Each chmod differs from the one before (another file), so the
	// kernel merges none; the reader may hold up to a buffer's worth.
	for i := range queued + 256<<10/syscall.SizeofInotifyEvent + 100 {
		mode := os.FileMode(0o600 | i/2%2*0o44)
		if err := os.Chmod(a, mode); err != nil {
			h.mu.Unlock()
			t.Fatal(err)
		}
		if err := os.Chmod(b, mode); err != nil {
			h.mu.Unlock()
			t.Fatal(err)
		}
	}
	h.mu.Unlock()
	for i, done := range []chan error{done1, done2} {
		if err := <-done; !errors.Is(err, ErrOverflow) {
			t.Fatalf("watch %d of the overflowed instance ended with %v, want ErrOverflow", i+1, err)
		}
	}
	write(t, filepath.Join(ws3, "m"), "")
	next(t, events3, "m", EventCreate)
	select {
	case err := <-done3:
		t.Fatalf("another tenant's watch ended: %v", err)
	default:
	}
	if st := h.Stats(); st.Overflows["kernel"] != 2 {
		t.Fatalf("stats %+v", st)
	}
}
