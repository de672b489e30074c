package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync"
	"time"
)

// NodeTLS is a node's identity on the node port, where the nodes talk to
// each other (forwarded calls with the tenant's token and bodies, a
// drain's move stream with workspaces and secrets, the merged events and
// audit): mutual TLS without a CA. Each node makes a key pair and a
// self-signed certificate when it starts (the private key never leaves
// its memory) and publishes the certificate's SHA-256 (its pin) in its
// Lease (AnnotPin); the API server is the trusted party. A caller names
// the node it means to reach (toNode: a session's owner, a drain's
// target) and checks the callee's certificate against that node's pin,
// whatever the address: a node at an address another node had (a pod
// restarted with another's IP, a table that lags) is not the one meant,
// and the call is unavailable, never answered by the wrong node. The
// callee checks the caller's client certificate against the pin of the
// node it names (its CommonName), and a request is then taken only as
// from that node (PeerNode): a node's header or a move that claims
// another sender is refused. Nothing is trusted because it is presented:
// a certificate whose pin no Lease publishes is refused on either side.
// A node that restarts makes a new key, and its Lease's pin rotates with
// it; a peer whose table still has the old pin waits for a read of the
// Leases from the API server (pinReads) before it refuses.
type NodeTLS struct {
	cert  tls.Certificate
	pin   string
	c     *Cluster // set by New (Options.TLS)
	reads pinReads
}

// pinReadEvery spaces NodeTLS's reads of the Leases (pinReads).
const pinReadEvery = 500 * time.Millisecond

// pinReadWait bounds a handshake's wait for a read of the Leases.
const pinReadWait = 10 * time.Second

// NewNodeTLS makes node's key pair (ECDSA P-256) and its self-signed
// certificate, named node, for New (Options.TLS).
func NewNodeTLS(node string) (*NodeTLS, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node},
		// The pin is the trust, not the dates: the key lives as long as
		// the node's process.
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.AddDate(100, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	t := &NodeTLS{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pin: Pin(der)}
	t.reads.every = pinReadEvery
	t.reads.list = func(ctx context.Context) (map[string]Node, error) { return t.c.listNodes(ctx) }
	return t, nil
}

// Pin is a certificate's pin: the SHA-256 of its DER, in hex.
func Pin(der []byte) string {
	h := sha256.Sum256(der)
	return hex.EncodeToString(h[:])
}

// Certificate is this node's key pair and certificate (the same on both
// sides of node traffic).
func (t *NodeTLS) Certificate() tls.Certificate { return t.cert }

// Pin is this node's pin, published in its Lease.
func (t *NodeTLS) Pin() string { return t.pin }

// ServerConfig is the node port's TLS: TLS 1.3, a client certificate
// required and checked against the pin its node's Lease publishes.
func (t *NodeTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		ClientAuth:   tls.RequireAnyClientCert, // checked against the pins (VerifyConnection), not a CA
		// No resumption: each connection's handshake meets the pin check
		// (Go checks a resumed one again, but none is then to be had).
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cluster: the node port takes a node's client certificate only")
			}
			return t.checkClient(cs.PeerCertificates[0])
		},
	}
}

// checkClient accepts a client certificate whose pin the Lease of the
// node it names publishes.
func (t *NodeTLS) checkClient(cert *x509.Certificate) error {
	name := cert.Subject.CommonName
	if !validObjectName(name) {
		return errors.New("cluster: a client certificate that names no node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), pinReadWait)
	defer cancel()
	if err := t.checkPin(ctx, name, cert); err != nil {
		return fmt.Errorf("cluster: node %s's client certificate: %w", name, err)
	}
	return nil
}

// checkServer accepts the certificate of the node at addr when it is
// the one the Lease of node, the node the caller means, publishes.
func (t *NodeTLS) checkServer(ctx context.Context, node, addr string, cert *x509.Certificate) error {
	if err := t.checkPin(ctx, node, cert); err != nil {
		return fmt.Errorf("cluster: the node at %s is not node %s (%w): the routing to it is stale", addr, node, err)
	}
	return nil
}

// checkPin reports whether cert is the one node's Lease pins: in the
// table, else in a read of the Leases that began after the check did
// (the table's pin may be the one before the node restarted, or the
// node too new for the table).
func (t *NodeTLS) checkPin(ctx context.Context, node string, cert *x509.Certificate) error {
	pin := Pin(cert.Raw)
	if n, ok := t.c.Node(node); ok && n.Pin == pin {
		return nil
	}
	nodes, err := t.reads.after(ctx, time.Now())
	if err != nil {
		return fmt.Errorf("the Leases could not be read: %w", err)
	}
	n, ok := nodes[node]
	switch {
	case !ok:
		return errors.New("no Lease names that node")
	case n.Pin != pin:
		return errors.New("its certificate is not the one the node's Lease publishes")
	}
	return nil
}

// pinReads reads every node's Lease from the API server for the checks
// whose pin the table lacks, one List for all of them: a check waits for
// a read that began after it did, and reads begin at most every apart.
// However many certificates of unknown nodes arrive at once (anyone can
// open a connection to the node port), the API server sees one List per
// period, and a real node's first handshake waits at most a period and a
// List, which a flood of others shares and cannot hold up.
type pinReads struct {
	every time.Duration
	list  func(context.Context) (map[string]Node, error)

	mu   sync.Mutex
	last *pinRead // the latest read, begun, done or due
}

// pinRead is one List of the Leases, due at start.
type pinRead struct {
	start time.Time
	done  chan struct{}
	nodes map[string]Node
	err   error
}

// after waits for a read of the Leases that began at or after at (a new
// one, due a period after the last, when none has) and returns its nodes.
func (p *pinReads) after(ctx context.Context, at time.Time) (map[string]Node, error) {
	p.mu.Lock()
	rd := p.last
	if rd == nil || rd.start.Before(at) {
		start := at
		if rd != nil {
			start = later(start, rd.start.Add(p.every))
		}
		rd = &pinRead{start: start, done: make(chan struct{})}
		p.last = rd
		go p.read(rd)
	}
	p.mu.Unlock()
	select {
	case <-rd.done:
		return rd.nodes, rd.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// read lists the Leases for rd once its time has come.
func (p *pinReads) read(rd *pinRead) {
	defer close(rd.done)
	if d := time.Until(rd.start); d > 0 {
		tm := time.NewTimer(d)
		<-tm.C
	}
	ctx, cancel := context.WithTimeout(context.Background(), pinReadWait)
	defer cancel()
	rd.nodes, rd.err = p.list(ctx)
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// toNodeKey names, in a request's context, the node it is meant for.
type toNodeKey struct{}

// toNode marks ctx's requests as meant for node: Transport checks that
// the node it reaches is that one.
func toNode(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, toNodeKey{}, node)
}

// Transport is the HTTP transport of node traffic: each request goes to
// the node its context names (toNode; a request that names none is
// refused), over connections of that node's own, whose TLS is this
// node's client certificate and whose callee's certificate is checked
// against that node's pin (checkServer): a connection is never shared
// by two nodes that had the same address. HTTP/1.1 (WebSocket upgrades
// are forwarded over it).
func (t *NodeTLS) Transport() http.RoundTripper {
	return &nodeTransport{t: t, by: map[string]*http.Transport{}}
}

// nodeTransport is Transport: an http.Transport by node, those of nodes
// the table no longer lists dropped as another is made.
type nodeTransport struct {
	t  *NodeTLS
	mu sync.Mutex
	by map[string]*http.Transport
}

func (nt *nodeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	node, _ := r.Context().Value(toNodeKey{}).(string)
	if node == "" {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New("cluster: a request of node traffic that names no node")
	}
	return nt.of(node).RoundTrip(r)
}

// of is node's transport.
func (nt *nodeTransport) of(node string) *http.Transport {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if tr := nt.by[node]; tr != nil {
		return tr
	}
	if len(nt.by) > 0 {
		listed := map[string]bool{}
		for _, n := range nt.t.c.Nodes() {
			listed[n.Name] = true
		}
		for name, tr := range nt.by {
			if !listed[name] {
				tr.CloseIdleConnections()
				delete(nt.by, name)
			}
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = false
	tr.TLSClientConfig = nil
	tr.Proxy = nil // node to node, never through the environment's proxy
	tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nt.t.dialTLS(ctx, node, network, addr)
	}
	nt.by[node] = tr
	return tr
}

// CloseIdleConnections closes every node's idle connections.
func (nt *nodeTransport) CloseIdleConnections() {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	for _, tr := range nt.by {
		tr.CloseIdleConnections()
	}
}

// dialTLS dials node at addr and checks its certificate.
func (t *NodeTLS) dialTLS(ctx context.Context, node, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.cert},
		// No CA and no name: the callee's certificate is checked against
		// the pin its Lease publishes (VerifyConnection), which is
		// stricter than any chain.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cluster: the node at " + addr + " presented no certificate")
			}
			return t.checkServer(ctx, node, addr, cs.PeerCertificates[0])
		},
	}
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// nodePortKey marks a request that came over the node port.
type nodePortKey struct{}

// NodePortContext is the node port's server's ConnContext: a request on
// it came from a node whose client certificate its Lease pins.
func NodePortContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, nodePortKey{}, true)
}

// fromNode reports whether r came over the node port, from a node whose
// client certificate was checked (NodePortContext, ServerConfig).
func fromNode(r *http.Request) bool {
	return PeerNode(r) != ""
}

// PeerNode is the node r came from: the name its client certificate
// bears, which the Lease of that node pins (ServerConfig checked it, and
// the handshake proved the key), on a request that came over the node
// port; "" for any other request. A node's claim of who it is (its
// HeaderForwardedBy, a move's sender) holds only when it is this name.
func PeerNode(r *http.Request) string {
	on, _ := r.Context().Value(nodePortKey{}).(bool)
	if !on || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return r.TLS.PeerCertificates[0].Subject.CommonName
}

// scheme is the URL scheme of node traffic: "https" (or "wss" for ws)
// with t, else plain.
func (t *NodeTLS) scheme(plain string) string {
	if t == nil {
		return plain
	}
	if plain == "ws" {
		return "wss"
	}
	return "https"
}
