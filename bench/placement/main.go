// Command placement simulates the cluster's placement (cluster.Place) of
// 100 nodes × 1,000 sessions each with churn, without a cluster: how even
// the nodes stay, and what the session → node table (what each node's
// informer holds) costs in memory and per lookup.
//
//	go run ./bench/placement [-nodes 100] [-per-node 1000] [-churn 200000]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/quro-dev/quro/internal/cluster"
)

func main() {
	nodes := flag.Int("nodes", 100, "nodes")
	perNode := flag.Int("per-node", 1000, "sessions per node at the start (the steady population)")
	churn := flag.Int("churn", 200000, "destroy+create pairs after the fill")
	tenants := flag.Int("tenants", 500, "tenants the sessions belong to")
	seed := flag.Uint64("seed", 1, "random seed")
	reserve := flag.Int64("reserve", 12<<20, "bytes each node reserves per session (quro serve --node-session-memory; 12 MiB here so that 2,000 sessions fit the smallest node)")
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, 2))
	now := time.Now()
	ns := make([]cluster.Node, *nodes)
	for i := range ns {
		// Machines of three sizes: the memory left after each session's
		// reservation decides part of the headroom.
		mem := int64(16+16*(i%3)) << 30
		ns[i] = cluster.Node{Name: fmt.Sprintf("quro-%d", i), Address: "x", MaxSessions: 2 * *perNode,
			MemTotal: mem, MemAvail: mem, SessionReserve: *reserve, Renewed: now, TTL: time.Minute}
	}
	const perSession = 12 << 20 // what a box uses live (a session with its Python worker): MemAvailable, the floor's guard
	index := map[string]int{}
	table := map[string]string{} // session ID → node: the routing table
	tenantCount := map[int]int{}
	ids := make([]string, 0, *nodes**perNode)
	owner := map[string]int{}
	tenantOf := map[string]int{}
	seq := 0
	for i := range ns {
		index[ns[i].Name] = i
	}
	create := func() time.Duration {
		tenant := rng.IntN(*tenants)
		t0 := time.Now()
		n, err := cluster.Place(ns, now, fmt.Sprint(tenant), tenantCount[tenant], 0)
		d := time.Since(t0)
		if err != nil {
			panic(err)
		}
		i := index[n.Name]
		seq++
		id := fmt.Sprintf("%032x", seq)
		ns[i].Sessions++
		ns[i].MemAvail -= perSession
		table[id] = n.Name
		owner[id], tenantOf[id] = i, tenant
		tenantCount[tenant]++
		ids = append(ids, id)
		return d
	}
	destroy := func() {
		k := rng.IntN(len(ids))
		id := ids[k]
		ids[k] = ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		i := owner[id]
		ns[i].Sessions--
		ns[i].MemAvail += perSession
		tenantCount[tenantOf[id]]--
		delete(table, id)
		delete(owner, id)
		delete(tenantOf, id)
	}
	var placeTotal time.Duration
	total := *nodes * *perNode
	for range total {
		placeTotal += create()
	}
	report("after the fill", ns, placeTotal, total)
	placeTotal = 0
	for range *churn {
		destroy()
		placeTotal += create()
	}
	report(fmt.Sprintf("after %d destroy+create pairs", *churn), ns, placeTotal, *churn)

	// The routing table: what one node's informer keeps, measured as a
	// map of the same size holding the records' fields.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	recs := make(map[string]*cluster.Session, len(table))
	for id, node := range table {
		s := &cluster.Session{Spec: cluster.SessionSpec{Node: node, Tenant: "tenant-00000", Name: "session-" + id[24:],
			Network: "none", Created: now.Format(time.RFC3339)}}
		s.Name = id
		recs[id] = s
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	keys := make([]string, 0, len(recs))
	for id := range recs {
		keys = append(keys, id)
	}
	const lookups = 1_000_000
	t0 := time.Now()
	hit := 0
	for i := range lookups {
		if recs[keys[i%len(keys)]] != nil {
			hit++
		}
	}
	el := time.Since(t0)
	fmt.Printf("routing table: %d records, about %.1f MiB held (%d B per record, typed records; the informer's unstructured objects weigh more), lookup %.0f ns (%d lookups)\n",
		len(recs), float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), int(after.HeapAlloc-before.HeapAlloc)/max(len(recs), 1),
		float64(el.Nanoseconds())/lookups, hit)
}

// report prints how even the nodes are and what a placement cost.
func report(what string, ns []cluster.Node, place time.Duration, n int) {
	lo, hi, sum := math.MaxInt, 0, 0
	for _, x := range ns {
		lo, hi, sum = min(lo, x.Sessions), max(hi, x.Sessions), sum+x.Sessions
	}
	mean := float64(sum) / float64(len(ns))
	var sq float64
	hLo, hHi := 2.0, -1.0
	for i := range ns {
		d := float64(ns[i].Sessions) - mean
		sq += d * d
		h := cluster.Headroom(&ns[i])
		hLo, hHi = min(hLo, h), max(hHi, h)
	}
	fmt.Printf("%s: %d nodes, %d sessions: per node min %d max %d mean %.1f stddev %.1f; headroom min %.3f max %.3f; Place %.1f µs per session (%d nodes scanned)\n",
		what, len(ns), sum, lo, hi, mean, math.Sqrt(sq/float64(len(ns))), hLo, hHi, float64(place.Microseconds())/float64(n), len(ns))
}
