//go:build k8s

package cluster

// Node traffic over mutual TLS, the pins in the nodes' Leases on a real
// API server (k8stest; skipped without its binaries). Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterNodeTLS ./internal/cluster/

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/k8stest"
)

// nodePort is a node port as cmd/quro serves it: TLS by the config conf
// returns at each handshake (a test swaps in an impostor's), requests
// counted with what they carried.
type nodePort struct {
	addr string
	conf atomic.Pointer[tls.Config]
	mu   sync.Mutex
	seen []string // each request's Authorization, and whether it came from a node
	body []string // what each request sent
}

func serveNodePort(t *testing.T, conf *tls.Config) *nodePort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &nodePort{addr: ln.Addr().String()}
	p.conf.Store(conf)
	srv := &http.Server{ConnContext: NodePortContext,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			p.mu.Lock()
			from := "client"
			if fromNode(r) {
				from = "node"
			}
			p.seen = append(p.seen, r.Header.Get("Authorization")+" "+from)
			p.body = append(p.body, string(b))
			p.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"served":"here"}`)
		})}
	tl := tls.NewListener(ln, &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return p.conf.Load(), nil }})
	go srv.Serve(tl)
	t.Cleanup(func() { srv.Close() })
	return p
}

func (p *nodePort) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

func (p *nodePort) bodies() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.body...)
}

// impostor is the TLS of a listener with a certificate of its own making
// that takes any client (it wants the token, not the caller).
func impostor(t *testing.T, node string) *tls.Config {
	t.Helper()
	fake, err := NewNodeTLS(node)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{fake.Certificate()}, ClientAuth: tls.RequestClientCert}
}

// tlsNode is a Cluster with a NodeTLS whose Lease is written.
func tlsNode(t *testing.T, ctx context.Context, cfg *rest.Config, name, addr string) (*Cluster, *NodeTLS) {
	t.Helper()
	nt, err := NewNodeTLS(name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Config: cfg, Namespace: "default", Node: name, Address: addr, TLS: nt})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Heartbeat(ctx, Node{}); err != nil {
		t.Fatal(err)
	}
	return c, nt
}

func TestClusterNodeTLS(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// Node b's port is up before its Lease names it.
	var bConf atomic.Pointer[tls.Config]
	portB := serveNodePort(t, nil)
	b, ntB := tlsNode(t, ctx, cfg, "node-b", portB.addr)
	bConf.Store(ntB.ServerConfig())
	portB.conf.Store(bConf.Load())
	portA := serveNodePort(t, nil)
	a, ntA := tlsNode(t, ctx, cfg, "node-a", portA.addr)
	portA.conf.Store(ntA.ServerConfig())
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := a.WaitNode(wctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitNode(wctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Node("node-b"); n.Pin != ntB.Pin() || n.Pin == "" {
		t.Fatalf("node b's Lease in a's table pins %q, its certificate is %q", n.Pin, ntB.Pin())
	}

	const token = "Bearer quro_secret_of_the_tenant"
	// call forwards read_file from node a to node b at addr, with the
	// tenant's token, through a Router of its own (no connection kept
	// from an earlier subtest).
	call := func(addr string) (json.RawMessage, error) {
		rt := &Router{Table: a, TLS: ntA}
		rt.init()
		defer rt.client.CloseIdleConnections()
		cctx, ccancel := context.WithTimeout(controller.WithCredential(toNode(ctx, "node-b"), token), time.Minute)
		defer ccancel()
		return rt.forwardCall(cctx, controller.Caller{Tenant: "acme"}, addr, "read_file", json.RawMessage(`{"session":"s1","path":"x"}`))
	}

	t.Run("a call goes over mutual TLS to the pinned node", func(t *testing.T) {
		before := len(portB.requests())
		out, err := call(portB.addr)
		if err != nil || !strings.Contains(string(out), "here") {
			t.Fatalf("forwarded: %s %v", out, err)
		}
		got := portB.requests()[before:]
		if len(got) != 1 || got[0] != token+" node" {
			t.Fatalf("node b saw %q (want the token, from a node)", got)
		}
	})

	t.Run("a listener on the node's address with a self-made certificate receives no token", func(t *testing.T) {
		portB.conf.Store(impostor(t, "node-b"))
		defer portB.conf.Store(bConf.Load())
		before := len(portB.requests())
		_, err := call(portB.addr)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.Unavailable {
			t.Fatalf("forwarding to the impostor: %v (want unavailable)", err)
		}
		if got := portB.requests()[before:]; len(got) != 0 {
			t.Fatalf("the impostor received %q", got)
		}
	})

	t.Run("the move stream is refused to an unpinned receiver", func(t *testing.T) {
		portB.conf.Store(impostor(t, "node-b"))
		defer portB.conf.Store(bConf.Load())
		before := len(portB.bodies())
		d := &Drainer{C: a, TLS: ntA, Key: make([]byte, 32), Local: exporter("the workspace's secrets")}
		nb, _ := a.Node("node-b")
		sctx, scancel := context.WithTimeout(ctx, time.Minute)
		defer scancel()
		if _, err := d.send(sctx, "s1", &nb, ""); err == nil {
			t.Fatal("the move went to the impostor")
		}
		for _, b := range portB.bodies()[before:] {
			if strings.Contains(b, "secrets") {
				t.Fatalf("the impostor received the workspace: %q", b)
			}
		}
		if got := portB.bodies()[before:]; len(got) != 0 {
			t.Fatalf("the impostor received %d requests", len(got))
		}
	})

	// dialB is a client of node b's port with cert (none when nil).
	dialB := func(cert *tls.Certificate) error {
		conf := &tls.Config{InsecureSkipVerify: true} // this test checks the server's side alone
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: time.Minute}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + portB.addr + "/v1/sessions")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}

	t.Run("a client without a pinned certificate is refused at the node port", func(t *testing.T) {
		self, err := NewNodeTLS("node-a") // named as a node, pinned by no Lease
		if err != nil {
			t.Fatal(err)
		}
		selfCert := self.Certificate()
		unknown, _ := NewNodeTLS("node-z") // a node no Lease names
		unknownCert := unknown.Certificate()
		before := len(portB.requests())
		for what, cert := range map[string]*tls.Certificate{"no certificate": nil, "a self-made one named node-a": &selfCert,
			"one of a node without a Lease": &unknownCert} {
			if err := dialB(cert); err == nil {
				t.Errorf("%s: served", what)
			}
		}
		if got := portB.requests()[before:]; len(got) != 0 {
			t.Fatalf("node b served %q", got)
		}
		aCert := ntA.Certificate()
		if err := dialB(&aCert); err != nil {
			t.Fatalf("node a's own certificate: %v", err)
		}
	})

	t.Run("a pin rotates when a node restarts with a new key", func(t *testing.T) {
		// Node b starts again: a new key, its Lease's pin replaced. Node
		// a's table may still hold the old one: it reads the Lease again.
		b2, ntB2 := tlsNode(t, ctx, cfg, "node-b", portB.addr)
		_ = b2
		if ntB2.Pin() == ntB.Pin() {
			t.Fatal("the new key's pin is the old one's")
		}
		portB.conf.Store(ntB2.ServerConfig())
		bConf.Store(ntB2.ServerConfig())
		if out, err := call(portB.addr); err != nil || !strings.Contains(string(out), "here") {
			t.Fatalf("forwarded to the restarted node: %s %v", out, err)
		}
		// The old key is no one's now: a listener that presents it (a
		// copy of the old process's key) is refused, as a client too.
		portB.conf.Store(ntB.ServerConfig())
		before := len(portB.requests())
		if _, err := call(portB.addr); err == nil {
			t.Fatal("node a accepted the old certificate")
		}
		if got := portB.requests()[before:]; len(got) != 0 {
			t.Fatalf("the old key's listener received %q", got)
		}
		portB.conf.Store(ntB2.ServerConfig())
		old := ntB.Certificate()
		if err := dialB(&old); err == nil {
			t.Fatal("node b's old client certificate was served")
		}
	})
}

// exporter is a Local whose Export writes data.
type exporter string

func (e exporter) Quiesce(context.Context, string) error { return nil }
func (e exporter) Unquiesce(string)                      {}
func (e exporter) Export(_ context.Context, _ string, w io.Writer) error {
	_, err := io.WriteString(w, string(e))
	return err
}
func (e exporter) Release(context.Context, string) error { return nil }
func (e exporter) Size(context.Context, string) (int64, error) {
	return int64(len(e)), nil
}
func (e exporter) Admit(context.Context, string, int64) error { return nil }
func (e exporter) Import(context.Context, string, string, string, io.Reader) (string, int, int64, error) {
	return "", 0, 0, errors.New("not here")
}
