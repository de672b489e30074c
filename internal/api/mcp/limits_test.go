package mcp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// rawInitialize opens an MCP session with one initialize POST, as an
// attacker would, and returns its id.
func rawInitialize(t *testing.T, url, token string) string {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`
	resp := rawPost(t, url, token, "", body)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || id == "" {
		t.Fatalf("initialize: %d %q", resp.StatusCode, id)
	}
	return id
}

func rawPost(t *testing.T, url, token, session, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func bodyOf(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

// TestHTTPSessionCaps: a read token that initializes sessions without end
// holds at most its cap; a new session over the cap evicts the least
// recently used idle one (404 afterwards), per caller and in all; the
// sessions in use and fresh clients keep working.
func TestHTTPSessionCaps(t *testing.T) {
	a := newApp(t)
	h := quromcp.Handler(a.Controller, tokens, &quromcp.Options{MaxSessions: 5, MaxSessionsPerCaller: 3, MaxSessionsPerTenant: 5})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	count := func() int { return h.(quromcp.Counter).Count() }

	// The flood: 200 initializes by the read token. Its sessions never
	// pass 3, and the earliest are gone.
	var ids []string
	for range 200 {
		ids = append(ids, rawInitialize(t, srv.URL, "ro"))
		if n := count(); n > 3 {
			t.Fatalf("%d sessions held after %d initializes; the cap is 3", n, len(ids))
		}
	}
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if r := rawPost(t, srv.URL, "ro", ids[0], ping); r.StatusCode != 404 || !strings.Contains(bodyOf(r), "initialize a new one") {
		t.Fatalf("the first flooded session: %d", r.StatusCode)
	}
	if r := rawPost(t, srv.URL, "ro", ids[199], ping); r.StatusCode != 200 {
		t.Fatalf("the last flooded session: %d %s", r.StatusCode, bodyOf(r))
	}
	// A POST without a session that is no initialize takes no place, nor
	// does the Go SDK client's first probe (a newer protocol, refused):
	// the least recently used session is still there after them.
	rawPost(t, srv.URL, "ro", "", ping)
	probe, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2026-07-28","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	probe.Header.Set("Content-Type", "application/json")
	probe.Header.Set("Accept", "application/json, text/event-stream")
	probe.Header.Set("Authorization", "Bearer ro")
	probe.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	if resp, err := http.DefaultClient.Do(probe); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if r := rawPost(t, srv.URL, "ro", ids[197], ping); r.StatusCode != 200 || count() != 3 {
		t.Fatalf("a request that opened no session evicted one: %d, %d held", r.StatusCode, count())
	}
	// ids[197] was just used: ids[198] is now the least recently used.
	ids[197], ids[198] = ids[198], ids[197]

	// The admin's SDK clients: the least recently used idle one goes.
	admin := &bearer{}
	admin.token.Store("admin")
	var cs []*mcp.ClientSession
	for range 3 {
		c, err := connectHTTP(t, srv.URL, admin, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	// The total (5) is reached: ro keeps 2 of its 3 (its oldest went).
	if n := count(); n != 5 {
		for _, id := range ids[196:] {
			t.Logf("ro %s: %d", id, rawPost(t, srv.URL, "ro", id, ping).StatusCode)
		}
		for _, c := range cs {
			t.Logf("admin %s: %d", c.ID(), rawPost(t, srv.URL, "admin", c.ID(), ping).StatusCode)
		}
		t.Fatalf("%d sessions held, want 5", n)
	}
	if r := rawPost(t, srv.URL, "ro", ids[197], ping); r.StatusCode != 404 {
		t.Fatalf("ro's least recently used session survived the total cap: %d", r.StatusCode)
	}
	// cs[0] used last: cs[1] is now the admin's least recently used.
	if o, err := callTool(t, cs[0], "get_service_status", nil); err != nil || o.IsError {
		t.Fatalf("%v %+v", err, o)
	}
	fresh, err := connectHTTP(t, srv.URL, admin, nil) // evicts cs[1] (its own cap)
	if err != nil {
		t.Fatalf("a fresh client: %v", err)
	}
	if n := count(); n != 5 {
		t.Fatalf("%d sessions held, want 5", n)
	}
	if r := rawPost(t, srv.URL, "admin", cs[1].ID(), ping); r.StatusCode != 404 {
		t.Fatalf("the least recently used admin session was not evicted: %d %s", r.StatusCode, bodyOf(r))
	}
	if _, err := callTool(t, cs[1], "get_service_status", nil); err == nil {
		t.Fatal("a call on an evicted session succeeded")
	}
	for _, c := range []*mcp.ClientSession{cs[0], cs[2], fresh} {
		if o, err := callTool(t, c, "get_service_status", nil); err != nil || o.IsError {
			t.Fatalf("session %s: %v %+v", c.ID(), err, o)
		}
	}
	// Ending sessions frees their places at once.
	for _, c := range []*mcp.ClientSession{cs[0], cs[2], fresh} {
		c.Close()
	}
	if n := count(); n != 2 {
		t.Fatalf("%d sessions held after the admin's closed, want ro's 2", n)
	}
}

// A session with a request in flight is not evicted: when every session
// under the cap is busy, a new one is refused with 429 and a reason; once
// the request ends, the new one evicts it.
func TestHTTPSessionCapBusy(t *testing.T) {
	a := newApp(t)
	h := quromcp.Handler(a.Controller, tokens, &quromcp.Options{MaxSessionsPerCaller: 1})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	id := rawInitialize(t, srv.URL, "admin")

	// A POST on the session whose body is not sent yet: the server asks
	// for it (100 Continue) once the request is under way.
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer admin\r\nMcp-Session-Id: %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", id, len(ping))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("%q %v", line, err)
	}
	r := rawPost(t, srv.URL, "admin", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`)
	if body := bodyOf(r); r.StatusCode != 429 || !strings.Contains(body, "in flight") {
		t.Fatalf("a new session over the cap with the only one busy: %d %s", r.StatusCode, body)
	}
	// The request ends; now the new session evicts the idle one.
	io.WriteString(c, ping)
	br.ReadString('\n') // the blank line after 100 Continue
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the busy request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	second := rawInitialize(t, srv.URL, "admin")
	if r := rawPost(t, srv.URL, "admin", id, ping); r.StatusCode != 404 {
		t.Fatalf("the old session after it went idle: %d", r.StatusCode)
	}
	// And the books still hold: a third evicts the second.
	rawInitialize(t, srv.URL, "admin")
	if r := rawPost(t, srv.URL, "admin", second, ping); r.StatusCode != 404 {
		t.Fatalf("the second session: %d", r.StatusCode)
	}
	if n := h.(quromcp.Counter).Count(); n != 1 {
		t.Fatalf("%d sessions held; the cap is 1", n)
	}
}

// Each tenant's callers together hold at most the tenant's share of the
// sessions: two tenants, a's three tokens flooding initializes evict a's
// own least recently used sessions, never b's; with all of a's sessions
// busy, a's next is refused (429) with a message naming the share, while
// b still opens one.
func TestHTTPSessionTenantShare(t *testing.T) {
	a := newApp(t)
	auth := func(r *http.Request) (controller.Caller, error) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch tok {
		case "a1", "a2", "a3":
			return controller.Caller{Tenant: "a", TokenID: tok, Scope: capability.ScopeRead}, nil
		case "b1":
			return controller.Caller{Tenant: "b", TokenID: tok, Scope: capability.ScopeRead}, nil
		}
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "no valid bearer token")
	}
	h := quromcp.Handler(a.Controller, auth, &quromcp.Options{MaxSessions: 8, MaxSessionsPerCaller: 2, MaxSessionsPerTenant: 3})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	count := func() int { return h.(quromcp.Counter).Count() }
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	b1 := rawInitialize(t, srv.URL, "b1")
	b2 := rawInitialize(t, srv.URL, "b1")
	var as []string
	for i := range 30 {
		as = append(as, rawInitialize(t, srv.URL, fmt.Sprint("a", 1+i%3)))
		if n := count(); n > 5 {
			t.Fatalf("%d sessions after a's %d initializes: a's share is 3, b holds 2", n, i+1)
		}
	}
	for _, id := range []string{b1, b2} {
		if r := rawPost(t, srv.URL, "b1", id, ping); r.StatusCode != 200 {
			t.Fatalf("b's session after a's flood: %d %s", r.StatusCode, bodyOf(r))
		}
	}
	// a's three latest sessions, each made busy by a POST whose body is
	// not sent yet.
	for i, id := range as[len(as)-3:] {
		tok := fmt.Sprint("a", 1+(len(as)-3+i)%3)
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nMcp-Session-Id: %s\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", tok, id, len(ping))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
			t.Fatalf("a's session %d: %q %v", i, line, err)
		}
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	r := rawPost(t, srv.URL, "a2", "", init)
	if body := bodyOf(r); r.StatusCode != 429 || !strings.Contains(body, "tenant's share of the MCP sessions") || !strings.Contains(body, "3 of 3") {
		t.Fatalf("a past its share with every session busy: %d %s", r.StatusCode, body)
	}
	rawInitialize(t, srv.URL, "b1") // b's own caller cap evicts b's oldest; a's busy ones stay
	if n := count(); n != 5 {
		t.Fatalf("%d sessions held, want a's 3 and b's 2", n)
	}
}
