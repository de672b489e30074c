//go:build k8s

package cluster

// Resolve against a real API server (k8stest: the binaries make test-k8s
// builds; skipped when absent) with node a's session informer held back
// by a gate: what a node sees while its watch is down. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestCluster ./internal/cluster/

import (
	"context"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/quro-dev/quro/internal/k8stest"
)

// gate holds the events of the watches it wraps while it is held.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed: events pass
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.open)
}

// pass waits until the gate is open (false: the watch stopped first).
func (g *gate) pass(stop <-chan struct{}) bool {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-stop:
		return false
	}
}

type heldWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func (h *heldWatch) Stop() {
	h.once.Do(func() { close(h.stop); h.inner.Stop() })
}
func (h *heldWatch) ResultChan() <-chan watch.Event { return h.out }

func (g *gate) wrap(w watch.Interface) watch.Interface {
	h := &heldWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(h.out)
		for ev := range w.ResultChan() {
			if !g.pass(h.stop) {
				return
			}
			select {
			case h.out <- ev:
			case <-h.stop:
				return
			}
		}
	}()
	return h
}

// TestClusterResolveWhileTheInformerLags: node b records a session (as
// its create does before it answers); node a's informer has not seen it
// yet. An authenticated caller of node a still reaches it, by its name
// (read from the API server by the label of its tenant and name) and by
// its ID once the bound of reads is spent (Resolve waits for the
// informer); another tenant's caller does not find it by name; a call no
// one authenticated past the bound reads nothing and finds nothing. Each
// of the three "found" steps failed on the former code (ByName read the
// informer only; Lookup gave up when the bound was spent).
func TestClusterResolveWhileTheInformerLags(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g := newGate()
	waiting := make(chan struct{}, 1)
	// Two reads of the API server, never refilled: the bound spent on
	// cue, not by the clock.
	a, err := New(Options{Config: cfg, Namespace: "default", Node: "node-a", Address: "127.0.0.1:1",
		watchHook: g.wrap, lookRate: rate.NewLimiter(0, 2), lookupWait: 10 * time.Minute, // past the test's own time: never the answer
		onWait: func() {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Config: cfg, Namespace: "default", Node: "node-b", Address: "127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Cluster{a, b} {
		if err := c.Start(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	g.hold()
	const id = "s-lag"
	rec := &Session{ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec:   SessionSpec{Node: "node-b", Tenant: "acme", Name: "work", Created: time.Now().UTC().Format(time.RFC3339)},
		Status: SessionStatus{Node: "node-b", Phase: PhaseReady}}
	if err := b.Record(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Cached(id); ok {
		t.Fatal("node a's informer has the record: the gate did not hold it back")
	}

	// Another tenant's caller names acme's session by its name: not
	// found (read 1 of 2).
	if s, ok := a.Resolve(ctx, "other", "work"); ok {
		t.Fatalf("tenant other resolved acme's name to %s", s.Name)
	}
	// acme's caller, by name: read from the API server (read 2 of 2).
	s, ok := a.Resolve(ctx, "acme", "work")
	if !ok || s.Name != id || s.Spec.Node != "node-b" {
		t.Fatalf("acme's session by name through a lagging node: %v %+v", ok, s)
	}
	// The bound is spent: a call no one authenticated finds nothing (no
	// read), as before.
	if _, ok := a.Lookup(ctx, id); ok {
		t.Fatal("Lookup read the API server past its bound")
	}
	// acme's caller, by ID, past the bound: waits for the informer.
	type found struct {
		s  *Session
		ok bool
	}
	got := make(chan found, 1)
	go func() {
		s, ok := a.Resolve(ctx, "acme", id)
		got <- found{s, ok}
	}()
	select {
	case <-waiting:
	case r := <-got:
		t.Fatalf("Resolve answered %v %+v before the informer had the record, with no read left", r.ok, r.s)
	}
	g.release()
	r := <-got
	if !r.ok || r.s.Name != id || r.s.Spec.Node != "node-b" {
		t.Fatalf("acme's session by ID once the informer caught up: %v %+v", r.ok, r.s)
	}
	if _, ok := a.Cached(id); !ok {
		t.Fatal("Resolve answered before node a's table held the record")
	}
}
