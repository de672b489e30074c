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
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeTLS is a node's identity on the node port, where the nodes talk to
// each other (forwarded calls with the tenant's token and bodies, a
// drain's move stream with workspaces and secrets, the merged events and
// audit): mutual TLS without a CA. Each node makes a key pair and a
// self-signed certificate when it starts (the private key never leaves
// its memory) and publishes the certificate's SHA-256 (its pin) in its
// Lease (AnnotPin); the API server is the trusted party. A caller checks
// the callee's certificate against the pin of the node the table lists at
// the address it dialed; the callee checks the caller's client
// certificate against the pin of the node it names (its CommonName).
// Nothing is trusted because it is presented: a certificate whose pin no
// Lease publishes is refused on either side. A node that restarts makes
// a new key, and its Lease's pin rotates with it; a peer whose table still
// has the old pin reads the Lease from the API server once (bounded by
// pinReadRate) before it refuses.
type NodeTLS struct {
	cert tls.Certificate
	pin  string
	c    *Cluster // set by New (Options.TLS)
	// Reads of a peer's Lease when the table's pin does not match: the
	// caller waits for its turn (it dials for an authenticated call);
	// the callee reads only while the bound allows it at once (anyone
	// can open a connection to the node port).
	dialReads, acceptReads *rate.Limiter
}

// pinReadRate and pinReadBurst bound NodeTLS's reads of Leases.
const (
	pinReadRate  = 2 // per second
	pinReadBurst = 10
)

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
	return &NodeTLS{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pin: Pin(der),
		dialReads:   rate.NewLimiter(pinReadRate, pinReadBurst),
		acceptReads: rate.NewLimiter(pinReadRate, pinReadBurst)}, nil
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
	name, pin := cert.Subject.CommonName, Pin(cert.Raw)
	if !validObjectName(name) {
		return errors.New("cluster: a client certificate that names no node")
	}
	if n, ok := t.c.Node(name); ok && n.Pin == pin {
		return nil
	}
	if !t.acceptReads.Allow() {
		return fmt.Errorf("cluster: node %s's client certificate is not the one its Lease publishes (in this node's table)", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := t.readNode(ctx, name)
	if err != nil {
		return fmt.Errorf("cluster: node %s's Lease could not be read: %w", name, err)
	}
	if n == nil || n.Pin != pin {
		return fmt.Errorf("cluster: node %s's client certificate is not the one its Lease publishes", name)
	}
	return nil
}

// checkServer accepts the certificate of the node at addr when the Lease
// of a node the table lists at addr publishes its pin.
func (t *NodeTLS) checkServer(ctx context.Context, addr string, cert *x509.Certificate) error {
	pin := Pin(cert.Raw)
	var names []string
	for _, n := range t.c.Nodes() {
		if n.Address != addr {
			continue
		}
		if n.Pin == pin {
			return nil
		}
		names = append(names, n.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("cluster: no node's Lease names the address %s", addr)
	}
	// The table's pin may be the one before the node restarted.
	for _, name := range names {
		if err := t.dialReads.Wait(ctx); err != nil {
			return err
		}
		n, err := t.readNode(ctx, name)
		if err != nil {
			return fmt.Errorf("cluster: node %s's Lease could not be read: %w", name, err)
		}
		if n != nil && n.Address == addr && n.Pin == pin {
			return nil
		}
	}
	return fmt.Errorf("cluster: the certificate at %s is not the one the Lease of the node there publishes", addr)
}

// readNode reads node name's Lease from the API server (nil, nil: none).
func (t *NodeTLS) readNode(ctx context.Context, name string) (*Node, error) {
	u, err := t.c.lookups.Resource(LeasesGVR).Namespace(t.c.opts.Namespace).Get(ctx, LeasePrefix+name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	n, ok := nodeFromLease(u)
	if !ok || n.Name != name {
		return nil, nil
	}
	return &n, nil
}

// Transport is the HTTP transport of node traffic: each connection's
// TLS is this node's client certificate, and the callee's certificate is
// checked against the pins (checkServer). HTTP/1.1 (WebSocket upgrades
// are forwarded over it).
func (t *NodeTLS) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = false
	tr.TLSClientConfig = nil
	tr.Proxy = nil // node to node, never through the environment's proxy
	tr.DialTLSContext = t.dialTLS
	return tr
}

// dialTLS dials the node at addr and checks its certificate.
func (t *NodeTLS) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
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
			return t.checkServer(ctx, addr, cs.PeerCertificates[0])
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
	on, _ := r.Context().Value(nodePortKey{}).(bool)
	return on && r.TLS != nil && len(r.TLS.PeerCertificates) > 0
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
