//go:build k8s

package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/k8stest"
)

// BenchmarkClusterSyncAfterCreate: what a create's answer waits for after
// the box started, against a real API server: a node's sync once one new
// session is in its list. "records" is SyncRecords (what Router.Changed
// runs: the record created, its status written), "with-lease" is Sync
// (the same, then the Lease read and renewed: what Changed ran before),
// "after-use" is SyncRecords once ten other sessions were used since the
// last Sync (their records' status says alive=false, this node knows
// them alive: the status is Run's to write, not the create's), and
// "full-node" is SyncRecords on a node that holds 1,000 sessions whose
// records the informer has (the diff a create waits for reads each of
// them in the node's table).
// Medians, in ms. Run (bench/README.md):
//
//	go test -tags k8s -trimpath -run '^$' -bench ClusterSyncAfterCreate -benchtime 30x ./internal/cluster/
func BenchmarkClusterSyncAfterCreate(b *testing.B) {
	cfg, _ := k8stest.APIServer(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	c, err := New(Options{Config: cfg, Namespace: "default", Node: "node-a", Address: "127.0.0.1:1"})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx, 2*time.Minute); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	local := []LocalSession{{ID: "bench-0", Tenant: "acme", Name: "s0", Created: time.Now()}}
	m := &Member{C: c, List: func(context.Context) ([]LocalSession, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(local), nil
	}}
	// The Lease, and a first record: the API server holds the creates of
	// a CRD established less than 2 s ago for 2 s.
	if err := m.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, mode := range []string{"records", "with-lease", "after-use", "full-node"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "full-node" {
				fillNode(b, m, c, &mu, &local, &n, 1000)
			}
			var took []time.Duration
			for b.Loop() {
				if mode == "after-use" {
					var used []string
					mu.Lock()
					for range 10 {
						n++
						id := fmt.Sprintf("bench-%d", n)
						local = append(local, LocalSession{ID: id, Tenant: "acme", Name: fmt.Sprintf("s%d", n), Created: time.Now()})
						used = append(used, id)
					}
					mu.Unlock()
					if err := m.Sync(ctx); err != nil {
						b.Fatal(err)
					}
					// Sessions the informer holds, status and all, as a
					// node's older sessions are: woken by its events.
					for _, id := range used {
						for {
							changed := c.changes()
							if s, ok := c.cached(id); ok && s.Status.Node == "node-a" {
								break
							}
							<-changed
						}
						m.Used(id)
					}
				}
				n++
				mu.Lock()
				local = append(local, LocalSession{ID: fmt.Sprintf("bench-%d", n), Tenant: "acme", Name: fmt.Sprintf("s%d", n), Created: time.Now()})
				mu.Unlock()
				start := time.Now()
				sync := m.SyncRecords
				if mode == "with-lease" {
					sync = m.Sync
				}
				if err := sync(ctx); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			med := took[len(took)/2]
			b.ReportMetric(float64(med.Microseconds())/1000, "median-ms")
			b.Logf("%s: median %s of %d (min %s, max %s)", mode, med, len(took), took[0], took[len(took)-1])
		})
	}
}

// fillNode adds sessions to the node's list until it holds want, writes
// their records and waits until the informer holds each.
func fillNode(b *testing.B, m *Member, c *Cluster, mu *sync.Mutex, local *[]LocalSession, n *int, want int) {
	b.Helper()
	mu.Lock()
	for len(*local) < want {
		*n++
		*local = append(*local, LocalSession{ID: fmt.Sprintf("bench-%d", *n), Tenant: "acme", Name: fmt.Sprintf("s%d", *n), Created: time.Now()})
	}
	ids := make([]string, 0, len(*local))
	for _, ls := range *local {
		ids = append(ids, ls.ID)
	}
	mu.Unlock()
	if err := m.SyncRecords(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, id := range ids {
		for {
			changed := c.changes()
			if _, ok := c.cached(id); ok {
				break
			}
			<-changed
		}
	}
}
