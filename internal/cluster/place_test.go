package cluster

import (
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlace(t *testing.T) {
	t.Parallel()
	now := time.Now()
	live := func(name string, sessions, maxS int) Node {
		return Node{Name: name, Address: name + ":7070", Sessions: sessions, MaxSessions: maxS, Renewed: now, TTL: time.Minute}
	}
	t.Run("most headroom", func(t *testing.T) {
		n, err := Place([]Node{live("a", 5, 10), live("b", 2, 10), live("c", 3, 10)}, now, "", 0, 0)
		if err != nil || n.Name != "b" {
			t.Fatalf("placed on %+v, %v; want b", n, err)
		}
	})
	t.Run("memory counts by reservation, not by live noise", func(t *testing.T) {
		// Like machines, like sessions: the session count decides,
		// however their live MemAvailable differs.
		a, b := live("a", 3, 0), live("b", 2, 0)
		a.MemTotal, a.MemAvail, a.SessionReserve = 8<<30, 7<<30, 64<<20
		b.MemTotal, b.MemAvail, b.SessionReserve = 8<<30, 5<<30, 64<<20
		if n, err := Place([]Node{a, b}, now, "", 0, 0); err != nil || n.Name != "b" {
			t.Fatalf("placed on %+v, %v; want b (fewer sessions reserved)", n, err)
		}
		// A bigger machine holds more: 4 sessions of 32 GiB leave more
		// room than 2 of 8 GiB at 1 GiB each.
		a.MemTotal, a.Sessions, a.SessionReserve = 32<<30, 4, 1<<30
		b.SessionReserve = 1 << 30
		if n, err := Place([]Node{a, b}, now, "", 0, 0); err != nil || n.Name != "a" {
			t.Fatalf("placed on %+v, %v; want a (more memory unreserved)", n, err)
		}
	})
	t.Run("live memory under the floor takes nothing", func(t *testing.T) {
		a, b := live("a", 0, 10), live("b", 5, 10)
		a.MemTotal, a.MemAvail, a.SessionReserve = 100<<20, 4<<20, 1<<20 // 4% available: under MemFloor
		b.MemTotal, b.MemAvail, b.SessionReserve = 100<<20, 50<<20, 1<<20
		if n, err := Place([]Node{a, b}, now, "", 0, 0); err != nil || n.Name != "b" {
			t.Fatalf("placed on %+v, %v; want b", n, err)
		}
		if _, err := Place([]Node{a}, now, "", 0, 0); !errors.Is(err, ErrNoNode) {
			t.Fatalf("a node under the floor took a session: %v", err)
		}
	})
	t.Run("memory all reserved takes nothing", func(t *testing.T) {
		a := live("a", 4, 0)
		a.MemTotal, a.MemAvail, a.SessionReserve = 4<<30, 3<<30, 1<<30
		if _, err := Place([]Node{a}, now, "", 0, 0); !errors.Is(err, ErrNoNode) {
			t.Fatalf("a node with every byte reserved took a session: %v", err)
		}
	})
	t.Run("dead and full nodes are skipped", func(t *testing.T) {
		dead := live("a", 0, 10)
		dead.Renewed = now.Add(-2 * time.Minute)
		if n, err := Place([]Node{dead, live("b", 10, 10), live("c", 9, 10)}, now, "", 0, 0); err != nil || n.Name != "c" {
			t.Fatalf("placed on %+v, %v; want c", n, err)
		}
		if _, err := Place([]Node{dead, live("b", 10, 10)}, now, "", 0, 0); !errors.Is(err, ErrNoNode) {
			t.Fatalf("no room: %v", err)
		}
	})
	t.Run("tenant limit is cluster-wide", func(t *testing.T) {
		_, err := Place([]Node{live("a", 0, 0)}, now, "acme", 3, 3)
		var tl *TenantLimitError
		if !errors.As(err, &tl) || tl.Tenant != "acme" {
			t.Fatalf("over the tenant's limit: %v", err)
		}
		if n, err := Place([]Node{live("a", 0, 0)}, now, "acme", 2, 3); err != nil || n.Name != "a" {
			t.Fatalf("under the limit: %+v, %v", n, err)
		}
	})
}

func TestSessionRef(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ method, path, header, want string }{
		{"GET", "/v1/sessions/abc", "", "abc"},
		{"POST", "/v1/sessions/abc/run", "", "abc"},
		{"GET", "/v1/sessions/abc/ports/8000/x", "", "abc"},
		{"GET", "/v1/sessions/my%20s/files/a", "", "my s"},
		{"DELETE", "/e2b/sandboxes/0123", "", "0123"},
		{"POST", "/process.Process/Start", "0123", "0123"},
		{"POST", "/v1/run_code", "", ""},
		{"POST", "/v1/sessions", "", ""},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		if c.header != "" {
			r.Header.Set("E2b-Sandbox-Id", c.header)
		}
		if got := sessionRef(r); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.method, c.path, got, c.want)
		}
	}
	if !isCreate(httptest.NewRequest("POST", "/v1/sessions", nil)) || isCreate(httptest.NewRequest("GET", "/v1/sessions", nil)) {
		t.Error("isCreate")
	}
	if !isSessionRoot("/v1/sessions/abc") || isSessionRoot("/v1/sessions/abc/run") {
		t.Error("isSessionRoot")
	}
}

func TestLeaseAndSessionObjects(t *testing.T) {
	t.Parallel()
	now := time.Now().Truncate(time.Microsecond)
	u := leaseObject("ns", "quro-1", "10.0.0.7:7070", 15*time.Second, Node{Sessions: 3, MaxSessions: 40, MemAvail: 5, MemTotal: 9, SessionReserve: 2}, now)
	n, ok := nodeFromLease(u)
	if !ok || n.Name != "quro-1" || n.Address != "10.0.0.7:7070" || n.Sessions != 3 || n.MaxSessions != 40 ||
		n.MemAvail != 5 || n.MemTotal != 9 || n.SessionReserve != 2 || n.TTL != 15*time.Second || !n.Renewed.Equal(now) {
		t.Fatalf("%+v %v", n, ok)
	}
	if !n.Live(now.Add(10*time.Second)) || n.Live(now.Add(16*time.Second)) {
		t.Fatal("liveness by the Lease's duration")
	}
	if !n.Acquired.IsZero() {
		t.Fatalf("a Lease without acquireTime (an earlier version's) read as acquired at %s", n.Acquired)
	}
	started := now.Add(-time.Hour)
	if n, _ := nodeFromLease(leaseObject("ns", "quro-1", "10.0.0.7:7070", 15*time.Second, Node{Acquired: started}, now)); !n.Acquired.Equal(started) {
		t.Fatalf("acquired %s, want this start's %s", n.Acquired, started)
	}
	// A Lease of another name that claims quro-1 (any node may write
	// Leases): not read as quro-1, whatever its pin and address.
	impostor := leaseObject("ns", "quro-1", "10.0.0.9:7070", 15*time.Second, Node{Pin: "ab"}, now)
	impostor.SetName(LeasePrefix + "quro-2")
	if n, ok := nodeFromLease(impostor); ok {
		t.Fatalf("a Lease named for quro-2 read as node %q", n.Name)
	}
	u.SetLabels(map[string]string{"app": "other"}) // another program's Lease
	if _, ok := nodeFromLease(u); ok {
		t.Fatal("a Lease without Quro's label read as a node")
	}
	s := &Session{Spec: SessionSpec{Node: "quro-1", Tenant: "acme", Name: "s1", Network: "none"},
		Status: SessionStatus{Alive: true, Node: "quro-1", Phase: PhaseReady}}
	s.Name = "0123456789abcdef0123456789abcdef"
	o, err := s.toUnstructured()
	if err != nil {
		t.Fatal(err)
	}
	if o.GetAPIVersion() != "quro.dev/v1alpha1" || o.GetKind() != "Session" {
		t.Fatalf("%s %s", o.GetAPIVersion(), o.GetKind())
	}
	back, err := sessionFrom(o)
	if err != nil || back.Spec != s.Spec || back.Status != s.Status || back.Name != s.Name {
		t.Fatalf("%+v %v", back, err)
	}
	for _, bad := range []string{"", "Upper", "a/b", "../x", strings.Repeat("a", 254)} {
		if validObjectName(bad) {
			t.Errorf("%q passed as an object name", bad)
		}
	}
}

// TestRank: a drain's order of nodes is placement's (Rank's first is
// Place's choice), without the dead and the full.
func TestRank(t *testing.T) {
	t.Parallel()
	now := time.Now()
	live := func(n Node) Node { n.Renewed, n.TTL = now, time.Minute; return n }
	nodes := []Node{
		live(Node{Name: "half", Sessions: 50, MaxSessions: 100}),
		live(Node{Name: "full", Sessions: 100, MaxSessions: 100}),
		{Name: "dead", MaxSessions: 100, Renewed: now.Add(-time.Hour), TTL: time.Minute},
		live(Node{Name: "b-empty", MaxSessions: 100}),
		live(Node{Name: "a-empty", MaxSessions: 100}),
		live(Node{Name: "draining", MaxSessions: 100, Draining: true}),
		live(Node{Name: "tenth", Sessions: 10, MaxSessions: 100}),
	}
	var got []string
	for _, n := range Rank(nodes, now) {
		got = append(got, n.Name)
	}
	if want := []string{"a-empty", "b-empty", "tenth", "half"}; !slices.Equal(got, want) {
		t.Fatalf("Rank: %q, want %q", got, want)
	}
	if p, err := Place(nodes, now, "", 0, 0); err != nil || p.Name != got[0] {
		t.Fatalf("Place chose %v (%v), Rank's first is %s", p, err, got[0])
	}
	if r := Rank(nodes[1:3], now); len(r) != 0 {
		t.Fatalf("Rank of a full and a dead node: %v", r)
	}
}
