//go:build k8s

package main

// An E2B sandbox moved by a drain keeps the access token it was given
// (the harness of cluster_k8s_test.go): the envdAccessToken, and the
// signed /files URLs made with it, are derived from the cluster's E2B key
// (the Secret quro-e2b-key), not from a key of the node that made them,
// so they open the sandbox on the node it moved to, through either node.
// Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterE2BAfterDrain ./cmd/quro/

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/e2b"
)

func TestClusterE2BAfterDrain(t *testing.T) {
	acme, other, admin := quroToken(), quroToken(), quroToken()
	a, b, _, owner := twoNodes(t, acme+" acme exec\n"+other+" other exec\n"+admin+" - admin\n", "--e2b=true")
	type sandbox struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	// Sandboxes through node a until one is node a's: the node drained.
	// An hour's lifetime: E2B's default, 15 s, ended the sandbox during
	// the drain at a load of 100.
	var sb sandbox
	for i := 0; sb.SandboxID == ""; i++ {
		if i == 10 {
			t.Fatal("10 sandboxes, none on node-a")
		}
		r := do(t, "POST", a.url+"/e2b/sandboxes", "application/json", `{"templateID":"base","timeout":3600}`, "X-API-Key", acme)
		var got sandbox
		if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &got) != nil || got.SandboxID == "" || got.EnvdAccessToken == "" {
			t.Fatalf("create a sandbox: %d %s", r.status, r.body)
		}
		if owner(got.SandboxID) == "node-a" {
			sb = got
		}
	}
	const file = "/home/user/kept.txt"
	body, _ := json.Marshal(map[string]any{"command": "echo kept-9c1d > " + file})
	if r := do(t, "POST", a.url+"/v1/sessions/"+sb.SandboxID+"/exec", "application/json", string(body), "Authorization", "Bearer "+acme); r.status != 200 {
		t.Fatalf("write the file: %d %s", r.status, r.body)
	}
	get := func(t *testing.T, u string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(rb)
	}
	// envd's download with the sandbox's headers and access token, as the
	// SDKs send it under E2B_SANDBOX_URL.
	envd := func(t *testing.T, n *node, token string) (int, string) {
		return get(t, n.url+"/files?"+url.Values{"path": {file}}.Encode(),
			e2b.HeaderSandboxID, sb.SandboxID, e2b.HeaderSandboxPort, strconv.Itoa(e2b.EnvdPort), "X-Access-Token", token)
	}
	// A signed download URL (the SDK's downloadUrl): it names no sandbox.
	signed := func(t *testing.T, n *node, token string) (int, string) {
		sum := sha256.Sum256([]byte(file + ":read::" + token))
		return get(t, n.url+"/files?"+url.Values{"path": {file}, "signature": {"v1_" + base64.RawStdEncoding.EncodeToString(sum[:])}}.Encode())
	}
	uses := func(t *testing.T, when string) {
		t.Helper()
		for _, n := range []*node{a, b} {
			if status, got := envd(t, n, sb.EnvdAccessToken); status != 200 || got != "kept-9c1d\n" {
				t.Fatalf("%s: the access token through %s: %d %q", when, n.name, status, got)
			}
			if status, got := signed(t, n, sb.EnvdAccessToken); status != 200 || got != "kept-9c1d\n" {
				t.Fatalf("%s: a signed URL through %s: %d %q", when, n.name, status, got)
			}
		}
	}
	uses(t, "before the drain")

	r := do(t, "POST", a.url+DrainPath, "", "", "Authorization", "Bearer "+admin)
	if r.status != 200 || !strings.Contains(r.body, `"done":true`) || !strings.Contains(r.body, sb.SandboxID) {
		t.Fatalf("drain node a: %d %s", r.status, r.body)
	}
	if o := owner(sb.SandboxID); o != "node-b" {
		t.Fatalf("the sandbox is %s's after the drain", o)
	}
	uses(t, "after the drain")

	// connect on the node it moved to hands out the same token.
	r = do(t, "POST", b.url+"/e2b/sandboxes/"+sb.SandboxID+"/connect", "application/json", `{"timeout":300}`, "X-API-Key", acme)
	var again sandbox
	if r.status/100 != 2 || json.Unmarshal([]byte(r.body), &again) != nil || again.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("connect after the drain: %d %s (the token was %q)", r.status, r.body, sb.EnvdAccessToken)
	}
	// Still the sandbox's own, and its tenant's: a guess, another
	// tenant's key or token, open nothing through either node.
	for _, n := range []*node{a, b} {
		for name, tok := range map[string]string{"a guess": "qa_guess", "another tenant's key": other,
			"a token of another sandbox": strings.Replace(sb.EnvdAccessToken, "qa_", "qa_0", 1)} {
			if status, got := envd(t, n, tok); status != http.StatusUnauthorized || strings.Contains(got, "kept-9c1d") {
				t.Errorf("%s through %s: %d %q", name, n.name, status, got)
			}
			if status, got := signed(t, n, tok); status != http.StatusUnauthorized || strings.Contains(got, "kept-9c1d") {
				t.Errorf("a URL signed with %s through %s: %d %q", name, n.name, status, got)
			}
		}
	}
}
