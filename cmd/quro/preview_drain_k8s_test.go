//go:build k8s

package main

// A public preview URL across a drain, on two nodes against a real API
// server (the harness of cluster_k8s_test.go). Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterPublicPreviewAfterDrain ./cmd/quro/

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterPublicPreviewAfterDrain: a session's public port, opened on
// node a, answers its host name with no token through either node; after
// node a is drained the session is node b's, its web server (a process,
// which the move stops) started again, and the same URL, fetched through
// node a, which no longer holds the session, reaches it on node b: the
// port's public mark moved with the session, and the host form of a
// preview is forwarded to the new owner.
func TestClusterPublicPreviewAfterDrain(t *testing.T) {
	acme, admin := quroToken(), quroToken()
	a, b, _, owner := twoNodes(t, acme+" acme exec\n"+admin+" - admin\n",
		"--preview-domain", "http://preview.test", "--preview-public")
	auth := []string{"Authorization", "Bearer " + acme}
	call := func(t *testing.T, via *node, capability string, args map[string]any) string {
		t.Helper()
		body, _ := json.Marshal(args)
		r := do(t, "POST", via.url+"/v1/"+capability, "application/json", string(body), auth...)
		if r.status != 200 {
			t.Fatalf("%s through %s: %d %.400s", capability, via.name, r.status, r.body)
		}
		return r.body
	}
	// A session through node a until one is node a's: the node drained.
	var id string
	for i := 0; id == ""; i++ {
		if i == 10 {
			t.Fatal("10 sessions, none on node-a")
		}
		var c struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(call(t, a, "create_session", map[string]any{"name": fmt.Sprintf("p%d", i)})), &c); err != nil || c.ID == "" {
			t.Fatalf("create_session: %v", err)
		}
		if owner(c.ID) == "node-a" {
			id = c.ID
		}
	}
	const page = "public-page-71c3"
	call(t, a, "write_file", map[string]any{"session": id, "path": "site/index.html", "content": page + "\n"})
	// serve starts the session's web server on 8765 and waits for it to
	// listen (it writes a FIFO in the box's /tmp, which a move does not
	// carry).
	serve := func(t *testing.T, via *node) {
		t.Helper()
		const server = `import functools, http.server
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory='/home/user/site')
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8765), h)
open('/tmp/ready', 'w').write('up\n')
s.serve_forever()
`
		call(t, via, "run_code", map[string]any{"session": id, "lang": "bash", "code": "rm -f /tmp/ready && mkfifo /tmp/ready"})
		call(t, via, "start_process", map[string]any{"session": id, "cmd": "python3", "args": []string{"-c", server}, "background": true})
		if out := call(t, via, "run_code", map[string]any{"session": id, "lang": "bash", "code": "read up < /tmp/ready && echo $up"}); !strings.Contains(out, "up") {
			t.Fatalf("the session's web server did not start: %s", out)
		}
	}
	serve(t, a)
	var u struct {
		HostURL string `json:"host_url"`
		Public  bool   `json:"public"`
	}
	if err := json.Unmarshal([]byte(call(t, b, "get_preview_url", map[string]any{"session": id, "port": 8765, "public": true})), &u); err != nil || !u.Public || u.HostURL == "" {
		t.Fatalf("get_preview_url public: %+v %v", u, err)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(u.HostURL, "http://"), "/")
	// fetch is the public URL with no token, sent to via.
	fetch := func(t *testing.T, via *node) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", via.url+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(rb)
	}
	for _, via := range []*node{a, b} {
		if status, body := fetch(t, via); status != 200 || !strings.Contains(body, page) {
			t.Fatalf("the public URL through %s before the drain: %d %.300s", via.name, status, body)
		}
	}

	adminFile := filepath.Join(t.TempDir(), "admin")
	if err := os.WriteFile(adminFile, []byte(admin), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	root := newRoot(strings.NewReader(""), &out, &errOut)
	root.SetArgs([]string{"node", "drain", "--server", a.url, "--token-file", adminFile})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("quro node drain: %v\n%s%s", err, out.String(), errOut.String())
	}
	if o := owner(id); o != "node-b" {
		t.Fatalf("the session's owner after the drain: %s\n%s", o, out.String())
	}
	// The move stopped the web server: started again, through the node
	// that no longer holds the session.
	serve(t, a)
	for _, via := range []*node{a, b} {
		if status, body := fetch(t, via); status != 200 || !strings.Contains(body, page) {
			t.Fatalf("the public URL through %s after the move: %d %.300s", via.name, status, body)
		}
	}
	// Still public for the public only: made private, the host name
	// asks for a token again, through either node.
	call(t, a, "get_preview_url", map[string]any{"session": id, "port": 8765, "public": false})
	for _, via := range []*node{a, b} {
		if status, body := fetch(t, via); status != http.StatusUnauthorized || strings.Contains(body, page) {
			t.Fatalf("the URL made private, through %s: %d %.300s", via.name, status, body)
		}
	}
}
