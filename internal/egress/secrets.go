package egress

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PlaceholderPrefix starts every secret's placeholder: what a box sees in
// place of the value.
const PlaceholderPrefix = "quro-secret-"

// Secret is a value a box never sees: its environment holds Placeholder,
// and the egress writes Value in its place only in requests to Hosts,
// refusing a request that carries the placeholder anywhere else.
type Secret struct {
	Name        string
	Placeholder string
	Value       string
	Hosts       []Rule // domain rules (exact or "*."), any port
}

// ParseSecretHost parses one of a secret's hosts: a domain, or "*." and a
// domain (any subdomain of it), no port nor address.
func ParseSecretHost(s string) (Rule, error) {
	r, err := ParseRule(s)
	if err != nil {
		return Rule{}, err
	}
	if r.Domain == "" || r.Port != 0 {
		return Rule{}, fmt.Errorf("host %q: a secret's host is a domain (api.example.com) or a wildcard (*.example.com), without a port or an address", truncate(s, 80))
	}
	if r.Wildcard && !strings.Contains(r.Domain, ".") {
		// *.com would send the value to every host under a top-level
		// domain, any attacker's among them.
		return Rule{}, fmt.Errorf("host %q: a wildcard over a top-level domain; name the domain (*.example.com)", truncate(s, 80))
	}
	return r, nil
}

// sentTo is whether s may be sent to the host name.
func (s *Secret) sentTo(name string) bool {
	for _, r := range s.Hosts {
		if r.matchName(name, 0) {
			return true
		}
	}
	return false
}

func (s *Secret) hostList() string {
	hs := make([]string, len(s.Hosts))
	for i, r := range s.Hosts {
		hs[i] = r.String()
	}
	return strings.Join(hs, ", ")
}

// intercepted is whether a connection to name is one the egress
// terminates: a secret of the box is sent to it.
func intercepted(secrets []Secret, name string) bool {
	for i := range secrets {
		if secrets[i].sentTo(name) {
			return true
		}
	}
	return false
}

// leakedIn is why b may not go to name: it holds the placeholder of a
// secret that is not sent there ("" if none).
func leakedIn(b []byte, secrets []Secret, name string) string {
	for i := range secrets {
		s := &secrets[i]
		if strings.Contains(string(b), s.Placeholder) && !s.sentTo(name) {
			return placeholderRefusal(s, name)
		}
	}
	return ""
}

func placeholderRefusal(s *Secret, name string) string {
	return "the request carries the placeholder of secret " + s.Name + ", which is sent only to " + s.hostList() +
		", not to " + sanitize(truncate(name, 100))
}

// CA is the egress's certificate authority: it issues the certificates
// of the hosts whose connections the egress terminates, which the boxes
// trust (BundlePEM). Its key stays in the server.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Files of a CA in its directory.
const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca.key"
	maxLeaves  = 4096 // cached leaf certificates; the cache starts over when full
)

// LoadCA is the CA kept in dir, made there (key 0600) the first time.
func LoadCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	certPEM, err1 := os.ReadFile(filepath.Join(dir, caCertFile))
	keyPEM, err2 := os.ReadFile(filepath.Join(dir, caKeyFile))
	if errors.Is(err1, os.ErrNotExist) && errors.Is(err2, os.ErrNotExist) {
		if certPEM, keyPEM, err1 = newCA(); err1 != nil {
			return nil, fmt.Errorf("egress CA: %w", err1)
		}
		// The key first: a certificate without its key is never left.
		if err := writeAtomic(filepath.Join(dir, caKeyFile), keyPEM, 0o600); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
		if err := writeAtomic(filepath.Join(dir, caCertFile), certPEM, 0o600); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
	} else if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("egress CA: %w (remove both %s and %s to make a new one)", err, caCertFile, caKeyFile)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("egress CA: the key cannot sign")
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, key: signer, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

func newCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Quro egress CA", Organization: []string{"Quro"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// CertPEM is the CA's certificate.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// systemBundles are where Debian, Fedora, Alpine and SUSE keep the
// system's trusted roots as one file.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/cert.pem",
	"/etc/ssl/ca-bundle.pem",
}

// WriteBundle writes path: the system's trusted roots and the CA, the
// trust store a box with secrets is given.
func (ca *CA) WriteBundle(path string) error {
	var b []byte
	for _, f := range systemBundles {
		if sys, err := os.ReadFile(f); err == nil {
			b = append(sys, '\n')
			break
		}
	}
	b = append(b, ca.certPEM...)
	return writeAtomic(path, b, 0o644)
}

// leaf is the certificate of name, issued by ca (cached).
func (ca *CA) leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaves[name]; c != nil && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= maxLeaves {
		ca.leaves = map[string]*tls.Certificate{}
	}
	ca.leaves[name] = c
	return c, nil
}

// intercept serves a connection of box to name, a host one of its
// secrets is sent to: TLS (if the box speaks it) is terminated with a
// certificate of the CA, each HTTP/1.1 request is read, checked to name
// name, its placeholders replaced in the request line and headers (or
// refused, for a secret not sent to name), and sent again to the
// destination over a connection of the egress (TLS verified against
// t.roots). Only HTTP is spoken to such a host.
func (t *Transparent) intercept(c net.Conn, box, name string, port int, addrs []netip.Addr, secrets []Secret, ev *Event) {
	client, secure, why := t.terminate(c, name)
	if why != "" {
		ev.Decision, ev.Reason = Denied, why
		refuse(c)
		return
	}
	var out, in atomic.Int64
	ev.Decision = Allowed
	hostport := net.JoinHostPort(name, strconv.Itoa(port))
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, DialTimeout)
		defer cancel()
		var up net.Conn
		var err error
		for _, a := range addrs {
			hp := net.JoinHostPort(a.String(), strconv.Itoa(port))
			if up, err = t.dial(ctx, "tcp", hp); err == nil {
				ev.Addr = hp
				break
			}
		}
		if up == nil {
			return nil, err
		}
		if !t.track(up, false) {
			up.Close()
			return nil, net.ErrClosed
		}
		up = &counted{Conn: up, out: &out, in: &in, done: func(u net.Conn) { t.untrack(u) }}
		if !secure {
			return up, nil
		}
		tc := tls.Client(up, &tls.Config{ServerName: name, RootCAs: t.o.Roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			up.Close()
			return nil, err
		}
		return tc, nil
	}
	tr := &http.Transport{
		DialContext: dial, DialTLSContext: dial,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		DisableCompression:    true,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       t.idle,
		ResponseHeaderTimeout: t.idle,
	}
	defer tr.CloseIdleConnections()
	scheme := "http"
	if secure {
		scheme = "https"
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The Host the destination gets is the name the box resolved
			// (and the port it wrote, checked to be a number), never the
			// box's spelling of it.
			host := name
			if _, p, err := net.SplitHostPort(pr.In.Host); err == nil && p != "" {
				host = net.JoinHostPort(name, p)
			}
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = scheme, hostport, host
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			ev.Reason = "could not connect"
			http.Error(w, "quro egress: cannot reach "+sanitize(hostport)+" (the destination failed or did not answer)", http.StatusBadGateway)
		},
	}
	var handlers sync.WaitGroup
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		var why string
		switch {
		case r.Method == http.MethodConnect:
			why = "CONNECT request"
		case strings.EqualFold(r.Method, http.MethodTrace) || strings.EqualFold(r.Method, "TRACK"):
			// A server answers TRACE with the request it received: the
			// values written in it would come back to the box.
			why = r.Method + " request (a destination echoes it, with the secrets' values)"
		case hostOnly(r.Host) != name:
			why = "Host " + sanitize(truncate(hostOnly(r.Host), 100)) + " differs from name " + sanitize(name)
		default:
			// The secrets as they are now, not as the connection found
			// them: a removed (or replaced) secret's value is not written
			// into the requests of a connection the box keeps open.
			now := secrets
			if t.o.Secrets != nil {
				now = t.o.Secrets(box)
			}
			why = substitute(r, now, name, secure)
		}
		if why != "" {
			// Logged before the box hears of it, as a refused connection is.
			t.log(Event{Box: box, Dest: ev.Dest, Decision: Denied, Rule: ev.Rule, Reason: why, Start: time.Now()})
			w.Header().Set("Connection", "close")
			http.Error(w, "quro egress refused this request: "+why, http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	})
	ln := &oneConn{c: client, done: make(chan struct{})}
	srv := &http.Server{
		Handler: handler, MaxHeaderBytes: MaxHeaderBytes, ReadHeaderTimeout: t.idle, IdleTimeout: t.idle,
		ErrorLog: log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	_ = srv.Serve(ln)
	handlers.Wait()
	ev.BytesOut, ev.BytesIn = out.Load(), in.Load()
}

// terminate is the box's side of an intercepted connection c to name:
// its TLS ended with a certificate of the CA for name (secure), or plain
// HTTP; why says why neither.
func (t *Transparent) terminate(c net.Conn, name string) (client net.Conn, secure bool, why string) {
	_ = c.SetReadDeadline(time.Now().Add(t.peekTimeout))
	br := bufio.NewReader(c)
	b, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, false, "sent nothing within " + t.peekTimeout.String() + " to a host the egress speaks HTTP to (it has a secret)"
	}
	client = &peeked{Conn: c, r: br}
	if b[0] != 0x16 {
		if looksHTTP(b) == 2 {
			return nil, false, "neither TLS nor HTTP to a host the egress speaks HTTP to (it has a secret)"
		}
		return client, false, ""
	}
	tc := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if h.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(h.ServerName, "."), name) {
				return nil, errors.New("SNI differs from the name")
			}
			return t.o.CA.leaf(name)
		},
	})
	ctx, cancel := context.WithTimeout(t.ctx, t.peekTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, false, "TLS handshake with the box failed"
	}
	return tc, true, ""
}

// substitute replaces the placeholders of secrets sent to name in r's
// target and headers with their values, or says why r is refused: it
// carries the placeholder of a secret not sent to name, or, not secure
// (plain HTTP), of any secret: a value never leaves the server in the
// clear, whatever port or scheme the box chose. The body is sent as it is.
func substitute(r *http.Request, secrets []Secret, name string, secure bool) string {
	var why string
	fix := func(s string) string {
		if why != "" || !strings.Contains(s, PlaceholderPrefix) {
			return s
		}
		for i := range secrets {
			sec := &secrets[i]
			if !strings.Contains(s, sec.Placeholder) {
				continue
			}
			if !sec.sentTo(name) {
				why = placeholderRefusal(sec, name)
				return s
			}
			if !secure {
				why = "the request carries the placeholder of secret " + sec.Name + " in plain HTTP: a secret is sent only over TLS (https://" + sanitize(name) + ")"
				return s
			}
			s = strings.ReplaceAll(s, sec.Placeholder, sec.Value)
		}
		return s
	}
	for k, vs := range r.Header {
		if strings.Contains(k, PlaceholderPrefix) {
			return "a header name carries a secret's placeholder"
		}
		for i, v := range vs {
			vs[i] = fix(v)
		}
	}
	r.URL.RawQuery = fix(r.URL.RawQuery)
	if p := fix(r.URL.Path); p != r.URL.Path {
		r.URL.Path, r.URL.RawPath = p, ""
	}
	r.URL.RawPath = fix(r.URL.RawPath)
	for k, vs := range r.Trailer {
		for i, v := range vs {
			vs[i] = fix(v)
		}
		r.Trailer[k] = vs
	}
	return why
}

// peeked is a connection whose first bytes were read into r.
type peeked struct {
	net.Conn
	r *bufio.Reader
}

func (p *peeked) Read(b []byte) (int, error) { return p.r.Read(b) }

// counted counts the bytes written (out) and read (in) on a connection
// to a destination, and calls done once when closed.
type counted struct {
	net.Conn
	out, in *atomic.Int64
	once    sync.Once
	done    func(net.Conn)
}

func (c *counted) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *counted) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

func (c *counted) Close() error {
	c.once.Do(func() { c.done(c.Conn) })
	return c.Conn.Close()
}

// oneConn is a listener of one connection: Accept returns it once, then
// blocks until Close.
type oneConn struct {
	c     net.Conn
	taken atomic.Bool
	once  sync.Once
	done  chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	if l.taken.CompareAndSwap(false, true) {
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }
