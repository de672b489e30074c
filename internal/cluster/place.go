package cluster

import (
	"errors"
	"fmt"
	"math"
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

// Headroom is how much room n has for new sessions, from 0 (full) to 1
// (empty): the smaller of its free share of sessions (when capped) and of
// memory (when known). A node with neither known counts its sessions
// against 1,000, so that fewer sessions still means more room.
func Headroom(n *Node) float64 {
	h := 1.0
	known := false
	if n.MaxSessions > 0 {
		known = true
		h = min(h, float64(n.MaxSessions-n.Sessions)/float64(n.MaxSessions))
	}
	if n.MemTotal > 0 {
		known = true
		h = min(h, float64(n.MemAvail)/float64(n.MemTotal))
	}
	if !known {
		h = 1 - float64(n.Sessions)/1000
	}
	return max(h, 0)
}

// Place picks the node for a new session of tenant: the live node with
// the most headroom (ties: fewer sessions, then name), none that is full.
// tenantHas is how many sessions the tenant owns on every node together,
// tenantLimit its cluster-wide cap (<= 0: none).
func Place(nodes []Node, now time.Time, tenant string, tenantHas, tenantLimit int) (*Node, error) {
	if tenantLimit > 0 && tenantHas >= tenantLimit {
		return nil, &TenantLimitError{Tenant: tenant, Has: tenantHas, Limit: tenantLimit}
	}
	var best *Node
	bestH := 0.0
	for i := range nodes {
		n := &nodes[i]
		if !n.Live(now) || (n.MaxSessions > 0 && n.Sessions >= n.MaxSessions) {
			continue
		}
		// Headroom in steps of 1%: nodes on like machines differ in
		// memory by noise, and then the one with fewer sessions wins.
		h := math.Floor(Headroom(n) * 100)
		if best == nil || h > bestH || (h == bestH && (n.Sessions < best.Sessions ||
			(n.Sessions == best.Sessions && n.Name < best.Name))) {
			best, bestH = n, h
		}
	}
	if best == nil {
		return nil, ErrNoNode
	}
	return best, nil
}
