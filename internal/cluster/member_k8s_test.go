//go:build k8s

package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/k8stest"
)

// TestClusterNewRecordsStatusFollowsTheAnswer: what a create waits for
// (SyncRecords) is the new session's record naming its node, in the API
// server when it returns (so another node resolves it at once); its
// status, a write of its own that nothing routes by, follows from Run
// between its Syncs, without another create or Sync. Against a
// real API server (k8stest; skipped without its binaries).
func TestClusterNewRecordsStatusFollowsTheAnswer(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := New(Options{Config: cfg, Namespace: "default", Node: "node-a", Address: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var local []LocalSession
	m := &Member{C: c, List: func(context.Context) ([]LocalSession, error) {
		mu.Lock()
		defer mu.Unlock()
		return append([]LocalSession(nil), local...), nil
	}}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Run's part between its Syncs, with no Sync to come: the status can
	// only come from it.
	go m.wait(ctx, nil)

	changed := c.changes()
	mu.Lock()
	local = append(local, LocalSession{ID: "s-new", Tenant: "acme", Name: "work", Created: time.Now()})
	mu.Unlock()
	if err := m.SyncRecords(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.Get(ctx, "s-new")
	if err != nil || s == nil || s.Spec.Node != "node-a" || s.Spec.Tenant != "acme" || s.Spec.Name != "work" {
		t.Fatalf("the record when SyncRecords returned: %+v, %v", s, err)
	}
	// The status follows: waited for through the informer's events.
	deadline := time.After(2 * time.Minute)
	for {
		if s, ok := c.Cached("s-new"); ok && s.Status.Phase == PhaseReady && s.Status.Node == "node-a" {
			break
		}
		select {
		case <-changed:
			changed = c.changes()
		case <-deadline:
			s, _ := c.Get(ctx, "s-new")
			t.Fatalf("the new record's status was not written after SyncRecords: %+v", s)
		}
	}
}
