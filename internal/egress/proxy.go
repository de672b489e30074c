package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Bounds of one proxied exchange.
const (
	MaxHeaderBytes   = 64 << 10          // a request's line and headers
	MaxResponseBytes = 1<<30 + 64<<20    // one response body: a wheel the cache takes (1 GiB) and some
	HeaderTimeout    = 30 * time.Second  // to send a request's headers
	DialTimeout      = 30 * time.Second  // to connect to a destination
	IdleTimeout      = 120 * time.Second // with no byte either way
)

// Options configure a Proxy.
type Options struct {
	// Trusted are the host:port pairs the operator configured (an index's
	// host and port, as its URL names them): the proxy connects to them
	// whatever they resolve to. Any other destination must resolve to
	// public addresses only (Class "").
	Trusted []string
	// OnlyTrusted limits the proxy to the Trusted pairs: any other
	// destination is refused (an address literal with its Class, a name
	// as Unlisted, unresolved).
	OnlyTrusted bool
	// Resolve resolves a host name (tests set it); nil is the system's.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Listener is where the proxy serves: a socket only its client
	// reaches (pip's fetch opens it in the fetch box's own network
	// namespace, sandbox.Netns.Listen), for the proxy asks no
	// credentials. Required; Close closes it.
	Listener net.Listener
}

// Refusal is a destination the proxy refused and why (a Class).
type Refusal struct {
	Dest  string // host:port as the client named it
	Class string
}

// Unlisted is the Class of a Refusal under Options.OnlyTrusted of a
// destination the proxy may not reach whatever its address.
const Unlisted = "unlisted"

func (r Refusal) String() string {
	if r.Class == Unlisted {
		return fmt.Sprintf("%s (not a configured index)", r.Dest)
	}
	return fmt.Sprintf("%s (%s address)", r.Dest, r.Class)
}

// Proxy is an HTTP forward proxy that takes absolute-form GET and HEAD
// requests for http:// URLs and CONNECT for anything else (https), on a
// listener only its client reaches (Options.Listener).
type Proxy struct {
	ln      net.Listener
	trusted map[string]bool
	only    bool
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	refused []Refusal
	failed  []string // destinations that did not answer, each once (Failed)
}

// Start serves on o.Listener until Close.
func Start(o Options) (*Proxy, error) {
	if o.Listener == nil {
		return nil, errors.New("egress proxy: no listener (it must be one only the proxy's client reaches)")
	}
	p := &Proxy{ln: o.Listener, trusted: map[string]bool{}, only: o.OnlyTrusted, resolve: o.Resolve, conns: map[net.Conn]struct{}{}}
	for _, t := range o.Trusted {
		if k, ok := key(t); ok {
			p.trusted[k] = true
		}
	}
	if p.resolve == nil {
		p.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// key is host:port with the host in lower case, or false.
func key(hostport string) (string, bool) {
	h, port, err := net.SplitHostPort(hostport)
	if err != nil || h == "" || port == "" {
		return "", false
	}
	return net.JoinHostPort(strings.ToLower(h), port), true
}

// URL is the proxy's URL, for the client's --proxy.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the port the proxy listens on.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Refused are the destinations the proxy refused so far, each once.
func (p *Proxy) Refused() []Refusal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Refusal(nil), p.refused...)
}

// Failed are the destinations (host:port) the proxy could not connect
// to, or whose answer to a forwarded request was a server error (5xx),
// each once: an index that could not be reached, as against one that
// answered.
func (p *Proxy) Failed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.failed...)
}

func (p *Proxy) fail(dest string) {
	dest = sanitize(dest)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.failed, dest) {
		p.failed = append(p.failed, dest)
	}
}

// Close stops listening, cuts every connection and waits for their ends.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.cancel()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track adds c to the connections Close cuts, or is false once closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: the next connection may fare better
			continue
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			defer c.Close()
			p.serve(c)
		}()
	}
}

// limited is a reader whose budget the proxy resets per request's
// headers; under a bufio.Reader it bounds what http.ReadRequest reads.
type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("request headers too large")
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

// serve answers the requests of one client connection.
func (p *Proxy) serve(c net.Conn) {
	lim := &limited{}
	br := bufio.NewReaderSize(lim, 16<<10)
	for {
		// The headers within HeaderTimeout and MaxHeaderBytes; what
		// follows (a tunnel's bytes) only within IdleTimeout per read.
		lim.r, lim.n = c, MaxHeaderBytes
		_ = c.SetReadDeadline(time.Now().Add(HeaderTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		lim.r, lim.n = idle{c}, 1<<62
		if req.Method == http.MethodConnect {
			p.tunnel(c, br, req)
			return
		}
		if !p.forward(c, req) {
			return
		}
	}
}

// tunnel is CONNECT: the destination checked and dialed, then bytes both
// ways until either side ends or is idle too long.
func (p *Proxy) tunnel(c net.Conn, br *bufio.Reader, req *http.Request) {
	up, ok := p.dialFor(c, req.Host)
	if !ok {
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(idle{up}, br) // the bytes the client sent after its CONNECT first
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(idle{c}, idle{up})
		closeWrite(c)
		done <- struct{}{}
	}()
	select {
	case <-done:
		<-done
	case <-p.ctx.Done():
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	} else {
		c.Close()
	}
}

// forward is an absolute-form request: GET or HEAD of an http:// URL
// without a body, sent to the checked address with the client's headers
// (not the proxy's), its response relayed. It is false when the client's
// connection is done.
func (p *Proxy) forward(c net.Conn, req *http.Request) bool {
	switch {
	case req.URL.Scheme != "http" || req.URL.Host == "":
		writeStatus(c, http.StatusBadRequest, "quro egress takes absolute http:// URLs and CONNECT only", "")
		return false
	case req.Method != http.MethodGet && req.Method != http.MethodHead:
		writeStatus(c, http.StatusMethodNotAllowed, "quro egress forwards GET and HEAD only", "")
		return false
	case req.ContentLength != 0 || len(req.TransferEncoding) > 0:
		writeStatus(c, http.StatusBadRequest, "quro egress forwards no request body", "")
		return false
	}
	dest := req.URL.Host
	if req.URL.Port() == "" {
		dest = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	up, ok := p.dialFor(c, dest)
	if !ok {
		return false
	}
	defer up.Close()
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		req.Header.Del(h)
	}
	req.Close = true // one destination connection per request
	if err := req.Write(idle{up}); err != nil {
		writeStatus(c, http.StatusBadGateway, "quro egress: sending the request failed", "")
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle{up}), req)
	if err != nil {
		p.fail(dest)
		writeStatus(c, http.StatusBadGateway, "quro egress: no valid response from the destination", "")
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 {
		p.fail(dest)
	}
	if resp.ContentLength > MaxResponseBytes {
		writeStatus(c, http.StatusBadGateway, fmt.Sprintf("quro egress: response of %d bytes is larger than %d", resp.ContentLength, int64(MaxResponseBytes)), "")
		return false
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, MaxResponseBytes), resp.Body}
	resp.Close = resp.Close || resp.ContentLength < 0
	if err := resp.Write(idle{c}); err != nil {
		return false
	}
	return !resp.Close
}

// dialFor connects to dest (host:port) for the client on c, or answers
// the client with why not (403 for a refused address, 502 else) and is
// false.
func (p *Proxy) dialFor(c net.Conn, dest string) (net.Conn, bool) {
	up, ref, err := p.dial(dest)
	switch {
	case ref != nil:
		p.mu.Lock()
		seen := false
		for _, r := range p.refused {
			seen = seen || r == *ref
		}
		if !seen {
			p.refused = append(p.refused, *ref)
		}
		p.mu.Unlock()
		writeStatus(c, http.StatusForbidden, "quro egress refused "+ref.String(), "")
		return nil, false
	case err != nil:
		p.fail(dest)
		writeStatus(c, http.StatusBadGateway, "quro egress could not connect to "+sanitize(dest), "")
		return nil, false
	}
	return up, true
}

// dial resolves dest's host (unless it is an address), drops the
// addresses Class refuses unless dest is trusted, and connects to the
// first remaining address that answers: the address checked is the
// address dialed. A destination with no address left is a Refusal.
func (p *Proxy) dial(dest string) (net.Conn, *Refusal, error) {
	k, ok := key(dest)
	if !ok {
		return nil, nil, fmt.Errorf("bad destination %q", dest)
	}
	host, port, _ := net.SplitHostPort(k)
	ctx, cancel := context.WithTimeout(p.ctx, DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
		if p.only && !p.trusted[k] && Class(a) == "" {
			return nil, &Refusal{Dest: sanitize(dest), Class: Unlisted}, nil
		}
	} else if p.only && !p.trusted[k] {
		return nil, &Refusal{Dest: sanitize(dest), Class: Unlisted}, nil
	} else if addrs, err = p.resolve(ctx, host); err != nil {
		return nil, nil, err
	}
	if !p.trusted[k] {
		var ok []netip.Addr
		class := ""
		for _, a := range addrs {
			if cl := Class(a); cl == "" {
				ok = append(ok, a)
			} else if class == "" {
				class = cl
			}
		}
		if len(ok) == 0 && class != "" {
			return nil, &Refusal{Dest: sanitize(dest), Class: class}, nil
		}
		addrs = ok
	}
	var d net.Dialer
	err := fmt.Errorf("no address for %s", host)
	for _, a := range addrs {
		var c net.Conn
		if c, err = d.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), port)); err == nil {
			return c, nil, nil
		}
	}
	return nil, nil, err
}

// sanitize keeps a destination printable on a status line.
func sanitize(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".:-_[]%", r) {
			return r
		}
		return '?'
	}, s)
}

// writeStatus answers with code and reason as the status line's reason
// phrase too (pip shows the phrase in its error), then the connection
// closes.
func writeStatus(c net.Conn, code int, reason, headers string) {
	reason = strings.NewReplacer("\r", " ", "\n", " ").Replace(reason)
	_, _ = fmt.Fprintf(idle{c}, "HTTP/1.1 %03d %s\r\n%sContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		code, reason, headers, len(reason)+1, reason)
}

// idle is a connection whose every read and write must progress within
// IdleTimeout.
type idle struct{ net.Conn }

func (i idle) Read(b []byte) (int, error) {
	_ = i.SetReadDeadline(time.Now().Add(IdleTimeout))
	return i.Conn.Read(b)
}

func (i idle) Write(b []byte) (int, error) {
	_ = i.SetWriteDeadline(time.Now().Add(IdleTimeout))
	return i.Conn.Write(b)
}
