package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress/egresstest"
)

// secretValue is the value of the tests' secret: nothing a box can read
// may hold it.
const secretValue = "sk-test-VALUE-5b1e0c7d"

// secretStandIn is an HTTPS server on the host's loopback with a
// certificate of a test CA for api.test: it answers whether the request
// carried the secret's value (never the value itself), and keeps every
// header value and query it received.
type secretStandIn struct {
	port int
	seen sync.Map
}

func newSecretStandIn(t *testing.T) (*secretStandIn, NetworkOptions) {
	ca, cert := egresstest.CA(t, "api.test")
	s := &secretStandIn{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, vs := range r.Header {
			for _, v := range vs {
				s.seen.Store(v, true)
			}
		}
		s.seen.Store(r.URL.RawQuery, true)
		fmt.Fprintf(w, "api-answer auth-ok=%v query-ok=%v\n", r.Header.Get("Authorization") == "Bearer "+secretValue, r.URL.Query().Get("key") == secretValue)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return s, NetworkOptions{Trusted: []string{fmt.Sprintf("api.test:%d", s.port)}, UpstreamCAs: []*x509.Certificate{ca}}
}

// sawPlaceholder is whether the stand-in ever received a placeholder.
func (s *secretStandIn) sawPlaceholder() bool {
	saw := false
	s.seen.Range(func(k, _ any) bool {
		saw = saw || strings.Contains(k.(string), "quro-secret-")
		return true
	})
	return saw
}

// TestSessionSecrets: a secret set on an internet session reaches the
// stand-in HTTPS server as its value from curl, Python and Node in the
// box (the box trusts the egress's CA through its variables), while
// everything the box can read — the environ of its processes, /proc,
// its files, the server's CA key and secrets key by their host paths —
// holds only the placeholder; a request without the placeholder to the
// intercepted host goes through; the placeholder sent to another host is
// refused, logged and named in the failed run's result; the status shows
// names and hosts, never the value, and the store and audit log hold it
// only sealed; code in the session cannot set a secret; a restart keeps
// the secret; removing it takes the placeholder out of new processes.
func TestSessionSecrets(t *testing.T) {
	t.Parallel()
	st := newStandIn(t)
	st.also("api.test")
	st.also("other.test")
	sec, o := newSecretStandIn(t)
	o.Trusted = append(o.Trusted, fmt.Sprintf("other.test:%d", st.port), fmt.Sprintf("allowed.test:%d", st.port))
	o.Resolve = st.resolve
	dir := t.TempDir()
	a, err := New(context.Background(), dir, &Options{Python: testPython, Network: o})
	if err != nil {
		t.Fatal(err)
	}
	needBoxes(t, a)
	s := newSession(t, a, "secrets", "internet")

	inside := controller.Caller{Path: "insession", Scope: capability.ScopeExec, Session: s.ID}
	if _, err := callAs(t, a, inside, "set_session_secret", SetSecretInput{Name: "API_KEY", Value: "x", Hosts: []string{"evil.test"}}); capCode(err) != capability.PermissionDenied {
		t.Errorf("code in the session set a secret: %v", err)
	}
	for _, bad := range []SetSecretInput{
		{Session: s.ID, Name: "API_KEY", Value: "v"},                                               // no host
		{Session: s.ID, Name: "API_KEY", Value: "v", Hosts: []string{"api.test:443"}},              // a port
		{Session: s.ID, Name: "API_KEY", Value: "v", Hosts: []string{"127.0.0.1"}},                 // an address
		{Session: s.ID, Name: "LD_PRELOAD", Value: "v", Hosts: []string{"api.test"}},               // a name the sandbox refuses
		{Session: s.ID, Name: "SSL_CERT_FILE", Value: "v", Hosts: []string{"api.test"}},            // the server's own
		{Session: s.ID, Name: "API_KEY", Value: "a\r\nX-Injected: 1", Hosts: []string{"api.test"}}, // header injection
	} {
		if _, err := call(t, a, "set_session_secret", bad); capCode(err) != capability.InvalidArgument {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	out := mustCall(t, a, "set_session_secret", SetSecretInput{Session: s.ID, Name: "API_KEY", Value: secretValue, Hosts: []string{"api.test"}}).(*SecretsOutput)
	if len(out.Secrets) != 1 || !strings.HasPrefix(out.Secrets[0].Placeholder, "quro-secret-") || strings.Contains(out.Text(), secretValue) {
		t.Fatalf("set_session_secret: %+v", out)
	}
	ph := out.Secrets[0].Placeholder
	// A resident worker keeps the environment it started with.
	mustCall(t, a, "reset_python", SessionRef{Session: s.ID})

	url := fmt.Sprintf("https://api.test:%d/v1", sec.port)
	for _, run := range []struct{ lang, code string }{
		{"bash", `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" "` + url + `?key=$API_KEY"`},
		{"python", "import os, urllib.request\nr = urllib.request.Request('" + url + "?key=' + os.environ['API_KEY'], headers={'Authorization': 'Bearer ' + os.environ['API_KEY']})\nprint(urllib.request.urlopen(r, timeout=20).read().decode())"},
		// The host userland's python3 with Debian's requests (REQUESTS_CA_BUNDLE).
		{"bash", `/usr/bin/python3 -c "import requests" 2>/dev/null || { echo "api-answer auth-ok=true query-ok=true (no requests)"; exit; }; /usr/bin/python3 -c "import os, requests; print(requests.get('` + url + `', params={'key': os.environ['API_KEY']}, headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}, timeout=20).text)"`},
		{"bash", `node -e "fetch('` + url + `?key=' + process.env.API_KEY, {headers: {Authorization: 'Bearer ' + process.env.API_KEY}}).then(r => r.text()).then(console.log)"`},
	} {
		res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: run.lang, Code: run.code})
		if !strings.Contains(res.Stdout, "api-answer auth-ok=true query-ok=true") {
			t.Errorf("%s did not send the secret: %+v", run.lang, res)
		}
		if strings.Contains(res.Stdout, "(no requests)") {
			t.Log("the host has no python3 with requests: that client is not tried")
		}
	}
	// Without the placeholder the intercepted host is reached as it is.
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: "curl -sS --max-time 20 " + url}); !strings.Contains(res.Stdout, "api-answer auth-ok=false") {
		t.Errorf("a request without the placeholder: %+v", res)
	}
	if sec.sawPlaceholder() {
		t.Error("the stand-in received a placeholder")
	}

	// Everything the box can read holds the placeholder, never the value.
	look := fmt.Sprintf(`echo "env: $API_KEY"; cat /proc/*/environ 2>/dev/null | tr '\0' '\n' | grep -c quro-secret-
grep -sl %[1]q /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | head -3; grep -rsl %[1]q /home/user /tmp /run 2>/dev/null | head -3; echo files-done
for f in %[2]q %[3]q %[4]q; do cat "$f" >/dev/null 2>&1 && echo "READ $f"; done; echo keys-done`,
		secretValue, filepath.Join(dir, "egress", "ca.key"), filepath.Join(dir, "secrets.key"), filepath.Join(dir, "quro.db"))
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: look})
	if strings.Contains(res.Stdout+res.Stderr, secretValue) || !strings.Contains(res.Stdout, "env: "+ph) ||
		strings.Contains(res.Stdout, "READ ") || !strings.Contains(res.Stdout, "keys-done") {
		t.Errorf("what the box reads: %+v", res)
	}
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: "import os; print(os.environ.get('API_KEY'))"})
	if strings.TrimSpace(res.Stdout) != ph {
		t.Errorf("Python's environment: %+v", res)
	}

	// The placeholder to another host: refused, logged, and the failed
	// run says so.
	before := st.hits.Load()
	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: fmt.Sprintf("import os, urllib.request\nurllib.request.urlopen('http://other.test:%d/?k=' + os.environ['API_KEY'], timeout=20)", st.port)})
	if res.ExitCode == 0 || !strings.Contains(res.Text(), "placeholder of secret API_KEY") {
		t.Errorf("the placeholder to other.test: %+v\n%s", res, res.Text())
	}
	if st.hits.Load() != before {
		t.Error("other.test received the placeholder")
	}
	log := mustCall(t, a, "get_egress_log", EgressLogInput{Session: s.ID, Decision: "denied"}).(*EgressLog)
	if !strings.Contains(log.Text(), "other.test") || !strings.Contains(log.Text(), "placeholder of secret API_KEY") || strings.Contains(log.Text(), secretValue) {
		t.Errorf("egress log:\n%s", log.Text())
	}

	// The status shows names and hosts; the store and the audit log never
	// the value.
	info := mustCall(t, a, "get_session_status", SessionRef{Session: s.ID}).(*SessionInfo)
	b, _ := json.Marshal(info)
	if !strings.Contains(string(b), `"name":"API_KEY"`) || !strings.Contains(info.Text(), "secret=API_KEY->api.test") || strings.Contains(string(b), secretValue) {
		t.Errorf("status: %s", b)
	}
	a.Close()
	for _, f := range []string{"quro.db", "quro.db-wal"} {
		if raw, err := os.ReadFile(filepath.Join(dir, f)); err == nil && strings.Contains(string(raw), secretValue) {
			t.Errorf("%s holds the value", f)
		}
	}
	if out, err := exec.Command("sqlite3", filepath.Join(dir, "quro.db"), "SELECT args FROM audit").CombinedOutput(); err == nil && strings.Contains(string(out), secretValue) {
		t.Errorf("the audit log holds the value: %s", out)
	}

	// A restart keeps the secret.
	a, err = New(context.Background(), dir, &Options{Python: testPython, Network: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	// Secrets given at create: the session's first processes see them.
	made := mustCall(t, a, "create_session", CreateSessionInput{Name: "born-with-secret", Network: "internet",
		Secrets: []SecretInput{{Name: "API_KEY", Value: secretValue, Hosts: []string{"*.other.test", "api.test"}}}}).(*SessionInfo)
	if len(made.Secrets) != 1 || strings.Join(made.Secrets[0].Hosts, ",") != "*.other.test,api.test" {
		t.Errorf("create_session's secrets: %+v", made.Secrets)
	}
	if res := runCode(t, a, RunCodeInput{Session: made.ID, Lang: "python", Code: "import os, urllib.request\nprint(urllib.request.urlopen(urllib.request.Request('" + url + "', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}), timeout=20).read().decode())"}); !strings.Contains(res.Stdout, "auth-ok=true") {
		t.Errorf("a secret given at create: %+v", res)
	}
	if _, err := call(t, a, "create_session", CreateSessionInput{Name: "twice", Network: "internet",
		Secrets: []SecretInput{{Name: "A", Value: "v", Hosts: []string{"api.test"}}, {Name: "A", Value: "w", Hosts: []string{"api.test"}}}}); capCode(err) != capability.InvalidArgument {
		t.Errorf("a secret given twice at create: %v", err)
	}

	res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" ` + url})
	if !strings.Contains(res.Stdout, "auth-ok=true") {
		t.Errorf("after a restart: %+v", res)
	}
	// Removed: new processes no longer see it.
	out = mustCall(t, a, "set_session_secret", SetSecretInput{Session: s.ID, Name: "API_KEY"}).(*SecretsOutput)
	if len(out.Secrets) != 0 {
		t.Errorf("removed: %+v", out)
	}
	if res = runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: `echo "[$API_KEY]"`}); !strings.Contains(res.Stdout, "[]") {
		t.Errorf("after removal: %+v", res)
	}
}
