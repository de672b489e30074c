//go:build k8s

package cluster

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/quro-dev/quro/internal/k8stest"
)

// TestClusterPlacesOnARestartedNode: a node counts its own placements on
// another node until that node's Lease shows them (Router.place's
// assumption, so that a burst of creates spreads), but only for the
// start of the node it placed on. A node that restarts (its preStop
// drain moved its sessions away; its Lease, acquired anew, says it holds
// none) gets the next session at once, not after the assumption's time:
// before, a node that had placed sessions on it passed it over for 30
// seconds, its floor the sessions of the previous start. Against a real
// API server (k8stest; skipped without its binaries): the nodes' Leases
// as the nodes write them, read through node-a's informer.
func TestClusterPlacesOnARestartedNode(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	node := func(ctx context.Context, name string) *Cluster {
		t.Helper()
		c, err := New(Options{Config: cfg, Namespace: "default", Node: name, Address: "127.0.0.1:1", LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		return c
	}
	beat := func(c *Cluster, sessions int) {
		t.Helper()
		if err := c.Heartbeat(ctx, Node{Sessions: sessions}); err != nil {
			t.Fatal(err)
		}
	}
	a, c := node(ctx, "node-a"), node(ctx, "node-c")
	bctx, bstop := context.WithCancel(ctx)
	b := node(bctx, "node-b")
	beat(a, 4)
	beat(b, 3)
	beat(c, 3)
	// node-a's table, waited for through its informer's events.
	see := func(what string, ok func(map[string]Node) bool) {
		t.Helper()
		seen := make(chan struct{}, 1)
		note := func() {
			select {
			case seen <- struct{}{}:
			default:
			}
		}
		reg, err := a.leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { note() },
			UpdateFunc: func(any, any) { note() },
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = a.leases.RemoveEventHandler(reg) }()
		deadline := time.After(2 * time.Minute)
		for {
			nodes := map[string]Node{}
			for _, n := range a.Nodes() {
				nodes[n.Name] = n
			}
			if ok(nodes) {
				return
			}
			select {
			case <-seen:
			case <-deadline:
				t.Fatalf("node-a's table never showed %s: %+v", what, nodes)
			}
		}
	}
	see("the three Leases", func(ns map[string]Node) bool {
		return ns["node-a"].Sessions == 4 && ns["node-b"].Sessions == 3 && ns["node-c"].Sessions == 3
	})
	first := map[string]Node{}
	see("node-b's first start", func(ns map[string]Node) bool { first = ns; return !ns["node-b"].Acquired.IsZero() })

	rt := &Router{Table: a}
	place := func(want string) {
		t.Helper()
		n, err := rt.place("acme", 0)
		if err != nil {
			t.Fatal(err)
		}
		rt.created("acme")
		if n.Name != want {
			t.Fatalf("placed on %s, want %s (node-a's table: %+v; its assumptions: %+v)", n.Name, want, a.Nodes(), rt.assumed)
		}
	}
	// node-b and node-c hold 3, node-a 4: node-b (by name), which node-a
	// then counts as holding 4.
	place("node-b")
	// node-b renews its Lease before it counts the new session: node-a
	// still counts it, and the next goes to node-c.
	beat(b, 3)
	see("node-b's renewal", func(ns map[string]Node) bool { return ns["node-b"].Renewed.After(first["node-b"].Renewed) })
	place("node-c")

	// node-b restarts: its drain moved its sessions away, its new start
	// holds none. Its Lease, acquired anew, is what node-a counts.
	bstop()
	b2 := node(ctx, "node-b")
	beat(b2, 0)
	see("node-b's new start", func(ns map[string]Node) bool {
		return ns["node-b"].Sessions == 0 && !ns["node-b"].Acquired.Equal(first["node-b"].Acquired)
	})
	place("node-b")

	// The Lease says so as any Lease with a new holder does: one
	// transition, which the new start's renewals keep.
	beat(b2, 1)
	l, err := b2.dyn.Resource(LeasesGVR).Namespace("default").Get(ctx, LeasePrefix+"node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, _, _ := unstructured.NestedInt64(l.Object, "spec", "leaseTransitions"); n != 1 || !leaseTime(l, "acquireTime").Equal(b2.acquired.Truncate(time.Microsecond)) {
		t.Fatalf("node-b's Lease after a restart and two renewals: %v (want one transition, acquired at %s)", l.Object["spec"], b2.acquired)
	}
}
