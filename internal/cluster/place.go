package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrNoNode means no live node has room for another session.
var ErrNoNode = errors.New("no live Quro node has room for another session")

// TenantLimitError means the tenant holds its cluster-wide share already.
type TenantLimitError struct {
	Tenant     string
	Has, Limit int
}

func (e *TenantLimitError) Error() string {
	return fmt.Sprintf("tenant %q has %d sessions across the cluster, its limit is %d: destroy one first", e.Tenant, e.Has, e.Limit)
}

// DefaultSessionReserve is the memory a node reserves for each session it
// holds when placing new ones (as a Kubernetes request reserves it for a
// pod): a session with a working Python and a shell. What a session
// really uses varies with its work; the reservation is what placement
// counts, so that like nodes are compared by what they hold and not by
// the noise of their live memory.
const DefaultSessionReserve = 64 << 20

// MemFloor is the share of a node's memory below which its live
// MemAvailable makes it take no new session, however few sessions it
// holds: the guard against a node whose sessions use more than their
// reservation.
const MemFloor = 0.05

// Headroom is how much room n has for new sessions, from 0 (full) to 1
// (empty): the smaller of its free share of sessions (when capped) and of
// its memory less a reservation per session (when both are known). A node
// with neither known counts its sessions against 1,000, so that fewer
// sessions still means more room. Live memory does not enter it (see
// Place's guard): it moves with every box's work and page cache.
func Headroom(n *Node) float64 {
	h := 1.0
	known := false
	if n.MaxSessions > 0 {
		known = true
		h = min(h, float64(n.MaxSessions-n.Sessions)/float64(n.MaxSessions))
	}
	if n.MemTotal > 0 && n.SessionReserve > 0 {
		known = true
		h = min(h, float64(n.MemTotal-int64(n.Sessions)*n.SessionReserve)/float64(n.MemTotal))
	}
	if !known {
		h = 1 - float64(n.Sessions)/1000
	}
	return max(h, 0)
}

// Full reports whether n takes no new session: being drained, at its
// cap, its memory all reserved, or its live MemAvailable (when known)
// under MemFloor of its memory.
func Full(n *Node) bool {
	switch {
	case n.Draining:
		return true
	case n.MaxSessions > 0 && n.Sessions >= n.MaxSessions:
		return true
	case n.MemTotal > 0 && n.SessionReserve > 0 && int64(n.Sessions+1)*n.SessionReserve > n.MemTotal:
		return true
	case n.MemTotal > 0 && n.MemAvail > 0 && float64(n.MemAvail) < MemFloor*float64(n.MemTotal):
		return true
	}
	return false
}

// Place picks the node for a new session of tenant: the live node with
// the most headroom (ties: fewer sessions, then name), none that is Full
// (Rank's first). tenantHas is how many sessions the tenant owns on
// every node together, tenantLimit its cluster-wide cap (<= 0: none).
func Place(nodes []Node, now time.Time, tenant string, tenantHas, tenantLimit int) (*Node, error) {
	if tenantLimit > 0 && tenantHas >= tenantLimit {
		return nil, &TenantLimitError{Tenant: tenant, Has: tenantHas, Limit: tenantLimit}
	}
	var best *Node
	bestH := 0.0
	for i := range nodes {
		n := &nodes[i]
		if !n.Live(now) || Full(n) {
			continue
		}
		if h := Headroom(n); best == nil || before(n, h, best, bestH) {
			best, bestH = n, h
		}
	}
	if best == nil {
		return nil, ErrNoNode
	}
	return best, nil
}

// Rank lists the live nodes that are not Full in placement's order: the
// most headroom first (ties: fewer sessions, then name). A drain offers
// a session to each in turn until one admits it.
func Rank(nodes []Node, now time.Time) []*Node {
	type ranked struct {
		n *Node
		h float64
	}
	var rs []ranked
	for i := range nodes {
		if n := &nodes[i]; n.Live(now) && !Full(n) {
			rs = append(rs, ranked{n, Headroom(n)})
		}
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		switch {
		case before(a.n, a.h, b.n, b.h):
			return -1
		case before(b.n, b.h, a.n, a.h):
			return 1
		}
		return 0
	})
	out := make([]*Node, len(rs))
	for i, r := range rs {
		out[i] = r.n
	}
	return out
}

// before reports whether node a, of headroom ha, comes before b, of hb,
// in placement's order.
func before(a *Node, ha float64, b *Node, hb float64) bool {
	if ha != hb {
		return ha > hb
	}
	if a.Sessions != b.Sessions {
		return a.Sessions < b.Sessions
	}
	return a.Name < b.Name
}
