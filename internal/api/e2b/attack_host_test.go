package e2b_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// rawGet sends GET path to addr as written: Host and headers verbatim
// (names the client would refuse to send too), and returns the answer.
func rawGet(t *testing.T, addr, path, host string, hdr [][2]string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	b.WriteString("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n")
	for _, h := range hdr {
		b.WriteString(h[0] + ": " + h[1] + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("Host %q: %v", host, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Attack: with --e2b-domain the sandbox plane is routed by Host
// (PORT-ID.DOMAIN) and by E2b-Sandbox-Id; a tenant holding its own
// sandbox's access token crafts both to reach another tenant's sandbox:
// the other's id in the Host (as written, uppercase, with a port, with a
// trailing dot), the other's id in the header with its own in the Host
// and the reverse, a name that only ends as the domain does (evilDOMAIN),
// a deeper name, ids with path traversal, and an overlong id. Its own
// sandbox is reachable by host, so the routes are live; none of them
// reads the other tenant's file, and each answer is a short error (an
// overlong id was echoed whole in the 502's message: now its start only).
func TestAttackE2BDomainHostRouting(t *testing.T) {
	const domain = "quro.test"
	e := newEnvWith(t, nil, func(o *e2b.Options) { o.Domain = domain })
	mine := e.newSession(t)
	reply, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Tenant: "t2", Scope: capability.ScopeExec}, "create_session", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(reply.Output)
	var o struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &o); err != nil || len(o.ID) != 32 {
		t.Fatalf("t2's session: %s", b)
	}
	other := o.ID
	const secret = "t2-SECRET-content"
	if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: "t2", Scope: capability.ScopeExec},
		"write_file", json.RawMessage(`{"session":"`+other+`","path":"other.txt","content":"`+secret+`"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.App.Controller.Call(context.Background(), controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec},
		"write_file", json.RawMessage(`{"session":"`+mine+`","path":"mine.txt","content":"mine-ok"}`)); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.URL, "http://")
	tok := [2]string{"X-Access-Token", e.accessToken(mine)}
	hdrID := func(id string) [2]string { return [2]string{e2b.HeaderSandboxID, id} }
	port := [2]string{e2b.HeaderSandboxPort, "49983"}
	const read = "/files?path=/home/user/other.txt"

	// The route is live: its own sandbox by host, in any case, with a port.
	for _, host := range []string{"49983-" + mine + "." + domain, strings.ToUpper("49983-" + mine + "." + domain), "49983-" + mine + "." + domain + ":443"} {
		if status, body := rawGet(t, addr, "/files?path=/home/user/mine.txt", host, [][2]string{tok}); status != 200 || body != "mine-ok" {
			t.Fatalf("its own sandbox by Host %s: %d %s", host, status, body)
		}
	}
	long := strings.Repeat("a", 70000)
	for _, tc := range []struct {
		name, host string
		hdr        [][2]string
	}{
		{"the other's id in the Host", "49983-" + other + "." + domain, nil},
		{"uppercase", strings.ToUpper("49983-" + other + "." + domain), nil},
		{"with a port", "49983-" + other + "." + domain + ":443", nil},
		{"trailing dot", "49983-" + other + "." + domain + ".", nil},
		{"trailing dot and port", "49983-" + other + "." + domain + ".:80", nil},
		{"interpreter port", "49999-" + other + "." + domain, nil},
		{"header names the other, Host its own", "49983-" + mine + "." + domain, [][2]string{hdrID(other), port}},
		{"header names its own, Host the other", "49983-" + other + "." + domain, [][2]string{hdrID(mine), port}},
		{"header names the other, Host the API", "api." + domain, [][2]string{hdrID(other), port}},
		{"evilDOMAIN", "49983-" + other + ".evil" + domain, nil},
		{"DOMAIN.evil", "49983-" + other + "." + domain + ".evil", nil},
		{"deeper name", "49983-" + other + "." + mine + "." + domain, nil},
		{"id with its own in front", "49983-" + mine + "-" + other + "." + domain, nil},
		{"traversal in the header", "localhost", [][2]string{hdrID(mine + "/../" + other), port}},
		{"traversal in the header, dots", "localhost", [][2]string{hdrID("../" + other), port}},
		{"traversal in the Host", "49983-..%2f" + other + "." + domain, nil},
		{"overlong id in the Host", "49983-" + long + "." + domain, nil},
		{"overlong id in the header", "localhost", [][2]string{hdrID(long), port}},
		{"the other's id twice in the header", "localhost", [][2]string{hdrID(other), hdrID(mine), port}},
	} {
		status, body := rawGet(t, addr, read, tc.host, append([][2]string{tok}, tc.hdr...))
		shown := body
		if len(shown) > 200 {
			shown = shown[:200] + "…"
		}
		t.Logf("%s: %d %s", tc.name, status, strings.TrimSpace(shown))
		// An answer never echoes the client's overlong id whole.
		if strings.Contains(body, secret) || status < 400 || len(body) > 4096 {
			t.Errorf("%s (Host %.80s): %d %.200s", tc.name, tc.host, status, body)
		}
	}
	// The other tenant's file is there: its own token reads it.
	if status, body := rawGet(t, addr, read, "49983-"+other+"."+domain, [][2]string{{"X-Access-Token", e.accessToken(other)}}); status != 200 || body != secret {
		t.Fatalf("the other tenant's own read: %d %s", status, body)
	}
}
