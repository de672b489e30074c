//go:build k8s

package main

// A drain into a node at its session ceiling, on two nodes against a real
// API server (the harness of cluster_k8s_test.go): nothing moves, every
// session stays with its files on the drained node, and a move the full
// node is sent anyway (a sender whose table lags, or that ignores it) is
// refused at its ceiling, and so is the drain's admission probe. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterDrainIntoAFullNode ./cmd/quro/

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/cluster"
)

func TestClusterDrainIntoAFullNode(t *testing.T) {
	acme, admin := quroToken(), quroToken()
	a, b, dyn, owner := twoNodes(t, acme+" acme exec\n"+admin+" - admin\n", "--max-sessions", "3")
	auth := []string{"Authorization", "Bearer " + acme}
	exec := func(t *testing.T, via *node, id, cmd string) string {
		t.Helper()
		return sessionExec(t, via, acme, id, cmd)
	}
	// Sessions through node a until no node has room: both at their
	// ceiling.
	on := map[string][]string{}
	for i := 0; ; i++ {
		if i == 10 {
			t.Fatalf("10 sessions made on nodes with a ceiling of 3: %v", on)
		}
		r := do(t, "POST", a.url+"/v1/sessions", "application/json", fmt.Sprintf(`{"name":"f%d"}`, i), auth...)
		if r.status != http.StatusCreated {
			if len(on["node-a"]) == 0 || len(on["node-b"]) == 0 {
				t.Fatalf("create %d refused before both nodes held a session: %d %s (%v)", i, r.status, r.body, on)
			}
			break
		}
		var out struct{ ID string }
		if err := json.Unmarshal([]byte(r.body), &out); err != nil || out.ID == "" {
			t.Fatalf("create: %s", r.body)
		}
		on[owner(out.ID)] = append(on[owner(out.ID)], out.ID)
	}
	for _, id := range on["node-a"] {
		exec(t, a, id, "echo stays > f.txt")
	}

	t.Run("a drain into a full node moves nothing and loses nothing", func(t *testing.T) {
		out, errOut, err := nodeDrain(t, a, admin)
		// Every session of node a's stays (its tenants' default ones too).
		if err == nil || !strings.Contains(err.Error(), "sessions stay") || !strings.Contains(out.String(), "\n0 sessions moved, ") {
			t.Fatalf("quro node drain into a full node: %v\n%s%s", err, out.String(), errOut.String())
		}
		t.Logf("quro node drain:\n%s", out.String())
		for _, id := range on["node-a"] {
			if !strings.Contains(out.String(), "NOT moved "+id) {
				t.Errorf("the drain did not report %s not moved", id)
			}
			if o := owner(id); o != "node-a" {
				t.Errorf("session %s: owner %s after a drain with no room", id, o)
			}
			if got := exec(t, b, id, "cat f.txt"); !strings.Contains(got, "stays") {
				t.Errorf("session %s after the drain: %q", id, got)
			}
		}
	})

	t.Run("the full node refuses a move at its ceiling, and takes it with room", func(t *testing.T) {
		// A sender that sends regardless: node x owns a session by its
		// record and moves it to node b, which is full.
		bPort, x := nodePort(t, dyn, "node-b", "node-x")
		key := forwardKey(t, dyn)
		id, name := fmt.Sprintf("%032x", time.Now().UnixNano()), "moved"
		ownedRecord(t, dyn, id, "node-x", name)
		move := func(t *testing.T) httpResult {
			t.Helper()
			var buf bytes.Buffer
			fmt.Fprintf(&buf, `{"id":%q,"name":%q,"tenant":"acme","network":"none"}`+"\n", id, name)
			tw := tar.NewWriter(&buf)
			tw.WriteHeader(&tar.Header{Name: "kept.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg})
			tw.Write([]byte("kept\n"))
			tw.Close()
			return putMove(t, x, bPort, id, cluster.MoveSignature(key, "node-x", "node-b", id, time.Now()), &buf)
		}
		// A drain's admission probe, asked before a session is paused,
		// is told the same over the real node port.
		probe := func(t *testing.T) httpResult {
			t.Helper()
			return moveRoute(t, x, "POST", bPort, id, cluster.MoveSignature(key, "node-x", "node-b", id, time.Now()),
				strings.NewReader(`{"bytes":5}`))
		}
		if r := probe(t); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "session ceiling of 3") {
			t.Fatalf("a probe of node b at its ceiling: %d %s", r.status, r.body)
		}
		if r := move(t); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "session ceiling of 3") {
			t.Fatalf("a move into node b at its ceiling: %d %s", r.status, r.body)
		}
		if o := owner(id); o != "node-x" {
			t.Fatalf("the refused move's record names %s", o)
		}
		// Room made on node b: the same move (signed anew) is taken.
		if r := do(t, "DELETE", a.url+"/v1/sessions/"+on["node-b"][0], "", "", auth...); r.status/100 != 2 {
			t.Fatalf("destroy %s: %d %s", on["node-b"][0], r.status, r.body)
		}
		if r := probe(t); r.status != http.StatusNoContent {
			t.Fatalf("a probe of node b with room: %d %s", r.status, r.body)
		}
		if r := move(t); r.status != http.StatusOK {
			t.Fatalf("a move into node b with room: %d %s", r.status, r.body)
		}
		if o := owner(id); o != "node-b" {
			t.Fatalf("the move's record names %s", o)
		}
		if got := exec(t, a, id, "cat kept.txt"); !strings.Contains(got, "kept") {
			t.Fatalf("the moved session through node a: %q", got)
		}
	})
}
