package app

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// boxEgress is the App's sandbox.Egress: the way out of every box under
// the "internet" policy. One transparent proxy serves all boxes; each box
// gets, inside its own network namespace (sandbox.Netns), the listener
// its TCP connections are redirected to, its DNS sockets, and its own map
// of the names its DNS answered (fake addresses, egress.Names). Every
// connection is decided by the session's policy as it is when the
// connection is made.
type boxEgress struct {
	t       *egress.Transparent
	secrets *sessionSecrets // the sessions' secrets, which t replaces
	bundle  string          // the boxes' trust store: the system's roots and the CA
	policy  func(session string) *egress.Policy
	events  *egressLog

	mu      sync.Mutex
	own     ownAddrs
	helpers map[string]*helperEgress // the server's own helper boxes (pip's fetch), by box key
	nextID  uint64
}

// ownAddrs are the host's addresses, read again at most every few seconds:
// the egress refuses them as destinations (the server's own services
// listen there).
type ownAddrs struct {
	at    time.Time
	addrs []netip.Addr
}

// newBoxEgress is the egress of the boxes of the data directory dir: its
// CA (made in dir/egress the first time) terminates the connections to
// the hosts of a session's secrets.
func newBoxEgress(o NetworkOptions, policy func(session string) *egress.Policy, m *metrics.Metrics, dir string, secrets *sessionSecrets, w *egressWriter) (*boxEgress, error) {
	ca, err := egress.LoadCA(filepath.Join(dir, "egress"))
	if err != nil {
		return nil, err
	}
	e := &boxEgress{policy: policy, events: newEgressLog(w), secrets: secrets, bundle: filepath.Join(dir, "egress", "ca-bundle.pem")}
	if err := ca.WriteBundle(e.bundle); err != nil {
		return nil, fmt.Errorf("egress CA bundle: %w", err)
	}
	// Without upstream CAs of the options' own the roots stay nil: TLS
	// then verifies against the system's roots, which crypto/x509 reads
	// and parses on the first verification (the first terminated
	// connection of a box with secrets) rather than at every App's start
	// (some 30 CPU-ms, each CLI command's included).
	var roots *x509.CertPool
	if len(o.UpstreamCAs) > 0 {
		var err error
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		for _, c := range o.UpstreamCAs {
			roots.AddCert(c)
		}
	}
	e.t = egress.NewTransparent(egress.TransparentOptions{
		Trusted: o.Trusted, Resolve: o.Resolve, Own: e.ownAddrs, Secrets: secrets.of, CA: ca, Roots: roots,
		Log: func(ev egress.Event) {
			e.record(ev)
			m.Egress(ev.Decision, ev.BytesOut, ev.BytesIn)
		},
	})
	return e, nil
}

func (e *boxEgress) ownAddrs() []netip.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if time.Since(e.own.at) < 5*time.Second {
		return e.own.addrs
	}
	addrs := []netip.Addr{netip.AddrFrom4([4]byte(sandbox.BoxAddr4)), netip.AddrFrom16([16]byte(sandbox.BoxAddr6))}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				addrs = append(addrs, p.Addr())
			}
		}
	}
	e.own = ownAddrs{at: time.Now(), addrs: addrs}
	return addrs
}

// record keeps ev in its session's log, or a helper box's decisions
// with that helper.
func (e *boxEgress) record(ev egress.Event) {
	e.mu.Lock()
	h := e.helpers[ev.Box]
	e.mu.Unlock()
	switch {
	case h != nil:
		h.add(ev)
	case strings.HasPrefix(ev.Box, helperPrefix):
		// A late event of a helper box already let go: no session's.
	default:
		e.events.add(ev)
	}
}

// Attach opens the box's listeners in ns: TCP on EgressPort (IPv4, and
// IPv6 where the kernel has it) and DNS on DNSPort (UDP and TCP). The
// session's policy decides each connection as it is made.
func (e *boxEgress) Attach(session string, ns *sandbox.Netns) (io.Closer, error) {
	return e.attach(session, ns, func() *egress.Policy { return e.policy(session) })
}

// helperEgress is the way out of one box of the server's own helpers
// (pip's fetch, a box of no session): the App's egress under a policy
// the server set, fixed for the box's life; its decisions are counted
// in /metrics and kept for the helper (Denied), in no session's log.
type helperEgress struct {
	e   *boxEgress
	pol *egress.Policy

	mu     sync.Mutex
	denied []egress.Event
}

// helperPrefix begins a helper box's key: no session's id (hex) does.
const helperPrefix = "(helper "

// helper is the egress for one helper box under pol (sandbox.Spec.Egress).
func (e *boxEgress) helper(pol *egress.Policy) *helperEgress {
	return &helperEgress{e: e, pol: pol}
}

// Attach serves the helper's box in ns, under a key of its own.
func (h *helperEgress) Attach(_ string, ns *sandbox.Netns) (io.Closer, error) {
	e := h.e
	e.mu.Lock()
	e.nextID++
	box := fmt.Sprintf("%s%d)", helperPrefix, e.nextID)
	if e.helpers == nil {
		e.helpers = map[string]*helperEgress{}
	}
	e.helpers[box] = h
	e.mu.Unlock()
	c, err := e.attach(box, ns, func() *egress.Policy { return h.pol })
	forget := func() {
		e.mu.Lock()
		delete(e.helpers, box)
		e.mu.Unlock()
	}
	if err != nil {
		forget()
		return nil, err
	}
	return closerFunc(func() error {
		err := c.Close()
		forget()
		return err
	}), nil
}

func (h *helperEgress) add(ev egress.Event) {
	if ev.Decision != egress.Denied {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.denied) < 64 {
		h.denied = append(h.denied, ev)
	}
}

// Denied are the destinations the egress refused the helper's box so
// far (at most 64), each once as "dest (reason)", with its first reason.
func (h *helperEgress) Denied() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out, seen []string
	for _, ev := range h.denied {
		if !slices.Contains(seen, ev.Dest) {
			seen = append(seen, ev.Dest)
			out = append(out, ev.Dest+" ("+ev.Reason+")")
		}
	}
	return out
}

// attach opens the box's listeners in ns and serves them under policy.
func (e *boxEgress) attach(session string, ns *sandbox.Netns, policy func() *egress.Policy) (io.Closer, error) {
	var closers []io.Closer
	fail := func(err error) (io.Closer, error) {
		for _, c := range closers {
			c.Close()
		}
		return nil, err
	}
	ln4, err := ns.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", sandbox.EgressPort))
	if err != nil {
		return fail(err)
	}
	closers = append(closers, ln4)
	lns := []net.Listener{ln4}
	if ln6, err := ns.Listen("tcp6", fmt.Sprintf("[::1]:%d", sandbox.EgressPort)); err == nil {
		closers = append(closers, ln6)
		lns = append(lns, ln6)
	}
	udp, err := ns.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", sandbox.DNSPort))
	if err != nil {
		return fail(err)
	}
	closers = append(closers, udp)
	tcp, err := ns.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", sandbox.DNSPort))
	if err != nil {
		return fail(err)
	}
	closers = append(closers, tcp)
	names := egress.NewNames()
	var wg sync.WaitGroup
	for _, ln := range lns {
		wg.Go(func() { e.t.Serve(ln, session, names, policy) })
	}
	wg.Go(func() {
		egress.ServeDNS(udp, tcp, names, func(name string) egress.DNSDecision {
			ok, rule := policy().DecideLookup(name)
			return egress.DNSDecision{Allowed: ok, Rule: rule}
		}, func(name, qtype string, d egress.DNSDecision) {
			if !d.Allowed {
				e.record(egress.Event{Box: session, Dest: name, Decision: egress.Denied, Rule: d.Rule, Reason: lookupReason(d.Rule) + ", DNS " + qtype, Start: time.Now()})
			}
		})
	})
	return closerFunc(func() error {
		var errs []error
		for _, c := range closers {
			errs = append(errs, c.Close())
		}
		wg.Wait()
		return errors.Join(errs...)
	}), nil
}

// lookupReason is why the box's DNS refused a name whose decision was
// rule: a deny rule (a rule never holds a space) or a policy's reason.
func lookupReason(rule string) string {
	if strings.Contains(rule, " ") {
		return "name " + rule
	}
	return "deny rule " + rule
}

// Close ends every box's connections, then writes their decisions.
func (e *boxEgress) Close() error {
	err := e.t.Close()
	e.events.w.close()
	return err
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// sessionPolicy is the egress policy of a session's network policy and
// rules (checked by netRules when they were set; rules that no longer
// parse allow nothing).
func sessionPolicy(network string, rules *session.NetRules) *egress.Policy {
	if network != sandbox.NetworkInternet {
		return &egress.Policy{Mode: egress.ModeNone}
	}
	if rules == nil {
		return &egress.Policy{Mode: egress.ModeInternet}
	}
	p, err := egress.ParsePolicy(egress.ModeInternet, rules.Allow, rules.Deny)
	if err != nil {
		return &egress.Policy{Mode: egress.ModeNone}
	}
	return p
}

// egressLog keeps each session's latest egress decisions in memory (at
// most egressKeep per session, the oldest dropped) for a failed run's
// hint, and has w persist them for get_egress_log.
type egressLog struct {
	w    *egressWriter
	mu   sync.Mutex
	byID map[string]*egressRing
}

const egressKeep = 1000

type egressRing struct {
	events []egress.Event // at most egressKeep; the oldest at next once full
	next   int            // where the next event goes once full
	denied uint64         // denied decisions ever, for "denied during this run"
}

// ordered is r's events, oldest first.
func (r *egressRing) ordered() []egress.Event {
	return append(slices.Clone(r.events[r.next:]), r.events[:r.next]...)
}

func newEgressLog(w *egressWriter) *egressLog {
	return &egressLog{w: w, byID: map[string]*egressRing{}}
}

func (l *egressLog) add(ev egress.Event) {
	l.w.add(ev)
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[ev.Box]
	if r == nil {
		r = &egressRing{}
		l.byID[ev.Box] = r
	}
	if len(r.events) < egressKeep {
		r.events = append(r.events, ev)
	} else {
		r.events[r.next] = ev // over the oldest
		r.next = (r.next + 1) % egressKeep
	}
	if ev.Decision == egress.Denied {
		r.denied++
	}
}

// list is session's events kept in memory, newest last.
func (l *egressLog) list(session string) []egress.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.byID[session]; r != nil {
		return r.ordered()
	}
	return nil
}

// mark is where session's log stands now, for refusedSince.
func (l *egressLog) mark(session string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.byID[session]; r != nil {
		return r.denied
	}
	return 0
}

// refusedSince is a note naming the destinations the egress refused for
// session since mark (at most three), and what would allow them; "" when
// none was refused.
func (l *egressLog) refusedSince(session string, mark uint64) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.byID[session]
	if r == nil || r.denied == mark {
		return ""
	}
	n := int(r.denied - mark)
	var seen []string
	rulesNamed, secret := false, false
	events := r.ordered()
	for i := len(events) - 1; i >= 0 && n > 0; i-- {
		ev := events[i]
		if ev.Decision != egress.Denied {
			continue
		}
		n--
		if !slices.ContainsFunc(seen, func(s string) bool { return strings.HasPrefix(s, ev.Dest+" (") }) && len(seen) < 3 {
			seen = append(seen, ev.Dest+" ("+ev.Reason+")")
		}
		rulesNamed = rulesNamed || strings.Contains(ev.Reason, "deny rule") || strings.Contains(ev.Reason, "allow list")
		secret = secret || strings.Contains(ev.Reason, "placeholder of secret")
	}
	slices.Reverse(seen) // in the order they happened
	how := "only public addresses are reachable; the server's operator can list an exception (quro serve --network-allow-private HOST:PORT)"
	if rulesNamed {
		how = "the session's network rules decide it (set_session_network changes them)"
	}
	if secret {
		how = "a secret's placeholder is sent only to the hosts its set_session_secret named; " + how
	}
	return fmt.Sprintf("the network refused %s during this run: %s", strings.Join(seen, ", "), how)
}

// forget drops a session's events (its end), stored ones too.
func (l *egressLog) forget(session string) {
	l.w.forget(session)
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byID, session)
}

// jsOptions are o with fetch's connections made as the session's box's
// would be: through the egress under "internet", from the host under
// "host" (the JS engine runs in the server; "none" never dials).
func jsOptions(o *js.Options, eg *boxEgress, pol *netPolicies) *js.Options {
	var c js.Options
	if o != nil {
		c = *o
	}
	if c.HTTP != nil || c.Dial != nil {
		return &c
	}
	var d net.Dialer
	c.Dial = func(ctx context.Context, session, network, addr string) (net.Conn, error) {
		p := pol.of(session)
		if p.network == sandbox.NetworkHost {
			return d.DialContext(ctx, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			return nil, err
		}
		return eg.t.DialOut(ctx, session, p.egress, host, n)
	}
	return &c
}

// Egress is the way out of the App's boxes under "internet" (benchmarks
// attach it to namespaces of their own).
func (a *App) Egress() sandbox.Egress { return a.egress }
