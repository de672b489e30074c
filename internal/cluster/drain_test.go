package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMoveSignature(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now()
	sig := MoveSignature(key, "quro-0", "quro-1", "abc", now)
	c, err := VerifyMove(key, sig, "quro-1", "abc", now)
	if err != nil || c.From != "quro-0" || c.Nonce == "" {
		t.Fatalf("a good signature: %+v %v", c, err)
	}
	if again := MoveSignature(key, "quro-0", "quro-1", "abc", now); again == sig {
		t.Fatal("two signatures of the same move at the same second are equal: no nonce")
	}
	f := strings.Fields(sig)
	for name, tc := range map[string]struct {
		key      []byte
		header   string
		to, id   string
		at       time.Time
		contains string
	}{
		"another session":  {key, sig, "quro-1", "abd", now, "not signed"},
		"another receiver": {key, sig, "quro-2", "abc", now, "not signed"},
		"the sender":       {key, sig, "quro-0", "abc", now, "not signed"},
		"another key":      {[]byte("another key of thirty-two bytes!!"), sig, "quro-1", "abc", now, "not signed"},
		"another node":     {key, "quro-2" + strings.TrimPrefix(sig, "quro-0"), "quro-1", "abc", now, "not signed"},
		"another nonce":    {key, strings.Join([]string{f[0], f[1], "AAAAAAAAAAAAAAAAAAAAAA", f[3]}, " "), "quro-1", "abc", now, "not signed"},
		"a short nonce":    {key, strings.Join([]string{f[0], f[1], "AAAA", f[3]}, " "), "quro-1", "abc", now, "nonce"},
		"too old":          {key, sig, "quro-1", "abc", now.Add(MoveSkew + time.Minute), "from now"},
		"from the future":  {key, sig, "quro-1", "abc", now.Add(-MoveSkew - time.Minute), "from now"},
		"no key":           {nil, sig, "quro-1", "abc", now, "no forwarding key"},
		"an older node's":  {key, strings.Join([]string{f[0], f[1], f[3]}, " "), "quro-1", "abc", now, "older version"},
		"five fields":      {key, "quro-0 " + sig, "quro-1", "abc", now, "FROM TIME NONCE SIGNATURE"},
	} {
		if _, err := VerifyMove(tc.key, tc.header, tc.to, tc.id, tc.at); err == nil || !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: %v, want %q", name, err, tc.contains)
		}
	}
}

func TestMoveReplays(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now()
	var r MoveReplays
	claim := func(sig string) MoveClaim {
		t.Helper()
		c, err := VerifyMove(key, sig, "quro-1", "abc", now)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := claim(MoveSignature(key, "quro-0", "quro-1", "abc", now))
	if !r.Use(first, now) {
		t.Fatal("a fresh header was taken for a replay")
	}
	if r.Use(first, now) || r.Use(first, now.Add(MoveSkew)) {
		t.Fatal("a header was taken twice within its window")
	}
	if !r.Use(claim(MoveSignature(key, "quro-0", "quro-1", "abc", now)), now) {
		t.Fatal("the next move of the same session was taken for a replay")
	}
	// Past its window the nonce is forgotten (VerifyMove refuses the
	// header by then), so the set does not grow for ever.
	r.Use(claim(MoveSignature(key, "quro-0", "quro-1", "abc", now)), now.Add(MoveSkew+2*time.Second))
	if n := len(r.seen); n != 1 {
		t.Fatalf("%d nonces remembered past their window, want 1", n)
	}
}

func TestPlaceSkipsDrainingNodes(t *testing.T) {
	t.Parallel()
	now := time.Now()
	nodes := []Node{
		{Name: "empty-but-draining", Renewed: now, TTL: time.Minute, Draining: true},
		{Name: "busy", Sessions: 50, Renewed: now, TTL: time.Minute},
	}
	n, err := Place(nodes, now, "", 0, 0)
	if err != nil || n.Name != "busy" {
		t.Fatalf("placed on %v (%v)", n, err)
	}
	nodes[1].Draining = true
	if _, err := Place(nodes, now, "", 0, 0); !errors.Is(err, ErrNoNode) {
		t.Fatalf("every node draining: %v", err)
	}
}

// TestRouterQuiesced: a call for a session being moved from this node is
// told 503 with Retry-After, whether it comes from a client or another
// node; other sessions are served.
func TestRouterQuiesced(t *testing.T) {
	t.Parallel()
	now := time.Now()
	table := &staticTable{self: "a",
		sessions: map[string]*Session{"moving": {Spec: SessionSpec{Node: "a"}}, "staying": {Spec: SessionSpec{Node: "a"}}},
		nodes:    []Node{{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour}}}
	table.sessions["moving"].Name, table.sessions["staying"].Name = "moving", "staying"
	d := &Drainer{}
	d.mark("moving", false)
	rt := &Router{Table: table, Quiesced: d.Quiesced,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "local") })}
	for _, tc := range []struct {
		path, fwd string
		want      int
	}{
		{"/v1/sessions/moving/run", "", http.StatusServiceUnavailable},
		{"/v1/sessions/moving/run", "b", http.StatusServiceUnavailable},
		{"/v1/sessions/staying/run", "", http.StatusOK},
		{"/v1/sessions/staying/run", "b", http.StatusOK},
	} {
		req := httptest.NewRequest("GET", tc.path, nil)
		if tc.fwd != "" {
			req.Header.Set(HeaderForwardedBy, tc.fwd)
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		if w.Code != tc.want || tc.want == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
			t.Errorf("%s (forwarded by %q): %d Retry-After=%q %s", tc.path, tc.fwd, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
	}
	// Moved away: still 503 for a while, so that a stale table elsewhere
	// never gets this node's "not found".
	d.mark("moving", true)
	w := httptest.NewRecorder()
	rt.ServeHTTP(w, httptest.NewRequest("GET", "/v1/sessions/moving/run", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("a session moved a moment ago: %d", w.Code)
	}
}

// TestDrainID: a drain's id, which receivers write into a tenant's audit
// log, has one form; a move naming anything else is refused.
func TestDrainID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		id := NewDrainID()
		if !ValidDrainID(id) || seen[id] {
			t.Fatalf("NewDrainID gave %q (valid %v, seen before %v)", id, ValidDrainID(id), seen[id])
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF", "0123456789abcde\n",
		`0123456789abc"=x`, "../../etc/passwd", "0123456789abcdeg"} {
		if ValidDrainID(bad) {
			t.Errorf("ValidDrainID(%q) is true", bad)
		}
	}
}

// TestProbeTellsAnOlderNodeApart: a drain takes a 404 or 405 to its
// admission probe as a yes (the session then paused and sent, the
// import deciding) only from a node of an earlier version, which has no
// probe: an answer without ProbeHeader from a node whose Lease does not
// say it has one. A 404 of this version (with the header), or one
// without it from a node whose Lease says it answers the probe, is a
// refusal: the session is not paused for a move that would fail.
func TestProbeTellsAnOlderNodeApart(t *testing.T) {
	t.Parallel()
	type answer struct {
		status int
		header bool
	}
	var mu sync.Mutex // the handler runs on the server's goroutine
	var next answer
	receiver := &Drainer{} // this version's route, for a path it does not take
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get(MoveHeader) == "" {
			t.Errorf("the probe: %s with %s %q", r.Method, MoveHeader, r.Header.Get(MoveHeader))
		}
		mu.Lock()
		a := next
		mu.Unlock()
		if a.status == 0 {
			receiver.ServeHTTP(w, r)
			return
		}
		if a.header {
			w.Header().Set(ProbeHeader, "1")
		}
		http.Error(w, http.StatusText(a.status), a.status)
	}))
	defer srv.Close()
	d := &Drainer{C: &Cluster{opts: Options{Node: "a"}}, Key: []byte("0123456789abcdef0123456789abcdef")}
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		name   string
		answer answer
		probe  bool // the receiver's Lease says it has the probe
		id     string
		yes    bool
		status int
	}{
		{"an earlier node's 404", answer{http.StatusNotFound, false}, false, "s1", true, 0},
		{"an earlier node's 405", answer{http.StatusMethodNotAllowed, false}, false, "s1", true, 0},
		{"a 404 of this version", answer{http.StatusNotFound, true}, false, "s1", false, http.StatusNotFound},
		{"a 405 of this version", answer{http.StatusMethodNotAllowed, true}, true, "s1", false, http.StatusMethodNotAllowed},
		{"a 404 without the header from a node whose Lease has the probe", answer{http.StatusNotFound, false}, true, "s1", false, http.StatusNotFound},
		{"this version's route refusing a path it does not take", answer{}, false, "NOT-AN-ID", false, http.StatusNotFound},
		{"this version's route, from a node whose Lease has the probe", answer{}, true, "NOT-AN-ID", false, http.StatusNotFound},
		{"a refusal for room", answer{http.StatusTooManyRequests, true}, true, "s1", false, http.StatusTooManyRequests},
	} {
		mu.Lock()
		next = tc.answer
		mu.Unlock()
		err := d.probe(context.Background(), tc.id, &Node{Name: "b", Address: host, Probe: tc.probe}, 5)
		var r *refusal
		switch {
		case tc.yes && err != nil:
			t.Errorf("%s: %v, want a yes (the import decides)", tc.name, err)
		case !tc.yes && (!errors.As(err, &r) || r.status != tc.status):
			t.Errorf("%s: %v, want a refusal (%d)", tc.name, err, tc.status)
		case !tc.yes && tc.status != http.StatusTooManyRequests && roomRefused(err):
			t.Errorf("%s: %v is taken as a refusal for room, passed on to the next node", tc.name, err)
		}
	}
}
