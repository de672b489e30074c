package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
)

// TestPeerEvents: the merging side of GET /v1/events across nodes, with
// nodes that answer as a node's events route does (TestClusterEventsMerged,
// build tag k8s, runs real nodes): each live node other than this one is
// asked with the caller's credential and the signed forwarding header;
// ready names the nodes whose hello came and those that refused; their
// events come marked with their node, answers to control messages left
// out; a dead node is not asked; under ServeHere nobody is.
func TestPeerEvents(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	merger := &Router{Key: key}
	merger.Table = &staticTable{self: "a"}
	var dials atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dials.Add(1)
		if r.URL.Path != eventsPath || r.Header.Get("Authorization") != "Bearer tok" ||
			!merger.signed(r.Header.Values(HeaderForwardedBy)) || r.Header.Get(HeaderForwardedPath) != "ws" {
			http.Error(w, "refused", http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		for _, m := range []string{`{"type":"hello"}`, `{"type":"taken","session":"s0"}`,
			`{"seq":7,"type":"call","session":"s1","capability":"exec","input":{"command":"echo hi"},"time":"2026-01-01T00:00:00Z"}`,
			`not json`, `{"seq":8,"type":"end","session":"s1","outcome":"ok","time":"2026-01-01T00:00:00Z"}`} {
			if c.Write(ctx, websocket.MessageText, []byte(m)) != nil {
				return
			}
		}
		_, _, _ = c.Read(ctx) // until the merger leaves
	}))
	t.Cleanup(peer.Close)
	refuses := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such token", http.StatusUnauthorized)
	}))
	t.Cleanup(refuses.Close)
	var deadAsked atomic.Bool
	dead := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { deadAsked.Store(true) }))
	t.Cleanup(dead.Close)
	now := time.Now()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	merger.Table = &staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "127.0.0.1:1", Renewed: now, TTL: time.Hour},
		{Name: "b", Address: addr(peer), Renewed: now, TTL: time.Hour},
		{Name: "c", Address: addr(dead), Renewed: now.Add(-2 * time.Hour), TTL: time.Hour},
		{Name: "d", Address: addr(refuses), Renewed: now, TTL: time.Hour},
	}}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type joinedNodes struct{ joined, unanswered []string }
	ready := make(chan joinedNodes, 1)
	got := make(chan events.Event)
	done := make(chan struct{})
	go func() {
		defer close(done)
		merger.PeerEvents(ctx, "Bearer tok", func(j, u []string) { ready <- joinedNodes{j, u} },
			func(ev events.Event) bool {
				select {
				case got <- ev:
					return true
				case <-ctx.Done():
					return false
				}
			})
	}()
	select {
	case j := <-ready:
		if !slices.Equal(j.joined, []string{"b"}) || !slices.Equal(j.unanswered, []string{"d"}) {
			t.Fatalf("joined %v, unanswered %v; want [b] and [d]", j.joined, j.unanswered)
		}
	case <-ctx.Done():
		t.Fatal("ready was never called")
	}
	for _, want := range []struct {
		typ string
		seq uint64
	}{{events.TypeCall, 7}, {events.TypeEnd, 8}} {
		ev := <-got
		if ev.Type != want.typ || ev.Seq != want.seq || ev.Node != "b" || ev.Session != "s1" {
			t.Fatalf("event %+v; want a %s of s1, seq %d, from node b", ev, want.typ, want.seq)
		}
	}
	cancel()
	<-done
	if deadAsked.Load() {
		t.Error("a node whose Lease lapsed was asked")
	}

	// Under a signed forwarding header (ServeHere) another node merges:
	// this one asks no one.
	before := dials.Load()
	called := false
	merger.PeerEvents(controller.ServeHere(context.Background()), "Bearer tok",
		func(j, u []string) { called = len(j) == 0 && len(u) == 0 },
		func(events.Event) bool { t.Error("an event under ServeHere"); return false })
	if !called || dials.Load() != before {
		t.Fatalf("under ServeHere: ready called empty %v, nodes asked %d", called, dials.Load()-before)
	}
}
