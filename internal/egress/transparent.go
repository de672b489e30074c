package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bounds of the transparent proxy.
const (
	PeekTimeout       = 5 * time.Second  // for a client's first bytes, when its name is checked
	TransparentIdle   = 10 * time.Minute // with no byte either way
	MaxConnsPerBox    = 256              // concurrent connections of one Serve
	ResolveTimeout    = 10 * time.Second
	ip6tSOOriginalDst = 80 // IP6T_SO_ORIGINAL_DST, at level SOL_IPV6
)

// How the relay copies (Transparent.copyMode).
const (
	copySplice   = iota // TCPConn.ReadFrom: splice(2), the TCP_INFO watcher for idleness
	copyInChunks        // splice in 1 MiB chunks under read deadlines
	copyBuffered        // read and write through a 32 KiB buffer, the TCP_INFO watcher
)

// NameMap is what the box's DNS answered: the name a fake address
// stands for.
type NameMap interface {
	Name(netip.Addr) (string, bool)
}

// Event is one connection of a box, allowed or refused.
type Event struct {
	Box      string
	Dest     string // name:port or addr:port as the box asked
	Addr     string // the real address dialed, if any
	Decision string // "allowed" | "denied"
	Rule     string // the rule that decided, or "internet"
	Reason   string // why denied (or why an allowed connection ended early)
	BytesOut int64  // box to destination
	BytesIn  int64  // destination to box
	Start    time.Time
	Duration time.Duration
}

// Decisions of an Event.
const (
	Allowed = "allowed"
	Denied  = "denied"
)

// TransparentOptions configure a Transparent.
type TransparentOptions struct {
	// Trusted are operator exceptions: "host:port" (as Options.Trusted:
	// dialed whatever they resolve to) and CIDRs ("10.1.2.0/24") whose
	// addresses are allowed despite Class and Own. They do not lift the
	// policy's rules.
	Trusted []string
	// Resolve resolves a host name; nil is the system's resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Own are the server's own addresses: always refused unless Trusted.
	Own func() []netip.Addr
	// Log is called once per connection when it ends or is refused.
	Log func(Event)
	// OriginalDst is where a redirected connection was headed; nil is
	// the package's OriginalDst (tests set it).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// Dial connects to a checked address; nil is a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Secrets are a box's secrets (nil: none): their hosts' connections
	// are terminated with CA's certificates, their placeholders replaced
	// in requests to their hosts and refused in any other request the
	// egress reads. Without CA no connection is terminated.
	Secrets func(box string) []Secret
	CA      *CA
	// Roots verify the destinations of terminated connections; nil is
	// the system's roots.
	Roots *x509.CertPool
}

// Transparent relays the connections nftables redirected out of boxes'
// network namespaces to the destinations their policies allow.
type Transparent struct {
	o           TransparentOptions
	trusted     map[string]bool
	trustedNets []netip.Prefix
	origDst     func(net.Conn) (netip.AddrPort, error)
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	resolve     func(ctx context.Context, host string) ([]netip.Addr, error)
	idle        time.Duration // TransparentIdle; tests shorten it
	peekTimeout time.Duration // PeekTimeout; tests shorten it
	maxConns    int32         // MaxConnsPerBox; tests lower it
	// copyMode is how relay copies: copySplice in production;
	// BenchmarkTransparentCopy compares the others.
	copyMode int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	// boxes count each box's connections across its listeners (IPv4
	// and IPv6): MaxConnsPerBox is the box's, not a listener's.
	boxes map[string]*boxConns
}

type boxConns struct {
	active  atomic.Int32
	serving int // Serves of the box running; guarded by Transparent.mu
}

// boxCount is box's connection counter, held until boxDone.
func (t *Transparent) boxCount(box string) *atomic.Int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.boxes == nil {
		t.boxes = map[string]*boxConns{}
	}
	b := t.boxes[box]
	if b == nil {
		b = &boxConns{}
		t.boxes[box] = b
	}
	b.serving++
	return &b.active
}

func (t *Transparent) boxDone(box string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.boxes[box]; b != nil {
		if b.serving--; b.serving == 0 && b.active.Load() == 0 {
			delete(t.boxes, box)
		}
	}
}

// NewTransparent is a Transparent with no listener yet (Serve).
func NewTransparent(o TransparentOptions) *Transparent {
	t := &Transparent{o: o, trusted: map[string]bool{}, origDst: o.OriginalDst, dial: o.Dial, resolve: o.Resolve,
		idle: TransparentIdle, peekTimeout: PeekTimeout, maxConns: MaxConnsPerBox, lns: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
	for _, s := range o.Trusted {
		if p, err := netip.ParsePrefix(s); err == nil {
			t.trustedNets = append(t.trustedNets, p.Masked())
		} else if a, err := netip.ParseAddr(s); err == nil {
			t.trustedNets = append(t.trustedNets, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		} else if k, ok := key(s); ok {
			t.trusted[k] = true
		}
	}
	if t.origDst == nil {
		t.origDst = OriginalDst
	}
	if t.dial == nil {
		var d net.Dialer
		t.dial = d.DialContext
	}
	if t.resolve == nil {
		t.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// Serve accepts the box's redirected connections on ln until ln is
// closed or t is closed. names maps the box's fake addresses to names;
// policy is read at each new connection (a policy change applies to the
// next connection).
func (t *Transparent) Serve(ln net.Listener, box string, names NameMap, policy func() *Policy) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		ln.Close()
		return
	}
	t.lns[ln] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	defer func() {
		t.mu.Lock()
		delete(t.lns, ln)
		t.mu.Unlock()
	}()
	active := t.boxCount(box)
	defer t.boxDone(box)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || t.ctx.Err() != nil {
				return
			}
			select { // EMFILE and the like: the next connection may fare better
			case <-time.After(10 * time.Millisecond):
			case <-t.ctx.Done():
				return
			}
			continue
		}
		if active.Add(1) > t.maxConns {
			active.Add(-1)
			t.log(Event{Box: box, Decision: Denied, Reason: "too many connections", Start: time.Now()})
			refuse(c)
			continue
		}
		if !t.track(c, true) {
			c.Close()
			return
		}
		go func() {
			defer t.wg.Done()
			defer active.Add(-1)
			defer t.untrack(c)
			defer c.Close()
			t.handle(c, box, names, policy)
		}()
	}
}

// Close stops every Serve, cuts every connection and waits for their
// ends.
func (t *Transparent) Close() error {
	t.mu.Lock()
	t.closed = true
	for ln := range t.lns {
		ln.Close()
	}
	for c := range t.conns {
		c.Close()
	}
	t.conns = map[net.Conn]struct{}{}
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	return nil
}

// track adds c to the connections Close cuts (and, with wait, one to
// the goroutines it waits for), or is false once closed.
func (t *Transparent) track(c net.Conn, wait bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	if wait {
		t.wg.Add(1)
	}
	return true
}

func (t *Transparent) untrack(c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.conns, c)
}

func (t *Transparent) log(e Event) {
	if t.o.Log != nil {
		t.o.Log(e)
	}
}

// refuse closes c with a reset, so the box's program fails at once.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// handle is one redirected connection: its destination decided,
// checked, dialed and relayed.
func (t *Transparent) handle(c net.Conn, box string, names NameMap, policy func() *Policy) {
	ev := &Event{Box: box, Start: time.Now(), Decision: Denied}
	logged := false
	defer func() {
		if !logged {
			ev.Duration = time.Since(ev.Start)
			t.log(*ev)
		}
	}()
	deny := func(r *Rule, reason string) {
		ev.Decision, ev.Reason, ev.Rule = Denied, reason, ""
		if r != nil {
			ev.Rule = r.String()
		}
		// Logged before the box hears of it: a run that fails on the
		// refusal finds it in the log when it ends.
		ev.Duration, logged = time.Since(ev.Start), true
		t.log(*ev)
		refuse(c)
	}
	dst, err := t.origDst(c)
	if err != nil || !dst.IsValid() || isLocal(c, dst) {
		deny(nil, "not redirected")
		return
	}
	a, port := dst.Addr().Unmap().WithZone(""), int(dst.Port())
	ev.Dest = netip.AddrPortFrom(a, dst.Port()).String()
	var name string
	if FakeRange.Contains(a) {
		n, ok := "", false
		if names != nil {
			n, ok = names.Name(a)
		}
		if !ok {
			deny(nil, "unknown address")
			return
		}
		name = strings.ToLower(strings.TrimSuffix(n, "."))
		ev.Dest = sanitize(net.JoinHostPort(name, strconv.Itoa(port)))
	}
	var pol *Policy
	if policy != nil {
		pol = policy()
	}
	addrs, rule, denyRule, why := t.destination(name, a, port, pol)
	ev.Rule = rule
	if len(addrs) == 0 {
		deny(denyRule, why)
		return
	}

	var secrets []Secret
	if t.o.Secrets != nil {
		secrets = t.o.Secrets(box)
	}
	if name != "" && t.o.CA != nil && intercepted(secrets, name) {
		t.intercept(c, box, name, port, addrs, secrets, ev)
		return
	}

	var first []byte
	kind := "opaque"
	// A box with secrets has its plain HTTP read too: a placeholder
	// sent where its secret is not is refused.
	if name != "" && (pol.Mode == ModeRules || pol.denyNames() || len(secrets) > 0) {
		var why string
		if first, kind, why = t.peek(c, name, port); why != "" {
			deny(nil, why)
			return
		}
	}

	ctx, cancel := context.WithTimeout(t.ctx, DialTimeout)
	var up net.Conn
	for _, ad := range addrs {
		hp := net.JoinHostPort(ad.String(), strconv.Itoa(port))
		if up, err = t.dial(ctx, "tcp", hp); err == nil {
			ev.Addr = hp
			break
		}
	}
	cancel()
	if up == nil {
		ev.Decision, ev.Reason = Allowed, "could not connect"
		refuse(c)
		return
	}
	if !t.track(up, false) {
		up.Close()
		return
	}
	defer t.untrack(up)
	defer up.Close()
	ev.Decision = Allowed
	t.relay(c, up, first, kind, name, secrets, ev)
}

// destination decides a connection to name (when the box's DNS gave it)
// or else to the address a, at port, under pol: the addresses it may be
// dialed at (the name resolved by the egress itself, each address
// checked) and the rule or reason that allowed it; with none, denyRule
// (a deny rule, or nil) and why say why not.
func (t *Transparent) destination(name string, a netip.Addr, port int, pol *Policy) (addrs []netip.Addr, rule string, denyRule *Rule, why string) {
	if name != "" {
		ok, r, reason := pol.decideName(name, port)
		if !ok {
			return nil, "", r, ruleReason(r, reason)
		}
		rule = ruleOr(r, reason)
		ctx, cancel := context.WithTimeout(t.ctx, ResolveTimeout)
		res, err := t.resolve(ctx, name)
		cancel()
		if err != nil {
			return nil, rule, nil, "cannot resolve the name"
		}
		if addrs, r, why = t.check(res, net.JoinHostPort(name, strconv.Itoa(port)), port, pol, true); len(addrs) == 0 {
			if why == "" {
				why = "the name has no address"
			}
			return nil, rule, r, why
		}
		return addrs, rule, nil, ""
	}
	ok, r, reason := pol.decideAddr(a, port)
	if !ok {
		return nil, "", r, ruleReason(r, reason)
	}
	rule = ruleOr(r, reason)
	if addrs, r, why = t.check([]netip.Addr{a}, netip.AddrPortFrom(a, uint16(port)).String(), port, pol, false); len(addrs) == 0 {
		return nil, rule, r, why
	}
	return addrs, rule, nil, ""
}

// DialOut connects the server, on behalf of box, to host:port (a name
// or an address literal) as a connection of the box would be: decided by
// pol, the name resolved by the egress and only a checked address dialed.
// The decision is logged as the box's. It is for code of a session that
// runs in the server (the JS engine's fetch): no SNI or Host is peeked,
// the server's own client sends them for the name it dials.
func (t *Transparent) DialOut(ctx context.Context, box string, pol *Policy, host string, port int) (net.Conn, error) {
	ev := Event{Box: box, Start: time.Now(), Decision: Denied}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	ev.Dest = sanitize(net.JoinHostPort(host, strconv.Itoa(port)))
	name, a := host, netip.Addr{}
	if lit, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		name, a = "", lit.Unmap().WithZone("")
	}
	addrs, rule, denyRule, why := t.destination(name, a, port, pol)
	ev.Rule = rule
	if len(addrs) == 0 {
		ev.Reason = why
		if denyRule != nil {
			ev.Rule = denyRule.String()
		}
		ev.Duration = time.Since(ev.Start)
		t.log(ev)
		return nil, &RefusedError{Dest: ev.Dest, Reason: why}
	}
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	var err error
	for _, ad := range addrs {
		hp := net.JoinHostPort(ad.String(), strconv.Itoa(port))
		var c net.Conn
		if c, err = t.dial(ctx, "tcp", hp); err == nil {
			ev.Decision, ev.Addr, ev.Duration = Allowed, hp, time.Since(ev.Start)
			t.log(ev)
			return c, nil
		}
	}
	ev.Decision, ev.Reason, ev.Duration = Allowed, "could not connect", time.Since(ev.Start)
	t.log(ev)
	return nil, err
}

// RefusedError is DialOut's refusal: the destination and why.
type RefusedError struct{ Dest, Reason string }

func (e *RefusedError) Error() string {
	return "the network policy refused " + e.Dest + ": " + e.Reason
}

func ruleOr(r *Rule, reason string) string {
	if r != nil {
		return r.String()
	}
	return reason
}

func ruleReason(r *Rule, reason string) string {
	if r != nil {
		return "deny rule " + r.String()
	}
	return reason
}

// isLocal is whether dst is c's own local address: a connection to the
// listener itself, which conntrack reports as its own original
// destination.
func isLocal(c net.Conn, dst netip.AddrPort) bool {
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	l := la.AddrPort()
	return l.Addr().Unmap() == dst.Addr().Unmap() && l.Port() == dst.Port()
}

// check keeps the addresses of addrs the box may reach at port: none a
// deny rule's prefix holds, and, unless the operator trusts dest
// (host:port) or the address, none Class refuses nor the server's own.
// With none left, r or why say why.
func (t *Transparent) check(addrs []netip.Addr, dest string, port int, pol *Policy, resolved bool) (ok []netip.Addr, r *Rule, why string) {
	k, _ := key(dest)
	var own []netip.Addr
	if t.o.Own != nil {
		own = t.o.Own()
	}
	prefix := ""
	if resolved {
		prefix = "resolves to "
	}
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if dr := pol.denyAddr(a, port); dr != nil {
			r, why = dr, prefix+"an address of deny rule "+dr.String()
			continue
		}
		trusted := t.trusted[k] || pol.trusts(k)
		for _, p := range t.trustedNets {
			trusted = trusted || p.Contains(a)
		}
		if !trusted {
			if cl := Class(a); cl != "" {
				r, why = nil, prefix+article(cl)+" address"
				continue
			}
			mine := false
			for _, o := range own {
				mine = mine || o.Unmap().WithZone("") == a
			}
			if mine {
				r, why = nil, prefix+"an address of the server"
				continue
			}
		}
		ok = append(ok, a)
	}
	if len(ok) > 0 {
		return ok, nil, ""
	}
	return nil, r, why
}

func article(class string) string {
	if strings.HasPrefix(class, "unspecified") {
		return "an " + class
	}
	return "a " + class
}

// peek reads the client's first bytes (at most maxPeek, within the peek
// timeout) and checks the name they carry against name: a TLS
// ClientHello's SNI or an HTTP request's Host. kind is "tls", "http",
// "opaque" (another protocol, on a port other than 80 and 443) or
// "none" (nothing sent: a server-speaks-first protocol). why is set
// when the connection is refused.
func (t *Transparent) peek(c net.Conn, name string, port int) (buf []byte, kind, why string) {
	return t.peekWithin(c, name, port, t.peekTimeout, false)
}

// peekLate is peek for a client that sent nothing at first (a server
// speaks first: SSH, SMTP): its first bytes, whenever they come (within
// the idle time), are checked as peek checks them — a request sent late
// is no way past the check.
func (t *Transparent) peekLate(c net.Conn, name string, port int) (buf []byte, kind, why string) {
	return t.peekWithin(c, name, port, t.idle, true)
}

func (t *Transparent) peekWithin(c net.Conn, name string, port int, within time.Duration, late bool) (buf []byte, kind, why string) {
	_ = c.SetReadDeadline(time.Now().Add(within))
	defer c.SetReadDeadline(time.Time{})
	web := port == 80 || port == 443
	buf = make([]byte, 0, 2048)
	for {
		kind, done, why := classify(buf, name, web)
		if why != "" || done {
			return buf, kind, why
		}
		if len(buf) >= maxPeek {
			return nil, "", fmt.Sprintf("first %s bytes too large to check", kind)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(cap(buf), maxPeek-len(buf)))...)[:len(buf)]
		}
		n, err := c.Read(buf[len(buf):min(cap(buf), maxPeek)])
		buf = buf[:len(buf)+n]
		if err != nil && n == 0 {
			switch {
			case len(buf) > 0:
				return nil, "", "incomplete " + kind + " start within " + t.peekTimeout.String()
			case web:
				return nil, "", "sent nothing to check within " + t.peekTimeout.String() + " on port " + strconv.Itoa(port)
			case late && errors.Is(err, io.EOF):
				return nil, "opaque", "" // the client ended without a byte
			case late:
				return nil, "", "sent nothing within " + within.String()
			case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.EOF):
				return nil, "none", ""
			default:
				return nil, "", "read error"
			}
		}
	}
}

// classify looks at the first bytes b of a connection to name: done
// once the name they carry is checked (or there is none to check), why
// when refused; neither when more bytes are needed.
func classify(b []byte, name string, web bool) (kind string, done bool, why string) {
	if len(b) == 0 {
		return "TLS or HTTP", false, ""
	}
	if b[0] == 0x16 {
		h, err := parseClientHello(b)
		switch {
		case errors.Is(err, errNeedMore):
			return "TLS", false, ""
		case err != nil:
			return "tls", false, err.Error()
		case h.ech:
			return "tls", false, "encrypted ClientHello hides the name"
		case h.hasSNI && !strings.EqualFold(strings.TrimSuffix(h.sni, "."), name):
			return "tls", false, "SNI " + sanitize(truncate(h.sni, 100)) + " differs from name " + sanitize(name)
		}
		return "tls", true, ""
	}
	switch looksHTTP(b) {
	case 0:
		i := bytes.Index(b, []byte("\n\r\n"))
		j := bytes.Index(b, []byte("\n\n"))
		if i < 0 && j < 0 {
			return "HTTP", false, ""
		}
		if _, why := checkRequest(b, name); why != "" {
			return "http", false, why
		}
		return "http", true, ""
	case 1:
		return "HTTP", false, ""
	}
	if web {
		return "", false, "neither TLS nor HTTP on a web port"
	}
	return "opaque", true, ""
}

// looksHTTP is 0 when b starts with an HTTP request line, 1 when it may
// yet (the first line is not complete), 2 when it does not.
// A request line: a method token (any: a server may take "get" or
// "FOO"), a target, and an HTTP version, which every HTTP/1 server wants.
var requestLine = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]{1,16} [^ ]+ HTTP/[0-9]\\.[0-9]$")

func looksHTTP(b []byte) int {
	line, _, complete := bytes.Cut(b, []byte("\n"))
	if complete {
		if requestLine.Match(bytes.TrimSuffix(line, []byte("\r"))) {
			return 0
		}
		return 2
	}
	for i, c := range line {
		switch {
		case c == ' ' && i > 0:
			return 1 // a method; the line's end decides
		case !tchar(c) || i >= 16:
			return 2
		}
	}
	return 1
}

// tchar is whether c may be in an HTTP token (RFC 9110): a server may
// take any such method ("get", "FOO"), so the check must too.
func tchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// checkRequest parses the request head at the start of b and checks
// its Host (and an absolute-form target's host) is name.
func checkRequest(b []byte, name string) (*http.Request, string) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		return nil, "malformed HTTP request"
	}
	// ReadRequest keeps one Host; count them in the head itself, and
	// refuse folded lines, which servers read differently.
	// Nor a body whose length a server could read otherwise than the
	// relay (the rest would be a request it never checked).
	hosts, lengths, te := 0, 0, 0
	for _, l := range bytes.Split(b, []byte("\n"))[1:] {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(l) == 0 {
			break
		}
		if l[0] == ' ' || l[0] == '\t' {
			return nil, "folded HTTP header"
		}
		k, _, _ := bytes.Cut(l, []byte(":"))
		switch strings.ToLower(strings.TrimSpace(string(k))) {
		case "host":
			hosts++
		case "content-length":
			lengths++
		case "transfer-encoding":
			te++
		}
	}
	if hosts > 1 {
		return nil, "several Host headers"
	}
	if req.RequestURI != "*" && !strings.HasPrefix(req.RequestURI, "/") {
		// An absolute-form target names a host of its own (a server may
		// go by it or by the Host header): a client of an origin server
		// sends origin-form.
		return nil, "absolute-form request target"
	}
	if lengths > 1 || te > 1 || lengths+te > 1 {
		return nil, "ambiguous HTTP body length"
	}
	for _, h := range []string{req.Host, req.URL.Host} {
		if h == "" && hosts == 1 {
			continue
		}
		if hh := hostOnly(h); hh != name {
			return nil, "Host " + sanitize(truncate(hh, 100)) + " differs from name " + sanitize(name)
		}
	}
	return req, ""
}

// hostOnly is the host of h (a Host header or a URL's host): in lower
// case, without a trailing dot or a port. A port that is not a number
// keeps h whole, so that it matches no name: Go's server takes
// "name:evil.example" and "name:443,evil.example" as Host, which a
// front end of the destination could read as another host.
func hostOnly(h string) string {
	if hh, p, err := net.SplitHostPort(h); err == nil {
		if len(p) > 5 || strings.Trim(p, "0123456789") != "" {
			return strings.ToLower(h)
		}
		h = hh
	}
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

// relay copies both ways until both ends are done, half-closing each
// way as it ends, and counts the bytes. first are the bytes peeked off
// c; with kind "http", every request from c is checked to name name.
// A request that carries a placeholder of secrets is refused (their hosts'
// connections are intercepted, never relayed).
func (t *Transparent) relay(c, up net.Conn, first []byte, kind, name string, secrets []Secret, ev *Event) {
	var out, in int64
	var why atomic.Pointer[string] // the first reason the relay was cut
	var refused atomic.Bool        // by a later request's check
	cut := func(reason string) {
		if reason != "" {
			why.CompareAndSwap(nil, &reason)
		}
		c.Close()
		up.Close()
	}
	var activity atomic.Int64 // chunked mode: the last progress either way
	activity.Store(time.Now().UnixNano())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var err error
		if kind == "none" {
			// The server speaks first; the client's first bytes are
			// checked when they come.
			var late string
			if first, kind, late = t.peekLate(c, name, 0); late != "" {
				refused.Store(true)
				cut(late)
				return
			}
		}
		if kind == "http" {
			out, err = relayHTTP(up, bufio.NewReaderSize(io.MultiReader(bytes.NewReader(first), c), 32<<10), name, secrets)
		} else {
			var n int
			if n, err = up.Write(first); err == nil {
				out, err = t.copy(up, c, &activity)
			}
			out += int64(n)
		}
		var fr frontingError
		var leak leakError
		switch {
		case errors.As(err, &leak):
			// Logged before the box hears of it (a run that fails on it
			// finds it in the log), as its own decision.
			t.log(Event{Box: ev.Box, Dest: ev.Dest, Decision: Denied, Rule: ev.Rule, Reason: string(leak), Start: time.Now()})
			cut(string(leak))
		case errors.As(err, &fr):
			refused.Store(true)
			cut(string(fr))
		case err != nil:
			cut("")
		default:
			closeWrite(up)
		}
	}()
	go func() {
		defer wg.Done()
		var err error
		in, err = t.copy(c, up, &activity)
		if err != nil {
			cut("")
		} else {
			closeWrite(c)
		}
	}()
	if t.copyMode != copyInChunks {
		go t.watch(c, up, done, cut)
	}
	wg.Wait()
	close(done)
	ev.BytesOut, ev.BytesIn = out, in
	if p := why.Load(); p != nil && *p != "" {
		ev.Reason = *p
	}
	if refused.Load() {
		ev.Decision = Denied
	}
}

// copy copies src to dst until src's end: with splice(2) through
// TCPConn.ReadFrom (or as copyMode says).
func (t *Transparent) copy(dst, src net.Conn, activity *atomic.Int64) (int64, error) {
	switch t.copyMode {
	case copySplice:
		if tc, ok := dst.(*net.TCPConn); ok {
			return tc.ReadFrom(src)
		}
		return io.Copy(dst, src)
	case copyBuffered:
		return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 32<<10))
	}
	var total int64
	for {
		_ = src.SetReadDeadline(time.Now().Add(t.idle))
		n, err := io.CopyN(dst, src, 1<<20)
		total += n
		if n > 0 {
			activity.Store(time.Now().UnixNano())
		}
		switch {
		case errors.Is(err, io.EOF):
			return total, nil
		case errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, activity.Load())) < t.idle:
			continue // the other way is busy
		case err != nil:
			return total, err
		}
	}
}

// watch cuts c and up after t.idle with no byte either way, as the
// kernel counts them (TCP_INFO), which splice(2) leaves alone.
func (t *Transparent) watch(c, up net.Conn, done <-chan struct{}, cut func(string)) {
	tick := time.NewTicker(max(t.idle/10, time.Millisecond))
	defer tick.Stop()
	last, since := tcpBytes(c)+tcpBytes(up), time.Now()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if n := tcpBytes(c) + tcpBytes(up); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= t.idle {
			cut("idle")
			return
		}
	}
}

// tcpBytes is what c's socket received and had acknowledged, or 0.
func tcpBytes(c net.Conn) uint64 {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n uint64
	_ = rc.Control(func(fd uintptr) {
		if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n = ti.Bytes_received + ti.Bytes_acked
		}
	})
	return n
}

// frontingError is a later request on a checked connection that names
// another host.
type frontingError string

func (e frontingError) Error() string { return string(e) }

// leakError is a request that carries the placeholder of a secret not
// sent to the connection's host.
type leakError string

func (e leakError) Error() string { return string(e) }

// relayHTTP forwards the requests read from br to up as they are, each
// checked to name name (Host), their bodies by Content-Length or
// chunked, until br's end. CONNECT is refused (the destination could be
// a proxy to anywhere). After an Upgrade request the rest is copied as
// is once the client sends binary (a WebSocket frame); text that follows
// is read as the next request, since a server that refused the upgrade
// reads it so.
func relayHTTP(up io.Writer, br *bufio.Reader, name string, secrets []Secret) (int64, error) {
	var total int64
	for {
		head, err := readHead(br)
		if errors.Is(err, io.EOF) && len(head) == 0 {
			return total, nil
		}
		if err != nil {
			return total, frontingError("malformed HTTP request")
		}
		req, why := checkRequest(head, name)
		if why != "" {
			return total, frontingError(why)
		}
		if req.Method == http.MethodConnect {
			return total, frontingError("CONNECT request")
		}
		if why := leakedIn(head, secrets, name); why != "" {
			return total, leakError(why)
		}
		n, err := up.Write(head)
		total += int64(n)
		if err != nil {
			return total, err
		}
		var m int64
		switch {
		case len(req.TransferEncoding) > 0:
			m, err = copyChunked(up, br)
		case req.ContentLength > 0:
			m, err = io.CopyN(up, br, req.ContentLength)
		}
		total += m
		if err != nil {
			return total, err
		}
		if req.Header.Get("Upgrade") != "" {
			next, err := br.Peek(1)
			if errors.Is(err, io.EOF) {
				return total, nil
			} else if err != nil {
				return total, err
			}
			if nonHTTPByte(next[0]) {
				m, err = io.Copy(up, br)
				return total + m, err
			}
		}
	}
}

// nonHTTPByte is whether a first byte b is no HTTP's: neither text nor
// the CR and LF a server skips before a request (a client's WebSocket
// frame starts with 0x80-0x8f, or 0x00-0x02 when fragmented).
func nonHTTPByte(b byte) bool {
	return b < 0x20 && b != '\r' && b != '\n' && b != '\t' || b >= 0x7f
}

// readHead reads a request's line and headers, up to the blank line,
// at most MaxHeaderBytes.
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		if len(head) > MaxHeaderBytes {
			return head, errors.New("request head too large")
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if err == io.EOF && len(head) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return head, err
		}
		if string(line) == "\r\n" || string(line) == "\n" {
			return head, nil
		}
	}
}

// copyChunked copies a chunked body as it is: chunks, the last chunk
// and the trailer.
func copyChunked(w io.Writer, br *bufio.Reader) (int64, error) {
	var total int64
	line := func() ([]byte, error) {
		l, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("chunk line too long")
		}
		if err != nil {
			return nil, err
		}
		n, err := w.Write(l)
		total += int64(n)
		return l, err
	}
	for {
		l, err := line()
		if err != nil {
			return total, err
		}
		hex, _, _ := strings.Cut(strings.TrimRight(string(l), "\r\n"), ";")
		size, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 62)
		if err != nil {
			return total, frontingError("malformed chunked body")
		}
		if size == 0 {
			for {
				l, err := line()
				if err != nil {
					return total, err
				}
				if string(l) == "\r\n" || string(l) == "\n" {
					return total, nil
				}
			}
		}
		n, err := io.CopyN(w, br, int64(size))
		total += n
		if err != nil {
			return total, err
		}
		if l, err = line(); err != nil {
			return total, err
		} else if string(l) != "\r\n" && string(l) != "\n" {
			return total, frontingError("malformed chunked body")
		}
	}
}

// OriginalDst is where the redirected connection c was headed before
// nftables redirected it: getsockopt SO_ORIGINAL_DST (IPv4) or
// IP6T_SO_ORIGINAL_DST (IPv6) on its socket.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var oerr error
	v4 := true
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok && la.IP.To4() == nil {
		v4 = false
	}
	// The family of the connection first (an IPv4 one may arrive on a
	// dual-stack IPv6 socket), then the other.
	get4 := func(fd int) error {
		var sa unix.RawSockaddrInet4
		l := uint32(unsafe.Sizeof(sa))
		err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), &l)
		if err == nil {
			ap = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
		}
		return err
	}
	get6 := func(fd int) error {
		var sa unix.RawSockaddrInet6
		l := uint32(unsafe.Sizeof(sa))
		err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), &l)
		if err == nil {
			ap = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), ntohs(sa.Port))
		}
		return err
	}
	if !v4 {
		get4, get6 = get6, get4
	}
	cerr := rc.Control(func(fd uintptr) {
		if oerr = get4(int(fd)); oerr != nil && get6(int(fd)) == nil {
			oerr = nil
		}
	})
	if cerr != nil {
		return netip.AddrPort{}, cerr
	}
	if oerr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", oerr)
	}
	return ap, nil
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, l *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}
