// Package connlimit caps the connections a listener holds, in all and per
// peer, so that nobody can hold the server's file descriptors: a
// connection over a cap is answered at once (a short 503, when the
// listener has one to say) and closed, before the server spends anything
// on it.
//
// A peer is what the listener says it is: the remote IP for TCP (an IPv6
// /64, which one host usually owns whole), the uid of the connecting
// process for a unix socket (SO_PEERCRED, which the peer cannot forge).
//
// Connections that have not yet authenticated a request are "pending";
// with Options.Evict, a new connection over a cap does not wait for a
// free slot but takes the one of the oldest pending connection (of its
// peer, or of anyone when the total is reached), which is closed. An
// attacker without a token — even one who connects from many addresses,
// as anyone on the host can from 127/8 — can fill the slots, but cannot
// keep an authenticated client out: that client's connection is the
// newest, and once its first request authenticates (Handler marks it,
// Conn.Trust) it is not evicted for an unauthenticated one while it is
// at work (see EvictIdle for one idle between requests).
//
// With Options.EvictIdle as well, a token holder cannot keep others out
// by holding authenticated keep-alive connections that do nothing: when
// no pending connection is left to take, a new connection takes the slot
// of the trusted connection that has been idle between requests the
// longest (of its peer, or of anyone when the total is reached), which is
// closed, as the server's IdleTimeout would close it; the newcomer may be
// one that has not authenticated yet. NewServer's server
// reports the idle state (Conn.SetIdle). A connection with a request in
// flight, or hijacked (a WebSocket), is never evicted: only when every
// slot is held by a trusted connection at work is a new one refused.
package connlimit

import (
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/share"
)

// Options are a Listener's limits. nil means defaults: no limit.
type Options struct {
	// Name names the listener in logs and metrics ("http", "insession").
	Name string
	// Max is the most connections held at once (0: no limit).
	Max int
	// PerPeer is the most connections of one peer (0: no limit).
	PerPeer int
	// Shared, when set, is a pool this listener shares with others (the
	// sessions' sockets, one listener each, share one total and its
	// per-tenant shares): a connection also needs a place in it, of its
	// tenant's share.
	Shared *share.Pool
	// Tenant names the tenant a connection counts against in Shared
	// (called once, at accept); nil: every connection is of tenant "".
	Tenant func(net.Conn) string
	// ShareRefusal is written instead of Refusal to a connection refused
	// because its tenant holds its share of Shared.
	ShareRefusal []byte
	// Evict lets a connection over a cap take the slot of the oldest
	// pending (not yet trusted) one instead of being refused.
	Evict bool
	// EvictIdle, with Evict, lets it take, when no pending connection is
	// left, the slot of the trusted one idle the longest between requests
	// (Conn.SetIdle).
	EvictIdle bool
	// Peer names the peer of a connection; nil: PeerIP.
	Peer func(net.Conn) string
	// Refusal is written to a refused connection before it is closed (nil:
	// nothing, just the close).
	Refusal []byte
	// Logger gets a warning when connections are refused or evicted (at
	// most one a minute) and when the listener gets near its limit.
	Logger *slog.Logger
}

// HTTPRefusal is a complete HTTP/1.1 503 answer for Options.Refusal.
func HTTPRefusal(name string) []byte {
	return HTTPRefusalSaying(fmt.Sprintf("the %s listener is at its connection limit; close idle connections or retry later", name))
}

// HTTPRefusalSaying is a complete HTTP/1.1 503 answer whose error message
// is msg (Options.ShareRefusal, say).
func HTTPRefusalSaying(msg string) []byte {
	m, _ := json.Marshal(msg)
	body := `{"error":{"code":"unavailable","message":` + string(m) + `}}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// Refusal reasons (the reason label of the refused counter).
const (
	RefusedTotal = "total" // the listener was full
	RefusedPeer  = "peer"  // the peer had its share
	RefusedShare = "share" // the peer's tenant had its share of Shared
)

// Listener is a net.Listener that holds at most the connections its
// Options allow. Accepted connections are *Conn.
type Listener struct {
	net.Listener
	opts Options

	mu       sync.Mutex
	open     int              // connections held
	perPeer  map[string]*peer // by peer key
	pending  *list.List       // of *Conn not yet trusted, newest first
	idle     *list.List       // of trusted *Conn idle between requests, the latest idle first
	nearFull bool             // warned about being near full

	refusedTotal, refusedPeer, refusedShare, evicted, evictedIdle atomic.Uint64
	lastWarn                                                      atomic.Int64 // unix nanos of the last warning
}

// peer is one peer's connections.
type peer struct {
	n       int
	pending *list.List // of *Conn not yet trusted, newest first
	idle    *list.List // of trusted *Conn idle between requests, the latest idle first
}

func newPeer() *peer { return &peer{pending: list.New(), idle: list.New()} }

// New wraps ln.
func New(ln net.Listener, o *Options) *Listener {
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.Peer == nil {
		opts.Peer = PeerIP
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: ln, opts: opts, perPeer: map[string]*peer{}, pending: list.New(), idle: list.New()}
}

// Accept returns the next connection within the limits; those over them
// are refused and closed on the way (or, with Evict, take the place of an
// older pending one, which is closed).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &Conn{Conn: c, l: l, peer: l.opts.Peer(c)}
		if l.opts.Shared != nil && l.opts.Tenant != nil {
			lc.tenant = l.opts.Tenant(c)
		}
		victims, why := l.admit(lc)
		for _, v := range victims {
			v.Conn.Close() // its server goroutine sees the error and lets go
		}
		if len(victims) > 0 {
			l.warn("connlimit: evicting the oldest connections that sent no authenticated request, or the longest idle keep-alive ones", "peer", lc.peer)
		}
		if why != "" {
			l.refuse(c, lc.peer, why)
			continue
		}
		return lc, nil
	}
}

// admit takes a slot for c, evicting pending connections if need be (the
// victims, to close, are already out of the books); why is the refusal
// reason when there is no slot.
func (l *Listener) admit(c *Conn) (victims []*Conn, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	max, per := l.opts.Max, l.opts.PerPeer
	p := l.perPeer[c.peer]
	if p == nil {
		p = newPeer()
		l.perPeer[c.peer] = p
	}
	if per > 0 && p.n >= per {
		v := l.victimLocked(p.pending, p.idle)
		if v == nil {
			l.dropPeer(c.peer, p)
			return nil, RefusedPeer
		}
		victims = append(victims, v)
	}
	if max > 0 && l.open >= max {
		v := l.victimLocked(l.pending, l.idle)
		if v == nil {
			l.dropPeer(c.peer, p)
			return victims, RefusedTotal
		}
		victims = append(victims, v)
	}
	if err := l.opts.Shared.Acquire(c.tenant); err != nil {
		l.dropPeer(c.peer, p)
		l.evicted.Add(uint64(len(victims)))
		if r := (*share.Refusal)(nil); errors.As(err, &r) && r.AtShare {
			return victims, RefusedShare
		}
		return victims, RefusedTotal
	}
	l.evicted.Add(uint64(len(victims)))
	if p = l.perPeer[c.peer]; p == nil { // an eviction may have dropped it
		p = newPeer()
		l.perPeer[c.peer] = p
	}
	l.open++
	p.n++
	c.all, c.own = l.pending.PushFront(c), p.pending.PushFront(c)
	if max > 0 && !l.nearFull && l.open >= max*9/10 {
		l.nearFull = true
		l.opts.Logger.Warn("connlimit: listener near its connection limit", "listener", l.opts.Name, "open", l.open, "max", max)
	}
	return victims, ""
}

// victimLocked takes the connection to evict from pending or, with
// EvictIdle, from idle (the oldest of either), out of the books; nil when
// eviction is off or there is none. Called with l.mu.
func (l *Listener) victimLocked(pending, idle *list.List) *Conn {
	if !l.opts.Evict {
		return nil
	}
	var v *Conn
	switch {
	case pending.Len() > 0:
		v = pending.Back().Value.(*Conn)
	case l.opts.EvictIdle && idle.Len() > 0:
		v = idle.Back().Value.(*Conn)
		l.evictedIdle.Add(1)
	default:
		return nil
	}
	l.releaseLocked(v)
	return v
}

// releaseLocked frees c's slot (once). Called with l.mu.
func (l *Listener) releaseLocked(c *Conn) {
	if c.released {
		return
	}
	c.released = true
	l.opts.Shared.Release(c.tenant)
	l.open--
	p := l.perPeer[c.peer]
	p.n--
	if c.all != nil {
		l.pending.Remove(c.all)
		p.pending.Remove(c.own)
		c.all, c.own = nil, nil
	}
	if c.idleAll != nil {
		l.idle.Remove(c.idleAll)
		p.idle.Remove(c.idleOwn)
		c.idleAll, c.idleOwn = nil, nil
	}
	l.dropPeer(c.peer, p)
	if l.nearFull && l.open < l.opts.Max*8/10 {
		l.nearFull = false
	}
}

func (l *Listener) dropPeer(key string, p *peer) {
	if p.n == 0 {
		delete(l.perPeer, key)
	}
}

func (l *Listener) refuse(c net.Conn, key, why string) {
	refusal := l.opts.Refusal
	switch why {
	case RefusedPeer:
		l.refusedPeer.Add(1)
	case RefusedShare:
		l.refusedShare.Add(1)
		if l.opts.ShareRefusal != nil {
			refusal = l.opts.ShareRefusal
		}
	default:
		l.refusedTotal.Add(1)
	}
	if len(refusal) > 0 {
		// A fresh socket's send buffer is empty: this does not block, and
		// the deadline makes sure of it.
		c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(refusal) // a courtesy: the connection closes either way
	}
	c.Close()
	l.warn("connlimit: refusing connections", "reason", why, "peer", key)
}

// warn logs msg at most once a minute, with the listener's counts.
func (l *Listener) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	if last := l.lastWarn.Load(); now-last > int64(time.Minute) && l.lastWarn.CompareAndSwap(last, now) {
		s := l.Stats()
		l.opts.Logger.Warn(msg, append(args, "listener", l.opts.Name, "open", s.Open, "max", l.opts.Max, "per_peer", l.opts.PerPeer,
			"refused_total", s.RefusedTotal, "refused_peer", s.RefusedPeer, "evicted", s.Evicted)...)
	}
}

// Stats are a Listener's counts.
type Stats struct {
	Open, Pending             int    // connections held; of them not yet trusted
	Peers                     int    // peers with connections
	RefusedTotal, RefusedPeer uint64 // refused since the start, by reason
	RefusedShare              uint64 // refused since the start: the tenant had its share of Shared
	Evicted                   uint64 // connections closed for newer ones (pending or, with EvictIdle, idle trusted)
	EvictedIdle               uint64 // of them, trusted ones idle between requests (EvictIdle)
	Idle                      int    // trusted connections idle between requests
}

// Stats returns the current counts.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Open: l.open, Pending: l.pending.Len(), Peers: len(l.perPeer), Idle: l.idle.Len(),
		RefusedTotal: l.refusedTotal.Load(), RefusedPeer: l.refusedPeer.Load(), RefusedShare: l.refusedShare.Load(),
		Evicted: l.evicted.Load(), EvictedIdle: l.evictedIdle.Load()}
}

// Options returns the limits in force (after New's adjustments).
func (l *Listener) Options() Options { return l.opts }

// Conn is an accepted connection; closing it frees its slot (once).
type Conn struct {
	net.Conn
	l      *Listener
	peer   string
	tenant string // in Options.Shared

	// Under l.mu:
	released         bool
	all, own         *list.Element // in the pending lists, until trusted
	idleAll, idleOwn *list.Element // in the idle lists, while trusted and idle
}

// ReadFrom lets the HTTP server's copy of a file to the connection reach
// the kernel's copy (sendfile, splice) of the connection it wraps.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// Close frees the connection's slot and closes it.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// CloseWrite shuts down the writing side, when the connection has one
// (TCP and unix do): the HTTP server then tells a client it answered with
// "Connection: close" that it is done, before the full close.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Trust marks the connection as having authenticated a request: it is
// never evicted for a newer one.
func (c *Conn) Trust() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.all != nil {
		c.l.pending.Remove(c.all)
		c.l.perPeer[c.peer].pending.Remove(c.own)
		c.all, c.own = nil, nil
	}
}

// SetIdle records whether the connection waits for its next request
// (true: http.StateIdle) or not (false: a request is read or served, or
// the connection was hijacked). A trusted idle connection may be evicted
// with Options.EvictIdle; a pending one is evictable whatever its state.
func (c *Conn) SetIdle(idle bool) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	switch {
	case idle && !c.released && c.all == nil && c.idleAll == nil:
		c.idleAll, c.idleOwn = c.l.idle.PushFront(c), c.l.perPeer[c.peer].idle.PushFront(c)
	case !idle && c.idleAll != nil:
		c.l.idle.Remove(c.idleAll)
		c.l.perPeer[c.peer].idle.Remove(c.idleOwn)
		c.idleAll, c.idleOwn = nil, nil
	}
}

// Trusted reports whether Trust was called (or the connection is gone).
func (c *Conn) Trusted() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.all == nil
}

// Peer is the connection's peer key.
func (c *Conn) Peer() string { return c.peer }

// NetConn is the wrapped connection (a *net.TCPConn, *net.UnixConn).
func (c *Conn) NetConn() net.Conn { return c.Conn }

// PeerIP keys a connection by its remote IP: an IPv4 address, or the /64
// of an IPv6 one.
func PeerIP(c net.Conn) string {
	var ip net.IP
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(c.RemoteAddr().String())
		if err != nil {
			return c.RemoteAddr().String()
		}
		ip = net.ParseIP(host)
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	if len(ip) == net.IPv6len {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return c.RemoteAddr().String()
}

// PeerUID keys a unix-socket connection by the uid of the process that
// connected (SO_PEERCRED, read once at accept); other connections by
// PeerIP. A connection whose credentials cannot be read shares the key
// "uid:?".
func PeerUID(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return PeerIP(c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "uid:?"
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return "uid:?"
	}
	return "uid:" + strconv.FormatUint(uint64(cred.Uid), 10)
}
