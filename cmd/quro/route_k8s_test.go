//go:build k8s

package main

// The cluster's routing of calls that name their session in the body, and
// the forwarding header's key, on two nodes against a real API server
// (the harness of cluster_k8s_test.go). Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterRoutes ./cmd/quro/

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/cluster"
)

func TestClusterRoutes(t *testing.T) {
	acme, other := quroToken(), quroToken()
	a, b, _, owner := twoNodes(t, acme+" acme exec\n"+other+" other exec\n")
	auth := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

	// A session made through node a by the capability route; the calls
	// below go through the node that does not own it (placement is not
	// what this test proves). A node serves once its own live Lease is in
	// its table (joinCluster waits for it), so the create places at once.
	r := do(t, "POST", a.url+"/v1/create_session", "application/json", `{"name":"r0"}`, auth(acme)...)
	if r.status != http.StatusOK {
		t.Fatalf("create_session: %d %s", r.status, r.body)
	}
	var created struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.body), &created); err != nil || created.ID == "" {
		t.Fatalf("create_session: %s", r.body)
	}
	id, via := created.ID, a
	if owner(id) == "node-a" {
		via = b
	}
	t.Logf("session %s on %s, called through %s", id, owner(id), via.name)

	t.Run("the body names the session: any node reaches its owner", func(t *testing.T) {
		big := strings.Repeat("y", 200<<10) // the session follows a large member
		r := do(t, "POST", via.url+"/v1/write_file", "application/json",
			`{"path":"big.txt","content":"`+big+`","session":"`+id+`"}`, auth(acme)...)
		if r.status != 200 {
			t.Fatalf("write_file through %s: %d %.300s", via.name, r.status, r.body)
		}
		r = do(t, "POST", via.url+"/v1/run_code", "application/json",
			`{"session":"`+id+`","lang":"bash","code":"wc -c < big.txt"}`, auth(acme)...)
		if r.status != 200 || !strings.Contains(r.body, fmt.Sprint(len(big))) {
			t.Fatalf("run_code through %s: %d %.300s", via.name, r.status, r.body)
		}
	})

	t.Run("an audit query on any node has every node's entries", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			r := do(t, "GET", n.url+"/v1/audit?capability=run_code", "", "", auth(acme)...)
			var out struct {
				Entries []struct {
					Node, Capability string
				} `json:"entries"`
			}
			if err := json.Unmarshal([]byte(r.body), &out); err != nil || r.status != 200 ||
				len(out.Entries) != 1 || out.Entries[0].Node != owner(id) {
				t.Fatalf("audit through %s: %d %.500s", n.name, r.status, r.body)
			}
		}
	})

	// The route follows a body's first "session" and the owner's decoder
	// took the last: a body that names two sessions (one on each node)
	// is refused by whichever node it reaches, and runs in neither.
	t.Run("a body that names its session twice is refused", func(t *testing.T) {
		var id2 string
		for i := 0; id2 == ""; i++ {
			if i == 10 {
				t.Fatal("10 sessions, none on the other node")
			}
			r := do(t, "POST", a.url+"/v1/create_session", "application/json", fmt.Sprintf(`{"name":"dup%d"}`, i), auth(acme)...)
			var c struct {
				ID string `json:"id"`
			}
			if r.status != 200 || json.Unmarshal([]byte(r.body), &c) != nil {
				t.Fatalf("create_session: %d %s", r.status, r.body)
			}
			if owner(c.ID) != owner(id) {
				id2 = c.ID
			}
		}
		for _, n := range []*node{a, b} {
			for _, body := range []string{
				`{"session":"` + id + `","lang":"bash","code":"touch pwned","session":"` + id2 + `"}`,
				`{"session":"` + id2 + `","lang":"bash","code":"touch pwned","Session":"` + id + `"}`,
			} {
				r := do(t, "POST", n.url+"/v1/run_code", "application/json", body, auth(acme)...)
				if r.status != http.StatusBadRequest || !strings.Contains(r.body, "more than once") {
					t.Fatalf("a body naming two sessions through %s: %d %.300s", n.name, r.status, r.body)
				}
			}
		}
		for _, s := range []string{id, id2} {
			r := do(t, "POST", via.url+"/v1/run_code", "application/json",
				`{"session":"`+s+`","lang":"bash","code":"ls pwned 2>&1 || echo clean"}`, auth(acme)...)
			if r.status != 200 || !strings.Contains(r.body, "clean") {
				t.Fatalf("session %s after the refused bodies: %d %.300s", s, r.status, r.body)
			}
		}
	})

	t.Run("another tenant cannot reach it through the body either", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			r := do(t, "POST", n.url+"/v1/read_file", "application/json", `{"session":"`+id+`","path":"big.txt","limit":3}`, auth(other)...)
			if r.status == 200 || strings.Contains(r.body, "yyy") {
				t.Fatalf("tenant other read acme's file through %s: %d %.300s", n.name, r.status, r.body)
			}
		}
	})

	t.Run("a forwarding header from outside is refused", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			for _, c := range []struct{ path, body string }{
				{"/v1/sessions", `{}`}, // a create past placement and the tenant limit
				{"/v1/read_file", `{"session":"` + id + `","path":"x"}`}, // a call served here, not forwarded
			} {
				r := do(t, "POST", n.url+c.path, "application/json", c.body, append(auth(acme), cluster.HeaderForwardedBy, "node-a")...)
				if r.status != http.StatusForbidden {
					t.Fatalf("%s %s with a forged %s: %d %.300s", n.name, c.path, cluster.HeaderForwardedBy, r.status, r.body)
				}
			}
		}
	})

	// The replay attack: a preview through the node that does not own the
	// session reaches the box's web server by the owner's proxy, which
	// hands the request's headers on. A signed forwarding header the box
	// read would be the tenant's to send from outside, for good.
	t.Run("the box's web server never reads the forwarding header", func(t *testing.T) {
		const echo = `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8765), H)
open('ready', 'w').write('up\n')
s.serve_forever()
`
		r := do(t, "POST", via.url+"/v1/run_code", "application/json", `{"session":"`+id+`","lang":"bash","code":"mkfifo ready"}`, auth(acme)...)
		if r.status != 200 {
			t.Fatalf("mkfifo: %d %.300s", r.status, r.body)
		}
		start, _ := json.Marshal(map[string]any{"session": id, "cmd": "python3", "args": []string{"-c", echo}, "background": true})
		if r = do(t, "POST", via.url+"/v1/start_process", "application/json", string(start), auth(acme)...); r.status != 200 {
			t.Fatalf("start_process: %d %.300s", r.status, r.body)
		}
		// The server writes the FIFO once it listens.
		if r = do(t, "POST", via.url+"/v1/run_code", "application/json", `{"session":"`+id+`","lang":"bash","code":"read up < ready && echo $up"}`, auth(acme)...); r.status != 200 || !strings.Contains(r.body, "up") {
			t.Fatalf("the box's server did not start: %d %.300s", r.status, r.body)
		}
		r = do(t, "GET", via.url+"/v1/sessions/"+id+"/ports/8765/", "", "", auth(acme)...)
		var saw map[string]string
		if err := json.Unmarshal([]byte(r.body), &saw); r.status != 200 || err != nil {
			t.Fatalf("the preview through %s: %d %.300s", via.name, r.status, r.body)
		}
		if v, ok := saw[strings.ToLower(cluster.HeaderForwardedBy)]; ok {
			t.Fatalf("the box read %s %q through %s's forward", cluster.HeaderForwardedBy, v, via.name)
		}
		if saw["authorization"] != "" {
			t.Fatalf("the box read the caller's token")
		}
	})
}
