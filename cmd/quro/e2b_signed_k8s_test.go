//go:build k8s

package main

// E2B's signed /files URLs through a node that does not hold the
// sandbox (the harness of cluster_k8s_test.go). With E2B_SANDBOX_URL the
// SDKs' uploadUrl and downloadUrl name no sandbox: only the signature,
// made with the sandbox's access token, says whose it is. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterE2BSignedFiles ./cmd/quro/

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestClusterE2BSignedFiles(t *testing.T) {
	acme, other := quroToken(), quroToken()
	a, b, _, owner := twoNodes(t, acme+" acme exec\n"+other+" other exec\n", "--e2b=true")
	sign := func(path, op, token string) string {
		sum := sha256.Sum256([]byte(path + ":" + op + "::" + token))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	// A sandbox made through node a, wherever it is placed; the calls
	// below go through the node that does not hold it. An hour's
	// lifetime: E2B's default, 15 s, ended it mid-test at a load of 100.
	r := do(t, "POST", a.url+"/e2b/sandboxes", "application/json", `{"templateID":"base","timeout":3600}`, "X-API-Key", acme)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &sb) != nil || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("create a sandbox: %d %s", r.status, r.body)
	}
	holder, via := a, b
	if owner(sb.SandboxID) == "node-b" {
		holder, via = b, a
	}
	t.Logf("sandbox %s on %s, signed URLs through %s", sb.SandboxID, holder.name, via.name)
	body, _ := json.Marshal(map[string]any{"command": "echo content-0f7e > /home/user/hello.txt"})
	if r := do(t, "POST", via.url+"/v1/sessions/"+sb.SandboxID+"/exec", "application/json", string(body), "Authorization", "Bearer "+acme); r.status != 200 {
		t.Fatalf("write the file: %d %s", r.status, r.body)
	}
	const file = "/home/user/hello.txt"
	read := func(n *node, q url.Values) (int, string) {
		t.Helper()
		resp, err := http.Get(n.url + "/files?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, n := range []*node{via, holder} {
		if status, got := read(n, url.Values{"path": {file}, "signature": {sign(file, "read", sb.EnvdAccessToken)}}); status != 200 || got != "content-0f7e\n" {
			t.Fatalf("a signed read through %s: %d %q", n.name, status, got)
		}
	}
	// The signature is checked as ever, by the node that holds the
	// sandbox: a forged one, another path, a write signature for a read,
	// or a token that is not the sandbox's open nothing through either.
	for name, q := range map[string]url.Values{
		"forged":          {"path": {file}, "signature": {sign(file, "read", "qa_guess")}},
		"another path":    {"path": {"/home/user/.bashrc"}, "signature": {sign(file, "read", sb.EnvdAccessToken)}},
		"write signature": {"path": {file}, "signature": {sign(file, "write", sb.EnvdAccessToken)}},
		"another tenant":  {"path": {file}, "signature": {sign(file, "read", other)}},
	} {
		for _, n := range []*node{via, holder} {
			if status, got := read(n, q); status != http.StatusUnauthorized || strings.Contains(got, "content-0f7e") {
				t.Errorf("%s through %s: %d %q", name, n.name, status, got)
			}
		}
	}
	// A signed upload through the other node lands in the sandbox.
	const up = "/home/user/up.txt"
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	pw, _ := mw.CreateFormFile("file", "up.txt")
	pw.Write([]byte("uploaded through " + via.name))
	mw.Close()
	q := url.Values{"path": {up}, "signature": {sign(up, "write", sb.EnvdAccessToken)}}
	resp, err := http.Post(via.url+"/files?"+q.Encode(), mw.FormDataContentType(), &form)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a signed upload through %s: %d %s", via.name, resp.StatusCode, got)
	}
	if status, got := read(holder, url.Values{"path": {up}, "signature": {sign(up, "read", sb.EnvdAccessToken)}}); status != 200 || got != "uploaded through "+via.name {
		t.Fatalf("the signed upload: %d %q", status, got)
	}
}
