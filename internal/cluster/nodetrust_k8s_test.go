//go:build k8s

package cluster

// Who a node talks to and who talks to it, on a real API server
// (k8stest; skipped without its binaries): the node a caller means, the
// node a callee hears from, and the reads of the Leases a flood of
// unknown certificates cannot hold up. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterNodeTrust ./internal/cluster/

import (
	"context"
	"crypto/tls"
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

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/k8stest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// serveNode serves h on a node port of its own with conf's TLS.
func serveNode(t *testing.T, conf *tls.Config, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ConnContext: NodePortContext, Handler: h}
	go srv.Serve(tls.NewListener(ln, conf))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// importer is a Local that counts the moves it was asked to import.
type importer struct {
	exporter
	imports atomic.Int32
}

func (i *importer) Import(context.Context, string, string, string, io.Reader) (string, int, int64, error) {
	i.imports.Add(1)
	return "", 0, 0, errors.New("not here")
}

func TestClusterNodeTrust(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	key := []byte("0123456789abcdef0123456789abcdef")

	// Node b's Lease names portB, a port whose TLS a subtest swaps;
	// node b's own Router and Drainer serve on bPort with its
	// certificate. Node b's Lease informer can be held (a table that
	// lags the API server).
	portB := serveNodePort(t, nil)
	gB := newGate()
	ntB, err := NewNodeTLS("node-b")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Config: cfg, Namespace: "default", Node: "node-b", Address: portB.addr, TLS: ntB, leaseWatchHook: gB.wrap,
		LeaseTTL: time.Hour}) // live for the whole test: a call for it is made, not refused as for a node that is down
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, Node{}); err != nil {
		t.Fatal(err)
	}
	portB.conf.Store(ntB.ServerConfig())
	var served atomic.Int32
	bRouter := &Router{Table: b, TLS: ntB, Key: key,
		Next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); io.WriteString(w, `{"served":"b"}`) })}
	imp := &importer{}
	bMux := http.NewServeMux()
	bMux.Handle(MovePath, &Drainer{C: b, Member: &Member{C: b}, Local: imp, Key: key, TLS: ntB})
	bMux.Handle("/", bRouter)
	bPort := serveNode(t, ntB.ServerConfig(), bMux)

	a, ntA := tlsNode(t, ctx, cfg, "node-a", serveNodePort(t, nil).addr)
	c, ntC := tlsNode(t, ctx, cfg, "node-c", serveNodePort(t, nil).addr)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	for _, w := range []struct {
		c    *Cluster
		node string
	}{{a, "node-b"}, {a, "node-c"}, {b, "node-a"}, {b, "node-c"}, {c, "node-b"}} {
		if err := w.c.WaitNode(wctx, w.node); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("a call for node b that reaches node e at b's address is unavailable, and e hears nothing", func(t *testing.T) {
		// Node e's pod started with the IP node b had: its Lease names
		// the address, its certificate is its own and pinned, and node
		// a's table still lists node b there. Before, the pin of any
		// node the table lists at the address was enough.
		_, ntE := tlsNode(t, ctx, cfg, "node-e", portB.addr)
		if err := a.WaitNode(wctx, "node-e"); err != nil {
			t.Fatal(err)
		}
		if n, _ := a.Node("node-e"); n.Address != portB.addr || n.Pin != ntE.Pin() {
			t.Fatalf("node a's table has node e at %s pinned %s", n.Address, n.Pin)
		}
		portB.conf.Store(ntE.ServerConfig())
		defer portB.conf.Store(ntB.ServerConfig())
		before := len(portB.requests())

		rt := &Router{Table: a, TLS: ntA, Key: key}
		rt.init()
		defer rt.client.CloseIdleConnections()
		cctx, ccancel := context.WithTimeout(controller.WithCredential(toNode(ctx, "node-b"), "Bearer quro_tenant_token"), time.Minute)
		defer ccancel()
		_, err := rt.forwardCall(cctx, controller.Caller{Tenant: "acme"}, portB.addr, "read_file", json.RawMessage(`{"session":"s1","path":"x"}`))
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.Unavailable || ce.RetryAfter <= 0 {
			t.Fatalf("a call for node b answered by node e: %v (want unavailable with a retry)", err)
		}
		if !strings.Contains(err.Error(), "not node node-b") {
			t.Errorf("the error does not say the routing is stale: %v", err)
		}

		// The same through the proxy every HTTP path takes.
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/v1/sessions/s1/files/x", nil).WithContext(cctx)
		req.Header.Set("Authorization", "Bearer quro_tenant_token")
		rt.forward(w, req, "node-b")
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "not node node-b") {
			t.Fatalf("proxied to node e for node b: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
		}

		// And a drain's move meant for node b.
		d := &Drainer{C: a, TLS: ntA, Key: key, Local: exporter("the workspace's secrets")}
		nb, _ := a.Node("node-b")
		if _, err := d.send(cctx, "s1", &nb, ""); err == nil {
			t.Fatal("the move meant for node b went to node e")
		}
		if got := portB.requests()[before:]; len(got) != 0 {
			t.Fatalf("node e, at node b's address, received %q", got)
		}
	})

	// from is node's client to node b's own port.
	from := func(nt *NodeTLS) *http.Client {
		return &http.Client{Transport: nt.Transport(), Timeout: time.Minute}
	}
	// send sends method path to node b as node from's client with hdr.
	send := func(cl *http.Client, method, path string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(toNode(ctx, "node-b"), method, "https://"+bPort+path, strings.NewReader("{}"))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	t.Run("node c cannot speak as node a, with the cluster's key and its own pinned certificate", func(t *testing.T) {
		asA := (&Router{Table: a, Key: key}).forwardedBy()
		asC := (&Router{Table: c, Key: key}).forwardedBy()
		clA, clC := from(ntA), from(ntC)
		defer clA.CloseIdleConnections()
		defer clC.CloseIdleConnections()

		n0 := served.Load()
		if code, body := send(clC, http.MethodGet, "/v1/sessions/s1/files/x", HeaderForwardedBy, asA); code != http.StatusForbidden || !strings.Contains(body, "another node") {
			t.Fatalf("node c's request as node a: %d %s", code, body)
		}
		if n := served.Load() - n0; n != 0 {
			t.Fatalf("node b served node c's request as node a's (%d)", n)
		}
		// Each as itself is served.
		for what, sent := range map[string]func() (int, string){
			"node a as node a": func() (int, string) {
				return send(clA, http.MethodGet, "/v1/sessions/s1/files/x", HeaderForwardedBy, asA)
			},
			"node c as node c": func() (int, string) {
				return send(clC, http.MethodGet, "/v1/sessions/s1/files/x", HeaderForwardedBy, asC)
			},
		} {
			if code, body := sent(); code != http.StatusOK || !strings.Contains(body, `"b"`) {
				t.Fatalf("%s: %d %s", what, code, body)
			}
		}

		// A move that names node a as its sender, from node c.
		sig := MoveSignature(key, "node-a", "node-b", "s1", time.Now())
		if code, body := send(clC, http.MethodPut, MovePath+"s1", MoveHeader, sig); code != http.StatusForbidden || !strings.Contains(body, "sender") {
			t.Fatalf("node c's move as node a: %d %s", code, body)
		}
		// As itself it gets past who it is (and is refused for the
		// record, which names no one).
		sig = MoveSignature(key, "node-c", "node-b", "s1", time.Now())
		if code, body := send(clC, http.MethodPut, MovePath+"s1", MoveHeader, sig); code != http.StatusForbidden || !strings.Contains(body, "not node-c's to move") {
			t.Fatalf("node c's move as itself: %d %s", code, body)
		}
		if n := imp.imports.Load(); n != 0 {
			t.Fatalf("node b imported %d moves", n)
		}
	})

	t.Run("a flood of unknown certificates does not hold up a new node's first call", func(t *testing.T) {
		// Node b's table stops here: a node that starts now is read from
		// the API server when it first calls.
		gB.hold()
		defer gB.release()
		fctx, fcancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer fcancel()
		var refused atomic.Int32
		flooded := make(chan struct{})
		var once sync.Once
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; fctx.Err() == nil; j++ {
					z, err := NewNodeTLS(fmt.Sprintf("node-z%d-%d", i, j))
					if err != nil {
						return
					}
					conn, err := (&tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, // the flood checks nothing
						Certificates: []tls.Certificate{z.Certificate()}}}).DialContext(fctx, "tcp", bPort)
					if err == nil {
						// TLS 1.3: the server's verdict on the client's
						// certificate comes with the first read.
						_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
						_, err = conn.Read(make([]byte, 1))
						conn.Close()
					}
					if err != nil && fctx.Err() == nil && refused.Add(1) >= 40 {
						once.Do(func() { close(flooded) })
					}
				}
			}()
		}
		select {
		case <-flooded:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		// The flood goes on while node d starts and calls node b.
		_, ntD := tlsNode(t, ctx, cfg, "node-d", serveNodePort(t, nil).addr)
		if _, ok := b.Node("node-d"); ok {
			t.Fatal("node b's table has node d: the test would prove nothing")
		}
		clD := from(ntD)
		defer clD.CloseIdleConnections()
		n0 := served.Load()
		req, _ := http.NewRequestWithContext(toNode(ctx, "node-b"), http.MethodGet, "https://"+bPort+"/v1/sessions", nil)
		resp, err := clD.Do(req)
		if err != nil {
			t.Fatalf("node d's first call, during a flood of %d unknown certificates: %v", refused.Load(), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || served.Load() == n0 {
			t.Fatalf("node d's first call: %d", resp.StatusCode)
		}
	})
	// Last: it leaves a Lease behind. Any node may write Leases (the
	// RBAC grants no resourceNames), so node c writes one of its own that
	// claims node a's name, with node c's pin and address. Listed after
	// node a's real Lease (the API server lists by name), it was read as
	// node a: a peer reading pins then took node c's certificate as node
	// a's. A node is its Lease's name now, the label only agreeing.
	t.Run("a Lease node c writes in node a's name does not make it node a", func(t *testing.T) {
		fake := leaseObject("default", "node-a", c.opts.Address, time.Hour, Node{Pin: ntC.Pin()}, time.Now())
		fake.SetName(LeasePrefix + "zz-node-c")
		if _, err := c.lookups.Resource(LeasesGVR).Namespace("default").Create(ctx, fake, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nodes, err := b.listNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := nodes["node-a"]; got.Pin != ntA.Pin() || got.Address != a.opts.Address {
			t.Fatalf("node b's read of the Leases has node a at %s pinned %s: node c's Lease taken as node a's", got.Address, got.Pin)
		}
		clC := from(ntC)
		defer clC.CloseIdleConnections()
		asA := (&Router{Table: a, Key: key}).forwardedBy()
		if code, body := send(clC, http.MethodGet, "/v1/sessions/s1/files/x", HeaderForwardedBy, asA); code != http.StatusForbidden {
			t.Fatalf("node c's request as node a, with its Lease in node a's name: %d %s", code, body)
		}
	})
}
