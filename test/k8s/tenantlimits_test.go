//go:build k8s

package k8s_test

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// testDrainFindsRoom drains a node whose sessions the other nodes refuse
// for room: the tenant's session ceiling, the cluster's (set_tenant_limits
// through one node writes its tenants.quro.dev object, which every node
// applies), set to the fewest of its sessions any other node holds, so
// that every other node is at it or past it. Nothing moves, nothing is
// paused, every session still answers, and the refusals come in
// placement's order. Then one more: each node that held the fewest has
// room for one, and the drain passes the nodes before the first of them
// in placement's order over (it names their refusals) and moves the
// first session there with its file, read through every node; each other
// node with room takes one at most. The sessions are the earlier
// subtests'; the ceilings are the server's defaults again at the end. The
// drained node stays draining until the next subtest's upgrade replaces
// it.
func testDrainFindsRoom(t *testing.T, c *cluster, nodes map[string]node, acme, admin string) {
	held := map[string][]string{} // node -> acme's sessions there
	skipped := map[string]bool{}  // nodes placement does not choose (below)
	read := func() (empty []string) {
		for name := range nodes {
			if !skipped[name] {
				held[name] = nil
			}
		}
		for _, r := range c.records(t) {
			if r.tenant == "acme" && !skipped[r.node] {
				held[r.node] = append(held[r.node], r.id)
			}
		}
		for name, ids := range held {
			if len(ids) == 0 {
				empty = append(empty, name)
			}
		}
		return empty
	}
	// A node the earlier subtests left without acme's sessions (its
	// preStop drain moved them all, and the scale-up's new ones went to
	// the new node) gets one: placement puts a new session on the node
	// with the most headroom in the table of the node that takes the
	// create. The creates go through each node in turn: those tables
	// are each node's view of the Leases and of its own recent
	// placements (the restarted node is placed on at once since those
	// count for one start of a node only: PodRestartKeepsSessions). One
	// that none of twice as many creates as there are nodes reaches is
	// one placement does not choose (being drained, full, or not live):
	// a drain, ranking the nodes as placement does (cluster.Rank), does
	// not ask it either, so it is left out here.
	var via []string
	for name := range nodes {
		via = append(via, name)
	}
	slices.Sort(via)
	for i := 0; ; i++ {
		empty := read()
		if len(empty) == 0 {
			break
		}
		if i == 2*len(nodes) {
			for _, name := range empty {
				t.Logf("%s holds none of acme's sessions after %d creates (%v): placement does not choose it; the drain is checked without it", name, i, held)
				skipped[name] = true
				delete(held, name)
			}
			break
		}
		var out struct {
			ID string `json:"id"`
		}
		nodes[via[i%len(via)]].must(t, "POST", "/v1/sessions", acme, map[string]any{"name": fmt.Sprintf("k8s-room-%d", i)}, &out)
		// Its file, as the earlier subtests' sessions have: a moved
		// session is checked by it.
		nodes[via[(i+1)%len(via)]].must(t, "PUT", "/v1/sessions/"+out.ID+"/files/id.txt", acme, out.ID, nil)
	}
	if len(held) < 3 {
		t.Fatalf("placement chooses only %v: a drain that passes a session on to a third node needs three", held)
	}
	// The node drained: the one with the fewest sessions, two at least
	// (one to move, one to stay); every other holds one, so that a
	// ceiling at what it holds refuses.
	drained := ""
	for name, ids := range held {
		if len(ids) >= 2 && (drained == "" || len(ids) < len(held[drained]) || len(ids) == len(held[drained]) && name < drained) {
			drained = name
		}
	}
	if drained == "" {
		t.Fatalf("no node holds two of acme's sessions: %v", held)
	}
	// The ceiling, the cluster's: set through one node, awaited on each
	// node the drain asks (each applies it as its informer brings it).
	ceiling := func(t *testing.T, sessions int) {
		t.Helper()
		body := map[string]any{"tenant": "acme"}
		if sessions > 0 {
			body["sessions"] = sessions
		}
		nodes[drained].must(t, "POST", "/v1/set_tenant_limits", admin, body, nil) // any node: the drained one serves the operator too
		for name := range held {                                                  // the nodes placement chooses, and the drained one
			n := nodes[name]
			deadline := time.Now().Add(2 * time.Minute)
			for {
				var info struct {
					Own struct {
						Sessions int `json:"sessions"`
					} `json:"own"`
				}
				n.must(t, "POST", "/v1/get_tenant_limits", admin, map[string]any{"tenant": "acme"}, &info)
				if info.Own.Sessions == sessions {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s still has acme's session ceiling at %d, 2 minutes after it was set to %d", name, info.Own.Sessions, sessions)
				}
				time.Sleep(100 * time.Millisecond) // polled: the node's answer is the event
			}
		}
	}
	t.Cleanup(func() { ceiling(t, 0) }) // the server's default again
	least := -1                         // the fewest of acme's sessions another node holds
	for name, ids := range held {
		if name != drained && (least < 0 || len(ids) < least) {
			least = len(ids)
		}
	}
	ceiling(t, least)
	d := nodes[drained]
	t.Logf("draining %s (acme's sessions: %v, its ceiling %d)", drained, held, least)

	// Every other node at or past acme's ceiling: none of acme's sessions
	// moves, none is paused. (Another tenant's, such as the operator's
	// default session, has no ceiling and moves.)
	moves := drainNode(t, d, admin)
	if len(moves) != len(held[drained]) {
		t.Fatalf("a drain of %s's %d sessions of acme: %+v", drained, len(held[drained]), moves)
	}
	var order []string // the other nodes in placement's order, as the refusals come
	for _, m := range moves {
		if m.OK || !m.NoRoom || m.Paused {
			t.Fatalf("a session no node has room for: %+v (want it not moved, for room, never paused)", m)
		}
		var got []string
		for _, f := range refusalRE.FindAllStringSubmatch(m.Error, -1) {
			if f[2] != "429" {
				t.Fatalf("%s's refusals: %q (want each node's 429)", m.Session, m.Error)
			}
			got = append(got, f[1])
		}
		if order == nil {
			order = got
		} else if !slices.Equal(got, order) {
			t.Fatalf("%s was offered to %v, another session to %v: placement's order changed", m.Session, got, order)
		}
	}
	if len(order) != len(held)-1 {
		t.Fatalf("the drain asked %v, want every other node placement chooses (%v)", order, held)
	}
	records := map[string]record{}
	for _, r := range c.records(t) {
		records[r.id] = r
	}
	for _, id := range held[drained] {
		if r := records[id]; r.node != drained || r.phase == "Draining" {
			t.Fatalf("%s after a drain that moved nothing: %+v (want %s's, not draining)", id, r, drained)
		}
	}
	// Still answering: through another node, forwarded to its owner.
	stay := held[drained][len(held[drained])-1]
	if r := nodes[order[0]].run(t, acme, stay, "sh", "cat id.txt"); strings.TrimSpace(r.Stdout) != stay {
		t.Fatalf("%s, left on %s: a run through %s read %q", stay, drained, order[0], r.Stdout)
	}

	// Room for one more session on each node that held the fewest: the
	// first session the drain offers is passed over by the nodes before
	// the first of them in placement's order and lands there.
	room := map[string]bool{} // the nodes with room for one
	to := ""                  // the first of them in placement's order
	for _, name := range order {
		if len(held[name]) == least {
			room[name] = true
			if to == "" {
				to = name
			}
		}
	}
	ceiling(t, least+1)
	moves = drainNode(t, d, admin)
	if len(moves) != len(held[drained]) || len(moves) == 0 || !moves[0].OK {
		t.Fatalf("a drain with room for one on each of %v: %+v (want the first session moved)", room, moves)
	}
	if m := moves[0]; m.To != to || len(m.PassedOver) != slices.Index(order, to) {
		t.Fatalf("%s moved to %s, passed over by %q; want %s after a refusal of each of %v", m.Session, m.To, m.PassedOver, to, order[:slices.Index(order, to)])
	}
	for i, p := range moves[0].PassedOver {
		if !strings.HasPrefix(p, order[i]+" refused it (429)") {
			t.Fatalf("%s was passed over by %q, want %v in placement's order", moves[0].Session, moves[0].PassedOver, order[:slices.Index(order, to)])
		}
	}
	moved, stayed := moves[0].Session, ""
	took := map[string]bool{}
	owners := c.owners(t)
	for _, m := range moves {
		switch {
		case m.OK && (!room[m.To] || took[m.To]):
			t.Fatalf("a drain with room for one on each of %v moved %s to %s: %+v", room, m.Session, m.To, moves)
		case m.OK:
			took[m.To] = true
			if owners[m.Session] != m.To {
				t.Fatalf("%s's record names %q after its move to %s", m.Session, owners[m.Session], m.To)
			}
		case !m.NoRoom || m.Paused:
			t.Fatalf("a session not moved for want of room: %+v (never paused)", m)
		default:
			stayed = m.Session
		}
	}
	if want := min(len(room), len(held[drained])); len(took) != want {
		t.Fatalf("a drain with room for one on each of %v moved %d of %d sessions: %+v", room, len(took), len(held[drained]), moves)
	}
	// Its files came; calls through every node reach it. Until a node's
	// table names the new owner it sends the call to the sender, which
	// answers 503 with Retry-After for a while after the move (and so
	// does the sender itself): never another answer.
	for name, n := range nodes {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			a, err := n.do("GET", "/v1/sessions/"+moved+"/files/id.txt", acme, nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.status == http.StatusOK && bytes.Contains(a.body, []byte(moved)) {
				break
			}
			if a.status != http.StatusServiceUnavailable || a.retryAfter == "" {
				t.Fatalf("%s moved to %s, read through %s: %d %s", moved, to, name, a.status, a.body)
			}
			if name == drained {
				break // the sender's grace outlasts the test's patience (cluster.MovedGrace)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s moved to %s, read through %s: still 503 after 2 minutes: %s", moved, to, name, a.body)
			}
			time.Sleep(100 * time.Millisecond) // polled: the answer is the event
		}
	}
	if r := nodes[order[0]].run(t, acme, moved, "sh", "cat id.txt"); strings.TrimSpace(r.Stdout) != moved {
		t.Fatalf("%s on %s: a run through %s read %q", moved, to, order[0], r.Stdout)
	}
	// One left behind, if any, still answers, through the node that took
	// the first.
	if stayed != "" {
		if r := nodes[to].run(t, acme, stayed, "sh", "cat id.txt"); strings.TrimSpace(r.Stdout) != stayed {
			t.Fatalf("%s, left on %s: a run through %s read %q", stayed, drained, to, r.Stdout)
		}
	}
}
