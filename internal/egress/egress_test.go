package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

func TestClass(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1": Loopback, "127.9.9.9": Loopback, "::1": Loopback, "::ffff:127.0.0.1": Loopback,
		"169.254.169.254": LinkLocal, "fe80::1": LinkLocal, "fe80::1%eth0": LinkLocal, "ff02::1": LinkLocal, "224.0.0.1": LinkLocal,
		"10.1.2.3": Private, "172.16.0.1": Private, "172.31.255.255": Private, "192.168.1.1": Private, "fc00::1": Private, "fd12::1": Private, "fec0::1": Private,
		"::ffff:10.0.0.1": Private, "64:ff9b::a00:1": Private, "2002:a00:1::1": Private, "64:ff9b::7f00:1": Loopback, "2002:a9fe:a9fe::": LinkLocal,
		"::7f00:1": Loopback, "::a00:1": Private, "::ffff:0:a9fe:a9fe": LinkLocal, "::ffff:0:a00:1": Private, "64:ff9b:1::a00:1": Reserved,
		"0.0.0.0": Unspecified, "::": Unspecified,
		"239.1.1.1": Multicast, "ff0e::1": Multicast,
		"100.64.0.1": SharedCGNAT, "100.127.255.254": SharedCGNAT,
		"0.1.2.3": Reserved, "192.0.0.8": Reserved, "198.18.0.1": Reserved, "255.255.255.255": Reserved, "240.0.0.1": Reserved,
		"8.8.8.8": "", "1.1.1.1": "", "172.32.0.1": "", "100.128.0.1": "", "2606:4700::1111": "", "151.101.0.223": "", "64:ff9b::808:808": "",
	} {
		if got := Class(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Class(%s) = %q, want %q", addr, got, want)
		}
	}
	if Class(netip.Addr{}) == "" {
		t.Error("the zero address is public")
	}
}

// origin is an HTTP server on loopback counting its connections.
func origin(t *testing.T, tlsToo bool) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.URL.Path)
	})
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	if tlsToo {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s, &conns
}

// listenLoopback is a listener on a random port of 127.0.0.1 (in
// production the proxy's listener is in the fetch box's namespace).
func listenLoopback(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func startProxy(t *testing.T, o Options) *Proxy {
	o.Listener = listenLoopback(t)
	p, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// client goes through the proxy at proxyURL (with or without its
// credentials), trusting srv's certificate.
func client(proxyURL string, srv *httptest.Server) *http.Client {
	u, _ := url.Parse(proxyURL)
	tr := &http.Transport{Proxy: http.ProxyURL(u)}
	if srv != nil && srv.TLS != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	}
	return &http.Client{Transport: tr}
}

func get(t *testing.T, c *http.Client, u string) (int, string, error) {
	t.Helper()
	r, err := c.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, r.Status + ": " + string(b), nil
}

// TestProxyTrustedAndRefused: a trusted loopback host:port is reached
// both ways (absolute-form http and CONNECT for https); an untrusted
// loopback port, 169.254.169.254 and a 10.x address are refused with a
// 403 naming their class, and the untrusted origin sees no connection.
func TestProxyTrustedAndRefused(t *testing.T) {
	plain, _ := origin(t, false)
	secure, _ := origin(t, true)
	other, otherConns := origin(t, false)
	otherTLS, otherTLSConns := origin(t, true)
	p := startProxy(t, Options{Trusted: []string{strings.TrimPrefix(plain.URL, "http://"), strings.TrimPrefix(secure.URL, "https://")}})

	code, body, err := get(t, client(p.URL(), nil), plain.URL+"/simple/x/")
	if err != nil || code != 200 || !strings.Contains(body, "hello from /simple/x/") {
		t.Fatalf("trusted http: %d %q %v", code, body, err)
	}
	code, body, err = get(t, client(p.URL(), secure), secure.URL+"/files/x.whl")
	if err != nil || code != 200 || !strings.Contains(body, "hello from /files/x.whl") {
		t.Fatalf("trusted https through CONNECT: %d %q %v", code, body, err)
	}

	code, body, err = get(t, client(p.URL(), nil), other.URL+"/evil.whl")
	if err != nil || code != 403 || !strings.Contains(body, "loopback address") {
		t.Fatalf("untrusted loopback http: %d %q %v", code, body, err)
	}
	_, _, err = get(t, client(p.URL(), otherTLS), otherTLS.URL+"/evil.whl")
	if err == nil || !strings.Contains(err.Error(), "loopback address") {
		t.Fatalf("untrusted loopback CONNECT: %v", err)
	}
	for u, class := range map[string]string{"http://169.254.169.254/latest/meta-data/": LinkLocal, "http://10.20.30.40:8080/x.whl": Private, "http://[::1]:9/x": Loopback} {
		code, body, err := get(t, client(p.URL(), nil), u)
		if err != nil || code != 403 || !strings.Contains(body, "("+class+" address)") {
			t.Errorf("%s: %d %q %v", u, code, body, err)
		}
	}
	if n, m := otherConns.Load(), otherTLSConns.Load(); n != 0 || m != 0 {
		t.Fatalf("the untrusted origins saw %d and %d connections", n, m)
	}
	got := map[string]string{}
	for _, r := range p.Refused() {
		got[r.Dest] = r.Class
	}
	if got[strings.TrimPrefix(other.URL, "http://")] != Loopback || got["169.254.169.254:80"] != LinkLocal || got["10.20.30.40:8080"] != Private || len(got) != 5 {
		t.Fatalf("refusals: %v", p.Refused())
	}
}

// TestProxyOnlyTrusted: with OnlyTrusted (pip's fetch) the trusted
// host:port is reached; a public literal and any name are refused as
// not a configured index (the name never resolved), a loopback, link-local
// or private address with its class.
func TestProxyOnlyTrusted(t *testing.T) {
	srv, conns := origin(t, false)
	other, otherConns := origin(t, false)
	host := strings.TrimPrefix(srv.URL, "http://")
	var lookups atomic.Int64
	p := startProxy(t, Options{Trusted: []string{host}, OnlyTrusted: true, Resolve: func(context.Context, string) ([]netip.Addr, error) {
		lookups.Add(1)
		return []netip.Addr{netip.MustParseAddr("203.0.113.7")}, nil
	}})
	c := client(p.URL(), nil)
	if code, body, err := get(t, c, srv.URL+"/simple/"); err != nil || code != 200 {
		t.Fatalf("the trusted index: %d %q %v", code, body, err)
	}
	for u, want := range map[string]string{
		"http://203.0.113.7/x.whl":         "203.0.113.7:80 (not a configured index)",
		"http://files.example.org/x.whl":   "files.example.org:80 (not a configured index)",
		other.URL + "/x.whl":               strings.TrimPrefix(other.URL, "http://") + " (loopback address)",
		"http://169.254.169.254/latest/x/": "169.254.169.254:80 (link-local address)",
		"http://10.255.0.1:8080/x.whl":     "10.255.0.1:8080 (private address)",
	} {
		if code, body, _ := get(t, c, u); code != 403 || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 403 %q", u, code, body, want)
		}
	}
	if _, _, err := get(t, client(p.URL(), nil), "https://files.example.org/"); err == nil || !strings.Contains(err.Error(), "not a configured index") {
		t.Errorf("CONNECT to a name: %v", err)
	}
	if lookups.Load() != 0 || otherConns.Load() != 0 || conns.Load() != 1 {
		t.Fatalf("lookups %d, other origin %d connections, index %d", lookups.Load(), otherConns.Load(), conns.Load())
	}
}

// TestProxyResolvesOnce: a name is resolved by the proxy, and a name with
// any public address left is not refused, one with only private ones is;
// a trusted name is dialed whatever it resolves to.
func TestProxyResolvesOnce(t *testing.T) {
	srv, conns := origin(t, false)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	var lookups atomic.Int64
	p := startProxy(t, Options{Trusted: []string{"Index.Test:" + port}, Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		switch host {
		case "index.test", "rebind.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		case "mixed.test":
			return []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.168.0.1")}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}})
	c := client(p.URL(), nil)
	if code, body, err := get(t, c, "http://index.test:"+port+"/simple/"); err != nil || code != 200 {
		t.Fatalf("trusted name: %d %q %v", code, body, err)
	}
	if code, body, _ := get(t, c, "http://rebind.test:"+port+"/x"); code != 403 || !strings.Contains(body, "rebind.test:"+port+" (loopback address)") {
		t.Fatalf("a name resolving to loopback: %d %q", code, body)
	}
	if code, body, _ := get(t, c, "http://mixed.test/x"); code != 403 || !strings.Contains(body, "(private address)") || strings.Contains(body, "10.0.0.1") {
		t.Fatalf("a name resolving to private addresses: %d %q", code, body)
	}
	if code, _, _ := get(t, c, "http://nowhere.test/x"); code != 502 {
		t.Fatalf("an unknown name: %d", code)
	}
	if conns.Load() != 1 || lookups.Load() != 4 {
		t.Fatalf("origin connections %d (want 1), lookups %d (want 4)", conns.Load(), lookups.Load())
	}
}

// TestProxyNeedsAListener: a proxy is never opened on a socket of its
// own choosing (it asks no credentials: its listener must be one only
// its client reaches).
func TestProxyNeedsAListener(t *testing.T) {
	if p, err := Start(Options{}); err == nil {
		p.Close()
		t.Fatal("a proxy started without a listener")
	}
}

// TestProxyRefusesOtherRequests: methods other than GET and HEAD, request
// bodies, origin-form requests and oversized headers are refused.
func TestProxyRefusesOtherRequests(t *testing.T) {
	srv, conns := origin(t, false)
	host := strings.TrimPrefix(srv.URL, "http://")
	p := startProxy(t, Options{Trusted: []string{host}})
	for req, want := range map[string]string{
		"POST http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n" + "Content-Length: 1\r\n\r\nx":                            "405",
		"GET http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n" + "Content-Length: 1\r\n\r\nx":                             "400",
		"GET / HTTP/1.1\r\nHost: " + host + "\r\n" + "\r\n":                                                                      "400",
		"GET http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n" + "X: " + strings.Repeat("a", MaxHeaderBytes) + "\r\n\r\n": "",
		"HEAD http://" + host + "/h HTTP/1.1\r\nHost: " + host + "\r\n" + "\r\n":                                                 "200",
	} {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		go io.WriteString(c, req)
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if got, _, _ := strings.Cut(strings.TrimPrefix(line, "HTTP/1.1 "), " "); got != want {
			t.Errorf("%.60q: %q, want %q", req, line, want)
		}
	}
	if conns.Load() != 1 {
		t.Fatalf("the origin saw %d connections, want the HEAD's one", conns.Load())
	}
}

// TestProxyCloseCutsTunnels: Close ends a tunnel in use.
func TestProxyCloseCutsTunnels(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c) // holds the tunnel open
			c.Close()
		}
	}()
	p, err := Start(Options{Trusted: []string{ln.Addr().String()}, Listener: listenLoopback(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT "+ln.Addr().String()+" HTTP/1.1\r\nHost: "+ln.Addr().String()+"\r\n\r\n")
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("CONNECT: %q", line)
	}
	p.Close()
	if _, err := io.ReadAll(br); err != nil && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("after Close: %v", err)
	}
}
