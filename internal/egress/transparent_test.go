package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// box is a stand-in for a session box: its connections go to the
// transparent proxy's listener, which learns where each was headed from
// the OriginalDst override; names are the fake addresses its DNS
// answered.
type box struct {
	t  testing.TB
	tp *Transparent
	ln net.Listener
	// dsts: the box connection's local address → its destination (an
	// invalid one: deliberately not redirected); dstsChanged is closed
	// and replaced at each entry, the event origDst waits on.
	dmu         sync.Mutex
	dsts        map[string]netip.AddrPort
	dstsChanged chan struct{}
	events      chan Event
	pol         atomic.Pointer[Policy]
	dialed      sync.Map // addresses the proxy dialed
	served      chan struct{}

	mu    sync.Mutex
	names map[netip.Addr]string
	next  int
}

// newBox starts a Transparent with o (its OriginalDst, Log, Dial
// overridden: Dial sends the addresses of public in o's stead to the
// stand-ins public maps them to) under policy pol.
func newBox(t testing.TB, o TransparentOptions, pol *Policy, public map[string]string, set ...func(*Transparent)) *box {
	b := &box{t: t, events: make(chan Event, 1000), names: map[netip.Addr]string{}, served: make(chan struct{}),
		dsts: map[string]netip.AddrPort{}, dstsChanged: make(chan struct{})}
	b.pol.Store(pol)
	o.OriginalDst = b.origDst
	o.Log = func(e Event) { b.events <- e }
	o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		b.dialed.Store(addr, true)
		if to, ok := public[addr]; ok {
			addr = to
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	b.tp = NewTransparent(o)
	// A client's first bytes must come within the peek timeout (for 80
	// and 443; elsewhere the server is taken to speak first): 3 s, so that
	// a test's client, writing at once, is never late on a loaded machine
	// (300 ms could pass before its write was scheduled). A test of the
	// timeout itself waits it out.
	b.tp.peekTimeout = 3 * time.Second
	for _, f := range set {
		f(b.tp)
	}
	var err error
	if b.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		b.tp.Serve(b.ln, "box1", b, func() *Policy { return b.pol.Load() })
		close(b.served)
	}()
	t.Cleanup(func() { b.tp.Close() })
	return b
}

func (b *box) Name(a netip.Addr) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, ok := b.names[a]
	return n, ok
}

// fake is the address the box's DNS answers for name.
func (b *box) fake(name string) netip.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	for a, n := range b.names {
		if n == name {
			return a
		}
	}
	b.next++
	a := netip.AddrFrom4([4]byte{198, 18, byte(b.next >> 8), byte(b.next)})
	b.names[a] = name
	return a
}

// origDst waits for the entry the box's dial makes once its connect
// returns. (It polled for 2 s: at load the dialing goroutine can take
// longer to run, and the proxy then took a redirected connection for one
// that was not.) The minute is a guard against a hang, not a measurement.
func (b *box) origDst(c net.Conn) (netip.AddrPort, error) {
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	for {
		b.dmu.Lock()
		d, ok := b.dsts[c.RemoteAddr().String()]
		changed := b.dstsChanged
		b.dmu.Unlock()
		switch {
		case ok && d.IsValid():
			return d, nil
		case ok:
			return netip.AddrPort{}, errors.New("not redirected")
		}
		select {
		case <-changed:
		case <-guard.C:
			return netip.AddrPort{}, errors.New("not redirected (no entry after a minute)")
		}
	}
}

// setDst records the destination of the box's connection c (invalid: not
// redirected).
func (b *box) setDst(c net.Conn, d netip.AddrPort) {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	b.dsts[c.LocalAddr().String()] = d
	close(b.dstsChanged)
	b.dstsChanged = make(chan struct{})
}

// dial connects the box to dest: name:port (through a fake address) or
// addr:port.
func (b *box) dial(dest string) *net.TCPConn {
	b.t.Helper()
	c, err := b.tryDial(dest)
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

// tryDial is dial, or the error of a connection the proxy reset at once
// (before the box's connect returned).
func (b *box) tryDial(dest string) (*net.TCPConn, error) {
	b.t.Helper()
	h, p, err := net.SplitHostPort(dest)
	if err != nil {
		b.t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	a, err := netip.ParseAddr(h)
	if err != nil {
		a = b.fake(h)
	}
	// The proxy's OriginalDst override waits for this entry.
	var d net.Dialer
	c, err := d.Dial("tcp", b.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	b.setDst(c, netip.AddrPortFrom(a, uint16(port)))
	b.t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn), nil
}

func (b *box) event() Event {
	b.t.Helper()
	select {
	case e := <-b.events:
		return e
	case <-time.After(time.Minute): // a guard against a hang, sized for a loaded machine
		b.t.Fatal("no event")
		return Event{}
	}
}

// refused is whether dest is refused: the connection ends without a
// byte, the event says denied and why.
func (b *box) refused(dest, why string) {
	b.t.Helper()
	c, err := b.tryDial(dest)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "hello\n")
		if n, err := io.ReadAll(c); len(n) != 0 || err != nil && !strings.Contains(err.Error(), "reset") {
			b.t.Errorf("%s: read %q %v", dest, n, err)
		}
	} else if !strings.Contains(err.Error(), "reset") {
		b.t.Fatal(err)
	}
	e := b.event()
	if e.Decision != Denied || !strings.Contains(e.Reason+" "+e.Rule, why) || e.Addr != "" || e.Box != "box1" {
		b.t.Errorf("%s: event %+v, want denied %q", dest, e, why)
	}
}

// echoes is whether dest is allowed: what the box sends comes back.
func (b *box) echoes(dest string) Event {
	b.t.Helper()
	c := b.dial(dest)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := "ping " + dest + "\n"
	io.WriteString(c, msg)
	got, err := bufio.NewReader(c).ReadString('\n')
	if got != msg {
		b.t.Errorf("%s: echoed %q %v", dest, got, err)
	}
	c.Close()
	e := b.event()
	if e.Decision != Allowed || e.Reason != "" || e.BytesOut != int64(len(msg)) || e.BytesIn != int64(len(msg)) {
		b.t.Errorf("%s: event %+v", dest, e)
	}
	return e
}

// echo is a stand-in server on addr (127.0.0.x:0) sending back what it
// reads; it counts its connections.
func echo(t *testing.T, addr string) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String(), &n
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func names(host string, a string) func(context.Context, string) ([]netip.Addr, error) {
	return func(_ context.Context, h string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
}

// TestTransparentInternet: under internet a public literal is relayed;
// the host's and its networks' addresses, the server's own, an address
// the box's DNS never answered and a connection not redirected are
// refused, and none is dialed.
func TestTransparentInternet(t *testing.T) {
	up, conns := echo(t, "127.0.0.1:0")
	p := port(up)
	own := netip.MustParseAddr("198.51.100.9")
	b := newBox(t, TransparentOptions{Own: func() []netip.Addr { return []netip.Addr{own} }}, mustPolicy(t, ModeInternet, nil, nil),
		map[string]string{"203.0.113.7:" + p: up})
	e := b.echoes("203.0.113.7:" + p)
	if e.Dest != "203.0.113.7:"+p || e.Addr != "203.0.113.7:"+p || e.Rule != ModeInternet {
		t.Errorf("event %+v", e)
	}
	for _, d := range []struct{ dest, why string }{
		{"127.0.0.1:" + p, "a loopback address"},
		{"10.0.0.1:80", "a private address"},
		{"169.254.169.254:80", "a link-local address"},
		{"100.64.0.1:80", "shared (CGNAT"},
		{"[::1]:" + p, "a loopback address"},
		{"[fd00:ec2::254]:80", "a private address"},
		{"[::ffff:127.0.0.1]:" + p, "a loopback address"},
		{"0.0.0.0:" + p, "an unspecified address"},
		{"198.51.100.9:80", "an address of the server"},
		{"198.18.9.9:80", "unknown address"},
	} {
		b.refused(d.dest, d.why)
	}
	b.dialed.Range(func(k, _ any) bool {
		if k != "203.0.113.7:"+p {
			t.Errorf("dialed %v", k)
		}
		return true
	})
	if conns.Load() != 1 {
		t.Errorf("the stand-in saw %d connections", conns.Load())
	}

	// Straight to the listener: no original destination, or the
	// listener's own address.
	c, err := net.Dial("tcp", b.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b.setDst(c, netip.AddrPort{})
	if e := b.event(); e.Decision != Denied || e.Reason != "not redirected" {
		t.Errorf("unredirected: %+v", e)
	}
	b.refused(b.ln.Addr().String(), "not redirected")
}

// TestTransparentNames: a name is resolved by the proxy and dialed at
// the address checked; one resolving to loopback (DNS rebinding) is
// refused unless the operator trusts its host:port; a trusted CIDR lets
// a private literal through.
func TestTransparentNames(t *testing.T) {
	up, _ := echo(t, "127.0.0.1:0")
	up2, _ := echo(t, "127.0.0.2:0")
	p := port(up)
	var lookups atomic.Int64
	b := newBox(t, TransparentOptions{
		Trusted: []string{"Trusted.Test:" + p, "127.0.0.2/32"},
		Resolve: func(_ context.Context, h string) ([]netip.Addr, error) {
			lookups.Add(1)
			switch h {
			case "trusted.test", "rebind.test":
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			case "mixed.test":
				return []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("169.254.169.254")}, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: h, IsNotFound: true}
		},
	}, mustPolicy(t, ModeInternet, nil, nil), nil)
	e := b.echoes("trusted.test:" + p)
	if e.Dest != "trusted.test:"+p || e.Addr != "127.0.0.1:"+p {
		t.Errorf("event %+v", e)
	}
	b.refused("rebind.test:"+p, "resolves to a loopback address")
	b.refused("mixed.test:80", "resolves to a")
	b.refused("nowhere.test:80", "cannot resolve")
	b.echoes(up2)
	b.refused("127.0.0.3:"+port(up2), "a loopback address")
	if lookups.Load() != 4 {
		t.Errorf("%d lookups", lookups.Load())
	}
}

// TestTransparentPolicyTrusted: a policy's own trusted host:port (the
// server's helpers: pip's fetch and its configured index) is reached on
// loopback; the same name at another port, another name resolving
// there and the address literal are refused, and the policy's trust
// lifts no rule (a name it does not allow stays refused).
func TestTransparentPolicyTrusted(t *testing.T) {
	up, conns := echo(t, "127.0.0.1:0")
	p := port(up)
	pol := mustPolicy(t, ModeRules, []string{"index.test:" + p, "other.test"}, nil)
	pol.Trusted = []string{"Index.Test:" + p, "notallowed.test:" + p}
	b := newBox(t, TransparentOptions{Resolve: names("", "127.0.0.1")}, pol, nil)
	if e := b.echoes("index.test:" + p); e.Addr != "127.0.0.1:"+p {
		t.Errorf("event %+v", e)
	}
	b.refused("index.test:1", "not in the allow list")
	b.refused("other.test:"+p, "resolves to a loopback address")
	b.refused("notallowed.test:"+p, "not in the allow list")
	b.refused("127.0.0.1:"+p, "not in the allow list")
	if conns.Load() != 1 {
		t.Errorf("the stand-in saw %d connections, want 1", conns.Load())
	}
}

// TestTransparentRules: under rules only what a rule names is reached:
// names exact, wildcard (not the apex) and with a port; literals by a
// CIDR rule; deny wins over allow, for names and for the addresses a
// name resolves to.
func TestTransparentRules(t *testing.T) {
	up, conns := echo(t, "127.0.0.1:0")
	p := port(up)
	pn, _ := strconv.Atoi(p)
	other := strconv.Itoa(pn%60000 + 1)
	b := newBox(t, TransparentOptions{
		Trusted: []string{"127.0.0.0/8"},
		Resolve: func(_ context.Context, h string) ([]netip.Addr, error) {
			if h == "denied-addr.test" {
				return []netip.Addr{netip.MustParseAddr("127.0.0.9")}, nil
			}
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
	}, mustPolicy(t, ModeRules,
		[]string{"allowed.test", "*.wild.test", "port.test:" + p, "203.0.113.0/24", "denied-addr.test"},
		[]string{"bad.wild.test", "203.0.113.66", "127.0.0.9"}),
		map[string]string{"203.0.113.7:" + p: up, "203.0.113.66:" + p: up})
	if e := b.echoes("allowed.test:" + p); e.Rule != "allowed.test" {
		t.Errorf("event %+v", e)
	}
	b.echoes("a.wild.test:" + p)
	b.echoes("a.b.wild.test:" + p)
	b.echoes("port.test:" + p)
	if e := b.echoes("203.0.113.7:" + p); e.Rule != "203.0.113.0/24" {
		t.Errorf("event %+v", e)
	}
	b.refused("other.test:"+p, "not in the allow list")
	b.refused("wild.test:"+p, "not in the allow list")
	b.refused("bad.wild.test:"+p, "deny rule bad.wild.test")
	b.refused("port.test:"+other, "not in the allow list")
	b.refused("198.51.100.1:"+p, "not in the allow list")
	b.refused("203.0.113.66:"+p, "deny rule 203.0.113.66")
	b.refused("denied-addr.test:"+p, "an address of deny rule 127.0.0.9")
	b.refused("127.0.0.1:"+p, "not in the allow list") // trusted, yet not allowed by the policy
	if conns.Load() != 5 {
		t.Errorf("the stand-in saw %d connections", conns.Load())
	}
}

// tlsOrigin is an HTTPS stand-in (its certificate names example.com)
// counting its connections.
func tlsOrigin(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello over tls "+r.Host)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			n.Add(1)
		}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s, &n
}

// TestTransparentSNI: a ClientHello naming the name the box resolved
// passes intact; one naming another (domain fronting) is refused before
// any connection; on 443 a client that sends nothing is refused, on
// another port a server-speaks-first protocol goes on.
func TestTransparentSNI(t *testing.T) {
	srv, conns := tlsOrigin(t)
	p := port(srv.Listener.Addr().String())
	banner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer banner.Close()
	go func() {
		for {
			c, err := banner.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-standin\r\n")
			c.Close()
		}
	}()
	b := newBox(t, TransparentOptions{Trusted: []string{"example.com:" + p, "127.0.0.0/8"}, Resolve: names("", "127.0.0.1")},
		mustPolicy(t, ModeRules, []string{"example.com", "other.test", "quiet.test", "ssh.test"}, nil), nil)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	get := func(sni string) (string, error) {
		c := tls.Client(b.dial("example.com:"+p), &tls.Config{ServerName: sni, RootCAs: roots, InsecureSkipVerify: sni != "example.com"})
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /x HTTP/1.1\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n")
		resp, err := io.ReadAll(c)
		return string(resp), err
	}
	resp, err := get("example.com")
	if err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "\r\n\r\nhello over tls example.com") {
		t.Fatalf("SNI equal: %q %v", resp, err)
	}
	if e := b.event(); e.Decision != Allowed || e.BytesIn < int64(len(resp)) || e.Dest != "example.com:"+p {
		t.Errorf("event %+v", e)
	}
	if _, err := get("other.test"); err == nil {
		t.Error("SNI other.test: no error")
	}
	if e := b.event(); e.Decision != Denied || e.Reason != "SNI other.test differs from name example.com" {
		t.Errorf("fronting event %+v", e)
	}
	if conns.Load() != 1 {
		t.Errorf("the origin saw %d connections", conns.Load())
	}
	start := time.Now()
	c := b.dial("quiet.test:443")
	if n, _ := io.ReadAll(c); len(n) != 0 {
		t.Errorf("quiet 443: %q", n)
	}
	if e := b.event(); e.Decision != Denied || !strings.Contains(e.Reason, "sent nothing") || time.Since(start) < 2500*time.Millisecond {
		t.Errorf("quiet 443 event %+v after %v", e, time.Since(start))
	}
	c = b.dial("ssh.test:" + port(banner.Addr().String()))
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); line != "SSH-2.0-standin\r\n" {
		t.Errorf("server speaks first: %q %v", line, err)
	}
	c.Close()
	if e := b.event(); e.Decision != Allowed || e.BytesIn != 17 {
		t.Errorf("ssh event %+v", e)
	}
	b.refused("quiet.test:80", "neither TLS nor HTTP") // "hello\n"
}

// TestTransparentHTTPHost: every plain HTTP request on a connection must
// name the host the box resolved, the first and any later one.
func TestTransparentHTTPHost(t *testing.T) {
	var mu sync.Mutex
	var hosts []string
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		fmt.Fprintf(w, "%s %d", r.Method, len(body))
	}))
	defer s.Close()
	p := port(s.Listener.Addr().String())
	b := newBox(t, TransparentOptions{Trusted: []string{"127.0.0.0/8"}, Resolve: names("", "127.0.0.1")},
		mustPolicy(t, ModeRules, []string{"web.test"}, nil), nil)
	exchange := func(reqs string, closeWrite ...bool) (string, Event) {
		c := b.dial("web.test:" + p)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			io.WriteString(c, reqs)
			if len(closeWrite) > 0 {
				c.CloseWrite()
			}
		}()
		resp, _ := io.ReadAll(c)
		c.Close()
		return string(resp), b.event()
	}
	h := "Host: web.test:" + p + "\r\n"
	chunked := "POST /c HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: v\r\n\r\n"
	resp, e := exchange(chunked + "POST /l HTTP/1.1\r\n" + h + "Content-Length: 3\r\n\r\nabcGET /last HTTP/1.1\r\n" + h + "Connection: close\r\n\r\n")
	if strings.Count(resp, "HTTP/1.1 200") != 3 || !strings.Contains(resp, "POST 11") || !strings.Contains(resp, "POST 3") || !strings.Contains(resp, "GET 0") || e.Decision != Allowed {
		t.Errorf("three requests: %q %+v", resp, e)
	}
	if resp, e := exchange("GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"); resp != "" || e.Decision != Denied || e.Reason != "Host evil.test differs from name web.test" {
		t.Errorf("first Host differs: %q %+v", resp, e)
	}
	// A Host whose port is not a number: Go's server takes it, a front
	// end of the destination could read evil.test in it.
	for _, bad := range []string{"web.test:evil.test", "web.test:" + p + ",evil.test"} {
		if resp, e := exchange("GET / HTTP/1.1\r\nHost: " + bad + "\r\n\r\n"); resp != "" || e.Decision != Denied || !strings.Contains(e.Reason, "differs from name web.test") {
			t.Errorf("Host %s: %q %+v", bad, resp, e)
		}
	}
	resp, e = exchange("GET /1 HTTP/1.1\r\n" + h + "\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if e.Decision != Denied || e.Reason != "Host evil.test differs from name web.test" || strings.Count(resp, "HTTP/1.1 200") > 1 {
		t.Errorf("second Host differs: %q %+v", resp, e)
	}
	// Upgraded: binary goes through as is; a request after an upgrade
	// the server refused is checked.
	resp, e = exchange("GET /ws HTTP/1.1\r\n"+h+"Connection: Upgrade\r\nUpgrade: echo\r\n\r\n\x82\x00GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", true)
	if !strings.HasPrefix(resp, "HTTP/1.1 101") || !strings.HasSuffix(resp, "\r\n\r\n\x82\x00GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n") || e.Decision != Allowed {
		t.Errorf("upgraded: %q %+v", resp, e)
	}
	resp, e = exchange("GET /1 HTTP/1.1\r\n" + h + "Upgrade: refused\r\n\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if e.Decision != Denied || strings.Count(resp, "HTTP/1.1 200") > 1 {
		t.Errorf("after a refused upgrade: %q %+v", resp, e)
	}
	for _, r := range []string{
		"CONNECT evil.test:443 HTTP/1.1\r\n" + h + "\r\n",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		"GET http://evil.test/ HTTP/1.1\r\n" + h + "\r\n",
		"GET / HTTP/1.1\r\n" + h + "Host: evil.test\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\n" + h + "X: a\r\n b\r\n\r\n",
		// The target names the allowed host, the header another.
		"GET http://web.test:" + p + "/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		// A method a server takes, whatever its case.
		"get / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	} {
		if resp, e := exchange(r); resp != "" || e.Decision != Denied {
			t.Errorf("%q: %q %+v", r, resp, e)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(hosts) > 5 {
		t.Errorf("origin saw %q", hosts)
	}
	for _, x := range hosts {
		if x != "web.test:"+p {
			t.Errorf("origin saw Host %q", x)
		}
	}
}

// TestTransparentPolicyChange: a new policy applies to the next
// connection, not to the one open.
func TestTransparentPolicyChange(t *testing.T) {
	up, _ := echo(t, "127.0.0.1:0")
	p := port(up)
	b := newBox(t, TransparentOptions{}, mustPolicy(t, ModeInternet, nil, nil), map[string]string{"203.0.113.7:" + p: up})
	open := b.dial("203.0.113.7:" + p)
	_ = open.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(open)
	io.WriteString(open, "one\n")
	if l, _ := r.ReadString('\n'); l != "one\n" {
		t.Fatalf("before: %q", l)
	}
	b.pol.Store(mustPolicy(t, ModeNone, nil, nil))
	b.refused("203.0.113.7:"+p, "network none")
	b.pol.Store(mustPolicy(t, ModeInternet, nil, []string{"203.0.113.0/24"}))
	b.refused("203.0.113.7:"+p, "deny rule 203.0.113.0/24")
	io.WriteString(open, "two\n")
	if l, _ := r.ReadString('\n'); l != "two\n" {
		t.Fatalf("after: %q", l)
	}
}

// TestTransparentHalfClose: the box's end of sending reaches the
// destination, whose answer still comes back.
func TestTransparentHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		time.Sleep(50 * time.Millisecond)
		fmt.Fprintf(c, "got %d bytes", n)
	}()
	dest := "203.0.113.7:" + port(ln.Addr().String())
	b := newBox(t, TransparentOptions{}, mustPolicy(t, ModeInternet, nil, nil), map[string]string{dest: ln.Addr().String()})
	c := b.dial(dest)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, strings.Repeat("x", 100000))
	c.CloseWrite()
	if got, err := io.ReadAll(c); string(got) != "got 100000 bytes" || err != nil {
		t.Fatalf("after half-close: %q %v", got, err)
	}
	if e := b.event(); e.BytesOut != 100000 || e.BytesIn != 16 {
		t.Errorf("event %+v", e)
	}
}

// TestTransparentIdleAndLimit: a connection with no byte either way for
// the idle time is cut, one busy for longer is not; past the limit of
// concurrent connections a new one is refused. Each property has a box of
// its own: the limit's with an idle time no step comes near, the idle
// one's with 3 s against a byte every 100 ms. (One box with 300 ms for
// both lost its busy connection to a loaded machine's late wake-up, and
// the limit's check, made after the busy loop, raced the idle cut.)
func TestTransparentIdleAndLimit(t *testing.T) {
	up, _ := echo(t, "127.0.0.1:0")
	dest := "203.0.113.7:" + port(up)
	lb := newBox(t, TransparentOptions{}, mustPolicy(t, ModeInternet, nil, nil), map[string]string{dest: up}, func(tp *Transparent) {
		tp.idle = time.Hour
		tp.maxConns = 2
	})
	c1, c2 := lb.dial(dest), lb.dial(dest)
	lb.refused(dest, "too many connections")
	c1.Close()
	c2.Close()

	const idle = 3 * time.Second
	b := newBox(t, TransparentOptions{}, mustPolicy(t, ModeInternet, nil, nil), map[string]string{dest: up}, func(tp *Transparent) {
		tp.idle = idle
	})
	c := b.dial(dest)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	r := bufio.NewReader(c)
	sent := 0
	for start := time.Now(); time.Since(start) < idle*3/2; { // busy for longer than the idle time
		io.WriteString(c, "x\n")
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("a connection busy every 100 ms was cut after %v: %v", time.Since(start), err)
		}
		sent += 2
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Error("the idle connection was not cut")
	}
	if e := b.event(); e.Decision != Allowed || e.Reason != "idle" || e.BytesOut != int64(sent) {
		t.Errorf("idle event %+v, want allowed, idle, %d bytes out", e, sent)
	}
}

// TestTransparentClose: Close ends Serve and every connection, in
// whatever stage, and leaves no goroutine behind.
func TestTransparentClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var upConns sync.WaitGroup
	upDone := make(chan struct{})
	defer ln.Close()
	go func() {
		defer close(upDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				upConns.Wait()
				return
			}
			upConns.Add(1)
			go func() {
				defer upConns.Done()
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	dest := "203.0.113.7:" + port(ln.Addr().String())
	b := newBox(t, TransparentOptions{Resolve: names("", "203.0.113.7")},
		mustPolicy(t, ModeRules, []string{"203.0.113.7", "slow.test"}, nil), map[string]string{dest: ln.Addr().String()},
		func(tp *Transparent) { tp.peekTimeout = time.Minute })
	open := b.dial(dest)
	io.WriteString(open, "x")
	if _, err := io.ReadFull(open, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	peeking := b.dial("slow.test:" + port(ln.Addr().String()))
	io.WriteString(peeking, "\x16\x03")
	time.Sleep(100 * time.Millisecond)
	b.tp.Close()
	<-b.served
	for _, c := range []net.Conn{open, peeking} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Errorf("after Close: %v", err)
		}
		c.Close()
	}
	ln.Close()
	<-upDone
	// Serve on a closed Transparent returns at once.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	b.tp.Serve(ln2, "box2", nil, nil)
	if _, err := ln2.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the listener of a late Serve: %v", err)
	}
}

// clientHello is the first flight of a crypto/tls client naming sni.
func clientHello(t testing.TB, sni string) []byte {
	a, c := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
	}()
	buf := make([]byte, 16<<10)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := io.ReadAtLeast(c, buf, 5)
	if err != nil {
		t.Fatal(err)
	}
	for n < 5+int(buf[3])<<8|int(buf[4]) {
		m, err := c.Read(buf[n:])
		if err != nil {
			t.Fatal(err)
		}
		n += m
	}
	c.Close()
	a.Close()
	return buf[:n]
}

func TestParseClientHello(t *testing.T) {
	h := clientHello(t, "files.pythonhosted.org")
	if got, err := parseClientHello(h); err != nil || got.sni != "files.pythonhosted.org" || !got.hasSNI || got.ech {
		t.Fatalf("%+v %v", got, err)
	}
	for i := range len(h) {
		if _, err := parseClientHello(h[:i]); !errors.Is(err, errNeedMore) {
			t.Fatalf("cut at %d: %v", i, err)
		}
	}
	// The same message in two records.
	body := h[5:]
	cut := 40
	two := append(append([]byte{0x16, 3, 1, 0, byte(cut)}, body[:cut]...), append([]byte{0x16, 3, 1, byte((len(body) - cut) >> 8), byte(len(body) - cut)}, body[cut:]...)...)
	if got, err := parseClientHello(two); err != nil || got.sni != "files.pythonhosted.org" {
		t.Fatalf("two records: %+v %v", got, err)
	}
	noSNI := clientHello(t, "")
	if got, err := parseClientHello(noSNI); err != nil || got.hasSNI {
		t.Fatalf("no SNI: %+v %v", got, err)
	}
	bad := bytes.Clone(h)
	bad[5] = 2 // server_hello
	if _, err := parseClientHello(bad); err == nil || errors.Is(err, errNeedMore) {
		t.Fatalf("not a ClientHello: %v", err)
	}
}

func FuzzSNI(f *testing.F) {
	f.Add(clientHello(f, "example.com"))
	f.Add(clientHello(f, ""))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1\r\n\r\nx"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseClientHello(b)
		if err == nil && len(h.sni) > len(b) {
			t.Fatalf("SNI longer than the input")
		}
		classify(b, "example.com", true)
	})
}

// BenchmarkTransparentCopy: 100 MB from the box through the proxy to a
// sink on loopback, splicing under the TCP_INFO watcher (what the proxy
// does), splicing in 1 MiB chunks under read deadlines, or reading and
// writing through a buffer.
func BenchmarkTransparentCopy(b *testing.B) {
	for _, mode := range []int{copySplice, copyInChunks, copyBuffered} {
		name := []string{"splice", "chunked", "buffered"}[mode]
		b.Run(name, func(bb *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				bb.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						io.Copy(io.Discard, c)
						c.Close()
					}()
				}
			}()
			dest := "203.0.113.7:" + port(ln.Addr().String())
			bx := newBox(bb, TransparentOptions{}, &Policy{Mode: ModeInternet}, map[string]string{dest: ln.Addr().String()},
				func(tp *Transparent) { tp.copyMode = mode })
			defer bx.tp.Close()
			chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
			bb.SetBytes(100 << 20)
			bb.ResetTimer()
			for range bb.N {
				c := bx.dial(dest)
				for range 100 {
					if _, err := c.Write(chunk); err != nil {
						bb.Fatal(err)
					}
				}
				c.CloseWrite()
				io.Copy(io.Discard, c)
				c.Close()
				if e := bx.event(); e.BytesOut != 100<<20 {
					bb.Fatalf("event %+v", e)
				}
			}
		})
	}
}

// TestOriginalDstUnredirected: a connection nftables did not redirect
// has no original destination but its own address (conntrack's answer)
// or none at all; either is "not redirected" to the proxy.
func TestOriginalDstUnredirected(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ap, err := OriginalDst(c); err == nil && !isLocal(c, ap) {
		t.Errorf("OriginalDst of an unredirected connection: %v", ap)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := OriginalDst(a); err == nil {
		t.Error("OriginalDst of a pipe")
	}
}

// TestTransparentLimitIsPerBox: the limit of concurrent connections is
// the box's across its listeners (its IPv4 and IPv6 ones), not each
// listener's.
func TestTransparentLimitIsPerBox(t *testing.T) {
	up, _ := echo(t, "127.0.0.1:0")
	dest := "203.0.113.7:" + port(up)
	b := newBox(t, TransparentOptions{}, mustPolicy(t, ModeInternet, nil, nil), map[string]string{dest: up}, func(tp *Transparent) {
		tp.maxConns = 2
	})
	second, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go b.tp.Serve(second, "box1", b, func() *Policy { return b.pol.Load() })
	for range 2 { // relayed (echoed), and held open
		c := b.dial(dest)
		io.WriteString(c, "x\n")
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	b.ln = second
	b.refused(dest, "too many connections")
}
