package cluster

import (
	"errors"
	"net/http/httptest"
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
	t.Run("memory counts", func(t *testing.T) {
		a, b := live("a", 1, 10), live("b", 2, 10)
		a.MemTotal, a.MemAvail = 100, 10 // a has few sessions but little memory
		b.MemTotal, b.MemAvail = 100, 70
		if n, err := Place([]Node{a, b}, now, "", 0, 0); err != nil || n.Name != "b" {
			t.Fatalf("placed on %+v, %v; want b", n, err)
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
