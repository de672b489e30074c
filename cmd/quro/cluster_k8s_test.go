//go:build k8s

package main

// Quro nodes on a real Kubernetes API server: etcd and kube-apiserver
// v1.34 started by the test from the binaries make test-k8s builds
// (KUBEBUILDER_ASSETS, else ~/.cache/quro-k8s/v1.34.4/bin); skipped with
// a message when they are absent. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestCluster ./cmd/quro/

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/quro-dev/quro/internal/cluster"
	"github.com/quro-dev/quro/internal/k8stest"
)

// apiServer starts etcd and kube-apiserver for the test, with the
// sessions.quro.dev CRD established (k8stest.APIServer).
func apiServer(t testing.TB) (*rest.Config, string) { return k8stest.APIServer(t) }

func freePort(t testing.TB) int { return k8stest.FreePort(t) }

// quroToken makes a token for the tokens file.
func quroToken() string {
	var id [6]byte
	var sec [32]byte
	rand.Read(id[:])
	rand.Read(sec[:])
	return "quro_" + hex.EncodeToString(id[:]) + "_" + base64.RawURLEncoding.EncodeToString(sec[:])
}

// node is a quro serve in cluster mode.
type node struct {
	name, url string
	data      string // its data directory
	stop      func()
}

func startNode(t testing.TB, name, kubeconfig, tokens string, extra ...string) *node {
	t.Helper()
	data := t.TempDir()
	seedPython(t, data)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	// The node's log, printed when the test fails (or QURO_TEST_NODE_LOGS
	// is set): the only account of its informers (a watch that ended, a
	// relist) and of the calls it served or forwarded.
	logs := &syncBuffer{}
	t.Cleanup(func() { // after the node's stop (cleanups run last first)
		if t.Failed() || os.Getenv("QURO_TEST_NODE_LOGS") != "" {
			b := logs.text()
			if len(b) > 12000 {
				b = "..." + b[len(b)-12000:]
			}
			t.Logf("%s's log ends:\n%s", name, b)
		}
	})
	root := newRoot(strings.NewReader(""), pw, logs)
	root.SetArgs(append([]string{"serve", "--addr", "127.0.0.1:0", "--data", data, "--cluster", "--kubeconfig", kubeconfig,
		"--cluster-namespace", "default", "--node-name", name, "--node-listen", "127.0.0.1:0", "--node-address", "127.0.0.1:0", "--tokens-file", tokens,
		"--spare-sessions", "0", "--prestart-python=false", "--e2b=false", "--log-level", "debug"}, extra...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	stopped := false
	n := &node{name: name, data: data}
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve %s: %v", name, err)
		}
	}
	t.Cleanup(n.stop)
	br := bufio.NewReader(pr)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("serve %s printed no address: %v", name, err)
		}
		if url, ok := strings.CutPrefix(strings.TrimSpace(line), "quro listening on "); ok {
			n.url = url
			break
		}
	}
	go io.Copy(io.Discard, br)
	return n
}

func TestCluster(t *testing.T) {
	cfg, kc := apiServer(t)
	acme, other := quroToken(), quroToken()
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte("# the cluster's tokens\n"+acme+" acme exec\n"+other+" other exec\n"), 0o600)
	a := startNode(t, "node-a", kc, tokens)
	b := startNode(t, "node-b", kc, tokens)
	auth := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

	// Both nodes' Leases are seen by node a before it places anything.
	dyn := dynamic.NewForConfigOrDie(cfg)
	waitLeases(t, dyn, 2)

	// Sessions created through node a land on both nodes.
	owners := map[string]string{} // session ID → node
	var ids []string
	for i := range 6 {
		r := do(t, "POST", a.url+"/v1/sessions", "application/json", fmt.Sprintf(`{"name":"s%d"}`, i), auth(acme)...)
		if r.status != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, r.status, r.body)
		}
		var out struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(r.body), &out); err != nil || out.ID == "" {
			t.Fatalf("create %d: %s", i, r.body)
		}
		u, err := dyn.Resource(cluster.SessionsGVR).Namespace("default").Get(context.Background(), out.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("session %s has no record when its create answered: %v", out.ID, err)
		}
		node, _, _ := unstructured.NestedString(u.Object, "spec", "node")
		owners[out.ID] = node
		ids = append(ids, out.ID)
	}
	count := map[string]int{}
	for _, n := range owners {
		count[n]++
	}
	if count["node-a"] == 0 || count["node-b"] == 0 {
		l, err := dyn.Resource(cluster.LeasesGVR).Namespace("default").List(context.Background(), metav1.ListOptions{})
		for _, it := range l.Items {
			t.Logf("Lease %s: %v %v", it.GetName(), it.GetAnnotations(), it.Object["spec"])
		}
		t.Fatalf("sessions were not spread over both nodes: %v (Leases listed: %v)", count, err)
	}
	t.Logf("placed: %v", count)
	var onB string
	for _, id := range ids {
		if owners[id] == "node-b" {
			onB = id
			break
		}
	}

	t.Run("calls through a node that does not own the session", func(t *testing.T) {
		r := do(t, "PUT", a.url+"/v1/sessions/"+onB+"/files/note.txt", "application/octet-stream", "kept on b", auth(acme)...)
		if r.status/100 != 2 {
			t.Fatalf("write through a: %d %s", r.status, r.body)
		}
		r = do(t, "POST", a.url+"/v1/sessions/"+onB+"/exec", "application/json", `{"command":"cat note.txt; echo; hostname >/dev/null; echo ran-on-owner"}`, auth(acme)...)
		if r.status != 200 || !strings.Contains(r.body, "kept on b") || !strings.Contains(r.body, "ran-on-owner") {
			t.Fatalf("exec through a: %d %s", r.status, r.body)
		}
		// And by its name, which node a resolves for the caller's tenant.
		r = do(t, "GET", a.url+"/v1/sessions/s"+fmt.Sprint(indexOf(ids, onB))+"/files/note.txt", "", "", auth(acme)...)
		var f struct {
			Session, Content string
		}
		if r.status != 200 || json.Unmarshal([]byte(r.body), &f) != nil || f.Content != "kept on b" || f.Session != onB {
			t.Fatalf("read by name through a: %d %s", r.status, r.body)
		}
	})

	t.Run("another tenant cannot reach the session through any node", func(t *testing.T) {
		for _, n := range []*node{a, b} {
			r := do(t, "GET", n.url+"/v1/sessions/"+onB+"/files/note.txt", "", "", auth(other)...)
			if r.status == 200 || strings.Contains(r.body, "kept on b") {
				t.Fatalf("tenant other read acme's file through %s: %d %s", n.name, r.status, r.body)
			}
		}
		r := do(t, "GET", a.url+"/v1/sessions/"+onB+"/files/note.txt", "", "")
		if r.status != http.StatusUnauthorized {
			t.Fatalf("no token through a: %d %s", r.status, r.body)
		}
	})

	t.Run("a forged forwarding header gains nothing", func(t *testing.T) {
		// The header only makes node a answer for itself: it holds no
		// such session, for acme or anyone.
		r := do(t, "GET", a.url+"/v1/sessions/"+onB+"/files/note.txt", "", "",
			append(auth(other), cluster.HeaderForwardedBy, "node-b")...)
		if r.status == 200 || strings.Contains(r.body, "kept on b") {
			t.Fatalf("forged header: %d %s", r.status, r.body)
		}
		r = do(t, "GET", a.url+"/v1/sessions/"+onB+"/files/note.txt", "", "", cluster.HeaderForwardedBy, "node-b")
		if r.status != http.StatusUnauthorized {
			t.Fatalf("forged header without a token: %d %s", r.status, r.body)
		}
	})

	testClusterRoutes(t, a, b, dyn, onB, acme, other)

	t.Run("an owner that is down gives 503 with Retry-After", func(t *testing.T) {
		b.stop()
		req, _ := http.NewRequest("GET", a.url+"/v1/sessions/"+onB+"/files/note.txt", nil)
		req.Header.Set("Authorization", "Bearer "+acme)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("owner down: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	})
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// twoNodes starts nodes a and b of one cluster on a fresh API server,
// both taking the tokens file's lines ("TOKEN TENANT SCOPE\n"...), and
// returns once both hold live Leases; owner is the node a session's
// record names.
// extra are more flags of both nodes' quro serve.
func twoNodes(t testing.TB, tokenLines string, extra ...string) (a, b *node, dyn dynamic.Interface, owner func(id string) string) {
	t.Helper()
	ns, dyn, owner := startNodes(t, []string{"node-a", "node-b"}, tokenLines, extra...)
	return ns[0], ns[1], dyn, owner
}

// startNodes starts the nodes named of one cluster on a fresh API server,
// as twoNodes does.
func startNodes(t testing.TB, names []string, tokenLines string, extra ...string) (ns []*node, dyn dynamic.Interface, owner func(id string) string) {
	t.Helper()
	cfg, kc := apiServer(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tokenLines), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		ns = append(ns, startNode(t, name, kc, tokens, extra...))
	}
	dyn = dynamic.NewForConfigOrDie(cfg)
	waitLeases(t, dyn, len(names))
	owner = func(id string) string {
		u, err := dyn.Resource(cluster.SessionsGVR).Namespace("default").Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("session %s has no record: %v", id, err)
		}
		n, _, _ := unstructured.NestedString(u.Object, "spec", "node")
		return n
	}
	return ns, dyn, owner
}

// waitLeases waits until n node Leases exist.
func waitLeases(t testing.TB, dyn dynamic.Interface, n int) {
	t.Helper()
	leases := dyn.Resource(cluster.LeasesGVR).Namespace("default")
	sel := metav1.ListOptions{LabelSelector: cluster.LabelComponent + "=" + cluster.ComponentNode}
	l, err := leases.List(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) >= n {
		return
	}
	sel.ResourceVersion = l.GetResourceVersion()
	w, err := leases.Watch(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	seen := map[string]bool{}
	for _, it := range l.Items {
		seen[it.GetName()] = true
	}
	for ev := range w.ResultChan() {
		if u, ok := ev.Object.(*unstructured.Unstructured); ok {
			seen[u.GetName()] = true
		}
		if len(seen) >= n {
			return
		}
	}
	t.Fatalf("only %d node Leases", len(seen))
}

// TestClusterUnauthenticatedLookupsAreBounded: a call naming a session
// the node's table lacks is looked up in the API server (a session another
// node created a moment ago), before anyone authenticated. A client with
// no token that names many made-up IDs must not turn each into an API
// server GET: they would queue behind the node's client-side rate limit
// with its Lease renewals and records, and a node whose Lease lapses has
// every tenant's sessions answered 503. The node's API server traffic
// goes through a counting proxy here.
func TestClusterUnauthenticatedLookupsAreBounded(t *testing.T) {
	cfg, _ := apiServer(t)
	target, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	prefix := "flood-"
	var mu sync.Mutex
	gets := 0
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" && strings.Contains(r.URL.Path, "/sessions/"+prefix) {
			mu.Lock()
			gets++
			mu.Unlock()
		}
		r.Header.Set("Authorization", "Bearer "+cfg.BearerToken) // client-go sends no token over plain HTTP
		rp.ServeHTTP(w, r)
	}))
	// After the node's cleanup (cleanups run last first): Close waits for
	// the node's watches through the proxy, which end only with the node.
	t.Cleanup(counting.Close)
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q}}]
users: [{name: t, user: {}}]
contexts: [{name: t, context: {cluster: t, user: t, namespace: default}}]
current-context: t
`, counting.URL)), 0o600)
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte(quroToken()+" acme exec\n"), 0o600)
	n := startNode(t, "node-a", kc, tokens)
	waitLeases(t, dynamic.NewForConfigOrDie(cfg), 1)

	const calls = 60
	var wg sync.WaitGroup
	start := time.Now()
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(fmt.Sprintf("%s/v1/sessions/%s%d/files/x", n.url, prefix, i))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("a call with no token: %d, want 401", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	// The bucket refills while the calls run (on a loaded machine, for
	// seconds): the bound is its burst and what it refilled meanwhile.
	elapsed := time.Since(start)
	bound := cluster.LookupBurst + int(math.Ceil(elapsed.Seconds()*cluster.LookupRate))
	mu.Lock()
	defer mu.Unlock()
	if gets > bound || gets >= calls {
		t.Fatalf("%d calls with no token in %s made %d GETs of the API server (at most %d may)", calls, elapsed, gets, bound)
	}
	t.Logf("%d calls with no token in %s, %d API server GETs (at most %d)", calls, elapsed, gets, bound)
}
