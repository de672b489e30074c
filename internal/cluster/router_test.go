package cluster

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// staticTable is a fixed cluster view: the Router's logic without an API
// server (TestCluster, build tag k8s, runs it against a real one).
type staticTable struct {
	self     string
	sessions map[string]*Session
	nodes    []Node
}

func (s *staticTable) Self() string { return s.self }
func (s *staticTable) Lookup(_ context.Context, id string) (*Session, bool) {
	x, ok := s.sessions[id]
	return x, ok
}
func (s *staticTable) Cached(id string) (*Session, bool) { return s.Lookup(context.Background(), id) }
func (s *staticTable) Resolve(ctx context.Context, _, ref string) (*Session, bool) {
	return s.Lookup(ctx, ref)
}
func (s *staticTable) TenantSessions(string) int { return 0 }
func (s *staticTable) Nodes() []Node             { return s.nodes }
func (s *staticTable) Node(name string) (Node, bool) {
	for _, n := range s.nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

func TestRouter(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			fmt.Fprintln(w, "first")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprintln(w, "second")
			return
		}
		fmt.Fprintf(w, "owner %s auth=%q by=%q", r.URL.Path, r.Header.Get("Authorization"), r.Header.Get(HeaderForwardedBy))
	}))
	defer owner.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // nothing answers there
	now := time.Now()
	table := &staticTable{self: "a",
		sessions: map[string]*Session{
			"onb": {Spec: SessionSpec{Node: "b"}}, "onc": {Spec: SessionSpec{Node: "c"}},
			"ond": {Spec: SessionSpec{Node: "d"}}, "ona": {Spec: SessionSpec{Node: "a"}},
		},
		nodes: []Node{
			{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
			{Name: "b", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now, TTL: time.Hour},
			{Name: "c", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now.Add(-time.Hour), TTL: time.Minute}, // lapsed
			{Name: "d", Address: deadAddr, Renewed: now, TTL: time.Hour},
		}}
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "local %s", r.URL.Path) })
	entry := httptest.NewServer(&Router{Table: table, Next: local})
	defer entry.Close()
	get := func(path string, hdr ...string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", entry.URL+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	t.Run("forwarded with the caller's credential", func(t *testing.T) {
		_, body := get("/v1/sessions/onb/files/x")
		if body != `owner /v1/sessions/onb/files/x auth="Bearer tok" by="a"` {
			t.Fatalf("got %q", body)
		}
	})
	t.Run("local and unknown sessions stay here", func(t *testing.T) {
		for _, p := range []string{"/v1/sessions/ona/run", "/v1/sessions/nobody/run", "/v1/status"} {
			if _, body := get(p); body != "local "+p {
				t.Fatalf("%s: %q", p, body)
			}
		}
	})
	t.Run("a forwarded request is never forwarded again", func(t *testing.T) {
		if _, body := get("/v1/sessions/onb/x", HeaderForwardedBy, "z"); body != "local /v1/sessions/onb/x" {
			t.Fatalf("got %q", body)
		}
	})
	t.Run("owner down: 503 with Retry-After", func(t *testing.T) {
		for _, id := range []string{"onc", "ond"} {
			resp, body := get("/v1/sessions/" + id + "/run")
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != RetryAfter {
				t.Fatalf("%s: %d Retry-After=%q %s", id, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
		}
	})
	t.Run("streams are not buffered", func(t *testing.T) {
		req, _ := http.NewRequest("GET", entry.URL+"/v1/sessions/onb/stream", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n') // arrives while the owner still holds the rest
		if err != nil || line != "first\n" {
			t.Fatalf("first line: %q %v", line, err)
		}
		close(release)
		if line, err = br.ReadString('\n'); err != nil || line != "second\n" {
			t.Fatalf("second line: %q %v", line, err)
		}
	})
}

// TestPlacementCountsItsOwnCreates: two like nodes whose table never
// catches up (the Leases say 0 sessions each): a burst of creates through
// one node still alternates between them, each placement counted until
// the table can show it.
func TestPlacementCountsItsOwnCreates(t *testing.T) {
	t.Parallel()
	var got []string
	serve := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = append(got, name)
		}))
	}
	b := serve("b")
	defer b.Close()
	now := time.Now()
	table := &staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour, MemTotal: 1 << 30, MemAvail: 1 << 29},
		{Name: "b", Address: strings.TrimPrefix(b.URL, "http://"), Renewed: now, TTL: time.Hour, MemTotal: 1 << 30, MemAvail: 1 << 29},
	}}
	rt := &Router{Table: table, Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = append(got, "a") })}
	for i := range 6 {
		path := "/v1/sessions"
		if i%3 == 2 {
			path = "/v1/create_session" // REST's capability route places as well
		}
		rec := httptest.NewRecorder()
		rt.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader("{}")))
		if rec.Code != http.StatusOK {
			t.Fatalf("create: %d %s", rec.Code, rec.Body)
		}
	}
	if want := "a b a b a b"; strings.Join(got, " ") != want {
		t.Fatalf("placements %q, want %q", strings.Join(got, " "), want)
	}
}

// TestRouterBody: POST /v1/{capability} names its session in the body;
// the Router reads no more of it than it needs (and never past MaxBody)
// and hands every byte on as it came, to the owner or to this node.
func TestRouterBody(t *testing.T) {
	t.Parallel()
	echo := func(who string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("%s: reading the body: %v", who, err)
			}
			fmt.Fprintf(w, "%s %s %d %s", who, r.URL.Path, r.ContentLength, b)
		}
	}
	owner := httptest.NewServer(echo("owner"))
	defer owner.Close()
	now := time.Now()
	table := &staticTable{self: "a",
		sessions: map[string]*Session{"onb": {Spec: SessionSpec{Node: "b"}}, "ona": {Spec: SessionSpec{Node: "a"}}},
		nodes: []Node{
			{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
			{Name: "b", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now, TTL: time.Hour},
		}}
	byHost := func(r *http.Request) string {
		if id, ok := strings.CutSuffix(r.Host, ".box"); ok {
			return id
		}
		return ""
	}
	entry := httptest.NewServer(&Router{Table: table, Next: echo("local"), MaxBody: 1 << 20,
		Refs: []func(*http.Request) string{func(*http.Request) string { return "" }, byHost}})
	defer entry.Close()
	post := func(path, body string) string {
		resp, err := http.Post(entry.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	big := strings.Repeat("x", 600<<10)
	for _, c := range []struct{ name, path, body, who string }{
		{"the session first", "/v1/run_code", `{"session":"onb","code":"print(1)"}`, "owner"},
		{"the session after a large member", "/v1/write_file", `{"path":"a","content":"` + big + `","session":"onb"}`, "owner"},
		{"nested objects are not the session", "/v1/run_code", `{"args":{"session":"onb"},"session":"ona"}`, "local"},
		{"this node's session", "/v1/run_code", `{"session":"ona","code":"1"}`, "local"},
		{"nobody's session", "/v1/run_code", `{"session":"nobody"}`, "local"},
		{"not JSON before the session", "/v1/run_code", `{"code":1,,"session":"onb"}`, "local"},
		{"not JSON after it: the local server's 400", "/v1/run_code", `{"session":"onb",`, "local"},
		{"a session in another case only: the local server's 400", "/v1/run_code", `{"SESSION":"onb"}`, "local"},
		{"a duplicate nested is no duplicate", "/v1/run_code", `{"session":"onb","args":{"session":"ona"}}`, "owner"},
		{"not an object", "/v1/run_code", `["session","onb"]`, "local"},
		{"a session that is no string", "/v1/run_code", `{"session":{"id":"onb"}}`, "local"},
		{"past MaxBody: the local server's 413", "/v1/write_file", `{"content":"` + big + big + `","session":"onb"}`, "local"},
		{"another path", "/v1/sessions/ona/run", `{"session":"onb"}`, "local"},
	} {
		want := fmt.Sprintf("%s %s %d %s", c.who, c.path, len(c.body), c.body)
		if got := post(c.path, c.body); got != want {
			if len(got) > 200 {
				got = got[:200] + "..."
			}
			t.Errorf("%s: got %q", c.name, got)
		}
	}
	// A body that names its session twice is refused before any node
	// serves it: this route would follow the first, the owner's decoder
	// take the last (in any case).
	for _, body := range []string{`{"session":"onb","code":"1","session":"ona"}`, `{"session":"ona","session":"onb"}`,
		`{"session":"onb","Session":"ona"}`, `{"SESSION":"ona","session":"onb"}`, `{"session":"onb","content":"` + big + `","session":"ona"}`} {
		resp, err := http.Post(entry.URL+"/v1/run_code", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `names \"session\" more than once`) {
			t.Errorf("a body naming its session twice: %d %.200s", resp.StatusCode, b)
		}
	}
	// A session named by the Host (Refs: E2B's PORT-ID.DOMAIN, a preview's).
	for host, want := range map[string]string{"onb.box": "owner /x 0 ", "ona.box": "local /x 0 ", "other": "local /x 0 "} {
		req, _ := http.NewRequest("GET", entry.URL+"/x", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != want {
			t.Errorf("Host %s: %q, want %q", host, b, want)
		}
	}
}

// TestForgedForwardingHeader: with the cluster's key, a request that
// carries the forwarding header without the key's signature came from
// outside: refused, create included (it would skip placement and the
// cluster-wide tenant limit); a node's own forwarded request is signed
// and served by the owner.
func TestForgedForwardingHeader(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	var served atomic.Int32
	owner := httptest.NewServer(&Router{Table: &staticTable{self: "b"}, Key: key,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); fmt.Fprint(w, "owner served") })})
	defer owner.Close()
	now := time.Now()
	table := &staticTable{self: "a",
		sessions: map[string]*Session{"onb": {Spec: SessionSpec{Node: "b"}}},
		nodes: []Node{
			{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
			{Name: "b", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now, TTL: time.Hour},
		}}
	entry := httptest.NewServer(&Router{Table: table, Key: key,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "entry served") })})
	defer entry.Close()
	do := func(base, method, path string, hdr ...string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader("{}"))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Add(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(entry.URL, "GET", "/v1/sessions/onb/files/x"); code != 200 || body != "owner served" {
		t.Fatalf("a signed forward: %d %s", code, body)
	}
	otherKey := base64.RawURLEncoding.EncodeToString(forwardMAC([]byte("another cluster's key, 32 bytes!"), "a"))
	good := base64.RawURLEncoding.EncodeToString(forwardMAC(key, "a"))
	for _, forged := range [][]string{
		{"a"}, {""}, {"a " + otherKey}, {"b " + good}, {"a " + good + "x"}, {"a " + good, "a " + good},
	} {
		var hdr []string
		for _, v := range forged {
			hdr = append(hdr, HeaderForwardedBy, v)
		}
		for _, target := range []struct{ base, method, path string }{
			{entry.URL, "POST", "/v1/sessions"},            // a create that would skip placement
			{entry.URL, "POST", "/v1/create_session"},      // and by the capability route
			{entry.URL, "GET", "/v1/sessions/onb/files/x"}, // a session's call, not forwarded
			{owner.URL, "GET", "/v1/sessions/onb/files/x"}, // straight to the owner
		} {
			code, body := do(target.base, target.method, target.path, hdr...)
			if code != http.StatusForbidden || !strings.Contains(body, HeaderForwardedBy) {
				t.Errorf("%s %s with %q: %d %s", target.method, target.path, forged, code, body)
			}
		}
	}
	// Without a credential the caller is told that first (401), as without
	// the header.
	authed := httptest.NewServer(&Router{Table: table, Key: key,
		Auth: func(r *http.Request) (controller.Caller, error) {
			if r.Header.Get("Authorization") == "" {
				return controller.Caller{}, errors.New("no token")
			}
			return controller.Caller{Tenant: "t"}, nil
		},
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(HeaderForwardedBy) != "" {
				t.Errorf("the forged header reached the local handler")
			}
			http.Error(w, "401 here", http.StatusUnauthorized)
		})})
	defer authed.Close()
	if code, body := do(authed.URL, "POST", "/v1/sessions", HeaderForwardedBy, "a"); code != http.StatusUnauthorized {
		t.Errorf("forged, no token: %d %s", code, body)
	}
	if code, body := do(authed.URL, "POST", "/v1/sessions", HeaderForwardedBy, "a", "Authorization", "Bearer x"); code != http.StatusForbidden {
		t.Errorf("forged, with a token: %d %s", code, body)
	}
	if served.Load() != 1 {
		t.Fatalf("the owner served %d requests, want the one signed forward", served.Load())
	}
}

// previewBox is a session's box as the preview proxy reaches it: every
// port dials the test's listener.
type previewBox struct{ addr string }

func (previewBox) PreviewByCaller(context.Context, controller.Caller, string, int) error { return nil }
func (previewBox) PreviewBySignature(context.Context, string, int, string) error         { return nil }
func (previewBox) PreviewPublic(context.Context, string, int) bool                       { return false }
func (b previewBox) DialPreview(ctx context.Context, _ string, _ int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", b.addr)
}

// TestForwardingHeaderNeverReachesABox runs the replay attack on the
// forwarding header: the signature names only the node, so a header a
// box could read would sign any request of its tenant, from outside, for
// good (a create then skips placement and the cluster-wide tenant
// limit). A preview of a session on another node is forwarded to its
// owner with the signed header, and the owner's preview proxy hands the
// request's headers on to the box's web server: the owner's router takes
// the header off once it has checked it, so the box sees none, and
// nothing it can replay.
func TestForwardingHeaderNeverReachesABox(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	captured := make(chan []string, 1)
	box := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		captured <- r.Header.Values(HeaderForwardedBy)
		fmt.Fprint(w, "the box's page")
	}))
	defer box.Close()
	backend := previewBox{addr: strings.TrimPrefix(box.URL, "http://")}
	owner := httptest.NewServer(&Router{Table: &staticTable{self: "b",
		sessions: map[string]*Session{"onb": {Spec: SessionSpec{Node: "b"}}}}, Key: key,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rest.ProxyPreview(w, r, backend, "onb", 8080, "/v1/sessions/onb/preview/8080", nil)
		})})
	defer owner.Close()
	now := time.Now()
	table := &staticTable{self: "a",
		sessions: map[string]*Session{"onb": {Spec: SessionSpec{Node: "b"}}},
		nodes: []Node{
			{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
			{Name: "b", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now, TTL: time.Hour},
		}}
	var localCreates atomic.Int32
	entry := httptest.NewServer(&Router{Table: table, Key: key,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isCreate(r) {
				localCreates.Add(1)
			}
			fmt.Fprint(w, "entry served")
		})})
	defer entry.Close()

	resp, err := http.Get(entry.URL + "/v1/sessions/onb/preview/8080/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "the box's page" {
		t.Fatalf("the preview through the entry node: %d %s", resp.StatusCode, body)
	}
	got := <-captured
	if len(got) == 0 {
		return
	}
	// The box read a signed header: replayed from outside on a create it
	// skips placement (served on the entry node, never placed).
	req, _ := http.NewRequest("POST", entry.URL+"/v1/sessions", strings.NewReader("{}"))
	req.Header.Set(HeaderForwardedBy, got[0])
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Fatalf("the box read %s %q; replayed on a create: %d, served on the entry node without placement %d time(s)",
		HeaderForwardedBy, got, resp.StatusCode, localCreates.Load())
}

// countingTable is a table whose tenant count is the creates that have
// finished (as the records a node writes before its create answers).
type countingTable struct {
	staticTable
	done atomic.Int32
}

func (c *countingTable) TenantSessions(string) int { return int(c.done.Load()) }

// TestBurstOfCreatesHeldToTheTenantLimit runs a burst of creates at once
// through one node: a create's record is written only when it is done,
// so while they all run the table counts none of them. Each placement
// counts until its create has answered: the tenant gets its limit of
// sessions, and the rest are refused (429), not placed.
func TestBurstOfCreatesHeldToTheTenantLimit(t *testing.T) {
	t.Parallel()
	const limit, burst = 2, 6
	now := time.Now()
	table := &countingTable{staticTable: staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
	}}}
	entered := make(chan struct{}, burst)
	release := make(chan struct{})
	rt := &Router{Table: table, TenantLimit: func(string) int { return limit },
		Auth: func(*http.Request) (controller.Caller, error) { return controller.Caller{Tenant: "t"}, nil },
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-release // the box is being made
			table.done.Add(1)
		})}
	srv := httptest.NewServer(rt)
	defer srv.Close()
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let() // before Close, which waits for the creates held here
	codes := make(chan int, burst)
	for range burst {
		go func() {
			resp, err := http.Post(srv.URL+"/v1/sessions", "application/json", strings.NewReader("{}"))
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	// Every create is either being made or answered: wait for the one or
	// the other of each.
	served, refused := 0, 0
	for served+refused < burst {
		select {
		case <-entered:
			served++
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("a create answered %d before any was let through", code)
			}
			refused++
		}
	}
	let()
	if served != limit {
		t.Fatalf("%d creates of a burst of %d were placed, the tenant's limit is %d", served, burst, limit)
	}
	for range served {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("a placed create: %d", code)
		}
	}
	// Done, the table counts them: the next is refused as well.
	resp, err := http.Post(srv.URL+"/v1/sessions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a create past the limit: %d", resp.StatusCode)
	}
}

// TestForwardedCreatesEndTheirCount: a create_session offered to Forward
// (MCP, the CLI: any path through the controller) is counted against its
// tenant only until it is handed on. Forward once left every such create
// counted for the node's life, so a tenant's creates over MCP reached its
// cluster-wide limit with no session of its own.
func TestForwardedCreatesEndTheirCount(t *testing.T) {
	t.Parallel()
	const limit = 2
	now := time.Now()
	rt := &Router{Table: &countingTable{staticTable: staticTable{self: "a", nodes: []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
	}}}, TenantLimit: func(string) int { return limit }}
	for i := range 3 * limit {
		_, forwarded, err := rt.Forward(context.Background(), controller.Caller{Tenant: "t"}, "create_session", "", json.RawMessage(`{}`))
		if err != nil || forwarded {
			t.Fatalf("create %d through the controller: forwarded %v, %v", i, forwarded, err)
		}
	}
}

// TestUsedOnlyForACallThatEnteredTheSession: a session is marked alive
// (Router.Used) when this node's controller ran a call in it — the
// caller authenticated, the session its own — never for a request that
// only names it: an unauthenticated call through this node or one a
// node forwarded here (its caller checked only by the handler) marks
// nothing, and neither does a call another node ran.
func TestUsedOnlyForACallThatEnteredTheSession(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	var mu sync.Mutex
	var used []string
	rt := &Router{Key: key,
		Table: &staticTable{self: "a", sessions: map[string]*Session{
			"ona": {ObjectMeta: metav1.ObjectMeta{Name: "ona"}, Spec: SessionSpec{Node: "a"}},
			"onb": {ObjectMeta: metav1.ObjectMeta{Name: "onb"}, Spec: SessionSpec{Node: "b"}}}},
		Auth: func(*http.Request) (controller.Caller, error) {
			return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "no token")
		},
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusUnauthorized) // what the handler answers without a token
		}),
		Used: func(id string) { mu.Lock(); used = append(used, id); mu.Unlock() },
	}
	srv := httptest.NewServer(rt)
	defer srv.Close()
	for _, tc := range []struct {
		path, body string
		forwarded  bool
	}{
		{"/v1/sessions/ona/exec", `{"command":"true"}`, false},
		{"/v1/run_code", `{"session":"ona","code":"1"}`, false},
		{"/v1/sessions/ona/exec", `{"command":"true"}`, true},
		{"/v1/run_code", `{"session":"ona","code":"1"}`, true},
	} {
		req, _ := http.NewRequest("POST", srv.URL+tc.path, strings.NewReader(tc.body))
		if tc.forwarded {
			req.Header.Set(HeaderForwardedBy, "b "+base64.RawURLEncoding.EncodeToString(forwardMAC(key, "b")))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s (forwarded %v): %d", tc.path, tc.forwarded, resp.StatusCode)
		}
	}
	mu.Lock()
	if len(used) != 0 {
		t.Fatalf("unauthenticated requests marked %v alive", used)
	}
	mu.Unlock()
	// The controller's served observer, told only of the calls this
	// node ran: one that entered a session marks it; one that entered
	// none does not.
	for _, id := range []string{"ona", ""} {
		rt.Served(context.Background(), &controller.Record{Capability: "run_code", Session: id})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(used) != 1 || used[0] != "ona" {
		t.Fatalf("calls that entered sessions marked %v alive, want [ona]", used)
	}
}

// TestSignedFilesProbe: a signed /files URL that names no session goes
// to the node whose session signed it (found by a probe signed with the
// cluster's key); a probe without that signature, or one a client adds
// to its own request, is answered by no node.
func TestSignedFilesProbe(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	isSigned := func(r *http.Request) bool { return r.URL.Path == "/files" && r.URL.Query().Has("signature") }
	signedBy := func(sig, id string) func(*http.Request) string {
		return func(r *http.Request) string {
			if r.URL.Query().Get("signature") == sig {
				return id
			}
			return ""
		}
	}
	now := time.Now()
	table := &staticTable{sessions: map[string]*Session{"sbb": {ObjectMeta: metav1.ObjectMeta{Name: "sbb"}, Spec: SessionSpec{Node: "b"}}}}
	owner := httptest.NewServer(&Router{Table: &staticTable{self: "b", sessions: table.sessions}, Key: key,
		SignedFiles: isSigned, SignedLocal: signedBy("good", "sbb"),
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "owner served %s probe=%q", r.Method, r.Header.Get(HeaderSignedProbe))
		})})
	defer owner.Close()
	table.self = "a"
	table.nodes = []Node{
		{Name: "a", Address: "unused", Renewed: now, TTL: time.Hour},
		{Name: "b", Address: strings.TrimPrefix(owner.URL, "http://"), Renewed: now, TTL: time.Hour},
	}
	entry := httptest.NewServer(&Router{Table: table, Key: key, SignedFiles: isSigned, SignedLocal: signedBy("none", ""),
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "entry served") })})
	defer entry.Close()
	do := func(base, method, query string, hdr ...string) string {
		req, _ := http.NewRequest(method, base+"/files?"+query, strings.NewReader("x"))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b)
	}
	for _, m := range []string{"GET", "POST"} {
		if got := do(entry.URL, m, "path=/f&signature=good"); got != `200 owner served `+m+` probe=""` {
			t.Errorf("a signed %s through the other node: %s", m, got)
		}
	}
	if got := do(entry.URL, "GET", "path=/f&signature=forged"); got != "200 entry served" {
		t.Errorf("a signature no node knows: %s (want this node's own answer)", got)
	}
	if got := do(entry.URL, "GET", "path=/f&signature=good", HeaderSignedProbe, "GET"); got != `200 owner served GET probe=""` {
		t.Errorf("a client's probe header: %s", got)
	}
	if got := do(owner.URL, "GET", "path=/f&signature=good", HeaderSignedProbe, "GET",
		HeaderForwardedBy, "a "+base64.RawURLEncoding.EncodeToString(make([]byte, 32))); !strings.HasPrefix(got, "403 ") {
		t.Errorf("a probe with a forged signature: %s", got)
	}
	signed := "a " + base64.RawURLEncoding.EncodeToString(forwardMAC(key, "a"))
	if got := do(owner.URL, "GET", "path=/f&signature=good", HeaderSignedProbe, "GET", HeaderForwardedBy, signed); got != "200 sbb" {
		t.Errorf("a node's probe: %s", got)
	}
	if got := do(owner.URL, "GET", "path=/f&signature=good", HeaderSignedProbe, "DELETE", HeaderForwardedBy, signed); !strings.HasPrefix(got, "404 ") {
		t.Errorf("a probe for another method: %s", got)
	}
}

// askingTable is a staticTable that notes which of its lookups a Router
// asked for a session its table lacks.
type askingTable struct {
	staticTable
	mu    sync.Mutex
	asked []string
}

func (a *askingTable) note(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, s)
}

func (a *askingTable) Lookup(ctx context.Context, id string) (*Session, bool) {
	a.note("lookup " + id)
	return a.staticTable.Lookup(ctx, id)
}

func (a *askingTable) Resolve(ctx context.Context, tenant, ref string) (*Session, bool) {
	a.note("resolve " + tenant + " " + ref)
	return a.staticTable.Resolve(ctx, tenant, ref)
}

// TestRouterResolvesForTheAuthenticatedCaller: a session the node's table
// holds is routed by the table alone; one it lacks is resolved for an
// authenticated caller's tenant (Table.Resolve, which reads the API
// server or waits for the informer), and looked up by ID only (the
// bounded Table.Lookup, which never waits) for a call no one
// authenticated.
func TestRouterResolvesForTheAuthenticatedCaller(t *testing.T) {
	t.Parallel()
	table := &askingTable{staticTable: staticTable{self: "a",
		sessions: map[string]*Session{"sa": {ObjectMeta: metav1.ObjectMeta{Name: "sa"}, Spec: SessionSpec{Node: "a"}}}}}
	rt := &Router{Table: table, Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }),
		Auth: func(r *http.Request) (controller.Caller, error) {
			if r.Header.Get("Authorization") != "Bearer good" {
				return controller.Caller{}, errors.New("no token")
			}
			return controller.Caller{Tenant: "acme"}, nil
		}}
	for _, c := range []struct {
		ref, auth, want string
	}{
		{"sa", "Bearer good", ""},
		{"sa", "", ""},
		{"work", "Bearer good", "resolve acme work"},
		{"made-up", "", "lookup made-up"},
		{"made-up", "Bearer bad", "lookup made-up"},
	} {
		table.mu.Lock()
		table.asked = nil
		table.mu.Unlock()
		req := httptest.NewRequest("GET", "/v1/sessions/"+c.ref+"/files/x", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		table.mu.Lock()
		got := strings.Join(table.asked, "; ")
		table.mu.Unlock()
		if got != c.want || w.Code != http.StatusTeapot {
			t.Errorf("%s with %q: asked %q (want %q), answered %d", c.ref, c.auth, got, c.want, w.Code)
		}
	}
}
