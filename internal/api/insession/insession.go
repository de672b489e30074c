// Package insession lets code running in a session call the service back,
// the way an agent does (`quro call` inside a terminal). Every session has
// a unix socket of its own (SocketPath), made when the session's first box
// needs it (Server.Binds) and bound into that session's boxes only, at
// SocketInBox; it is closed and removed when the session is destroyed.
//
// A request is the session's whose socket it came in on, and only when the
// kernel says (SO_PEERCRED) that the connecting process runs under that
// session's uid — which the store gives to no other session (see
// session.Session.UID). Both are checked on every request against the
// store: there is no map from uids to sessions that could go stale. No
// token is involved, so none can leak from a box.
//
// The caller it resolves is the session's tenant with the exec scope,
// confined to that one session (controller.Caller.Session): code in a
// session can run, read and write within its session, but cannot reach,
// list or create other sessions — so, for instance, a session without
// network cannot make one with network.
package insession

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/connlimit"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/share"
)

// SocketInBox is where the socket is inside every box.
const SocketInBox = "/run/quro/api.sock"

// SocketDir is the directory of the sessions' sockets under the data
// directory.
func SocketDir(dataDir string) string { return filepath.Join(dataDir, "run", "s") }

// SocketPath is the host path of session id's socket under dataDir.
func SocketPath(dataDir, id string) string { return filepath.Join(SocketDir(dataDir), id+".sock") }

// Listen makes a unix socket at path (replacing a stale one) that only
// uid may connect to (as the server is root; otherwise only the server's
// uid can anyway). The directory holding it is the server's alone.
func Listen(path string, uid int) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is %d bytes, longer than the %d a unix socket may have: use a shorter data directory", path, len(path), maxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// Connecting needs write permission on the socket: only the session's
	// uid has it. The peer uid is checked on every request all the same.
	err = os.Chmod(path, 0o600)
	if err == nil && os.Geteuid() == 0 && uid > 0 {
		err = os.Lchown(path, uid, uid)
	}
	if err != nil {
		ln.Close()
		os.Remove(path)
		return nil, err
	}
	return ln, nil
}

// maxSocketPath is the longest path a unix socket may have on Linux
// (sun_path is 108 bytes, with the NUL).
const maxSocketPath = 107

type credKey struct{}

// ConnContext records the peer credentials of a unix connection in the
// context of its requests (http.Server.ConnContext). A connection wrapped
// by a listener (one with a NetConn method, as tls.Conn has) is unwrapped
// to its unix connection first.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	for range 8 {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return ctx
	}
	return WithPeer(ctx, cred)
}

// WithPeer returns ctx for a request whose connecting process has cred.
// ConnContext sets it from the kernel; tests set it themselves.
func WithPeer(ctx context.Context, cred *syscall.Ucred) context.Context {
	return context.WithValue(ctx, credKey{}, cred)
}

type sessionKey struct{}

// ForSession returns h for requests that came in on the socket of session
// id: the session a request may act as.
func ForSession(id string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, id)))
	})
}

// Resolver authenticates requests on the sessions' sockets.
type Resolver struct {
	Sessions *session.Manager
}

func unauthenticated(format string, args ...any) error {
	return capability.Errorf(capability.Unauthenticated, format, args...)
}

// Auth is the httpauth.Func of the sessions' sockets. The session is the
// one whose socket the request came in on (ForSession), looked up in the
// store now; the connecting process must run under that session's uid.
func (r *Resolver) Auth(req *http.Request) (controller.Caller, error) {
	cred, ok := req.Context().Value(credKey{}).(*syscall.Ucred)
	if !ok || cred == nil {
		return controller.Caller{}, unauthenticated("not a connection on an in-session socket")
	}
	id, _ := req.Context().Value(sessionKey{}).(string)
	if id == "" {
		return controller.Caller{}, unauthenticated("not a session's socket")
	}
	uid := int(cred.Uid)
	if uid == os.Geteuid() {
		return controller.Caller{}, unauthenticated(
			"calls from inside a session need the server to run as root, so that each session has a uid of its own")
	}
	s, err := r.Sessions.ByIDAnyTenant(req.Context(), id)
	if errors.Is(err, session.ErrNotFound) {
		return controller.Caller{}, unauthenticated("this socket's session was destroyed")
	}
	if err != nil {
		return controller.Caller{}, err
	}
	if s.Tenant == session.SpareTenant {
		// A spare is nobody's until claimed: only the server's own worker
		// runs in its box, and no caller may act as the spare's tenant.
		return controller.Caller{}, unauthenticated("this socket's session is a spare no tenant has claimed yet")
	}
	if s.UID <= 0 || uid != s.UID {
		return controller.Caller{}, unauthenticated("the calling process (uid %d) is not of the session whose socket this is", uid)
	}
	return controller.Caller{Tenant: s.Tenant, Scope: capability.ScopeExec, TokenID: "session:" + s.ID[:12], Session: s.ID}, nil
}

// Server runs the sessions' sockets: it makes a session's socket the first
// time one of its boxes is built and serves it (with Serve) until the
// session is destroyed or the server's context ends.
type Server struct {
	dataDir string
	exists  func(ctx context.Context, id string) bool
	handler http.Handler
	log     *slog.Logger
	ctx     context.Context

	mu     sync.Mutex
	live   map[string]*socket // session id → its socket
	closed bool
	wg     sync.WaitGroup
	limits connlimit.Options // every socket's, with one Shared pool
	tenant func(ctx context.Context, id string) string
	gone   connlimit.Stats // the refusals and evictions of sockets closed since
}

type socket struct {
	ln     *connlimit.Listener
	path   string
	cancel context.CancelFunc
	done   chan struct{}
}

// Options configure a Server. nil means defaults.
type Options struct {
	Logger *slog.Logger
	// MaxConns is the most connections all sessions' sockets hold
	// together (1024); each session's own share is 32, each tenant's a
	// quarter of MaxConns and at least 32 (see limits).
	MaxConns int
	// Tenant names the tenant of session id now (a spare changes hands
	// when claimed), for the tenants' shares of MaxConns; nil or "": the
	// tenant the session had when its socket was made.
	Tenant func(ctx context.Context, id string) string
}

// NewServer returns the server of the sessions' sockets under dataDir,
// serving h (whose authentication is a Resolver's Auth) until ctx ends.
// exists reports whether a session still exists (its row). Its Hooks tie
// it to the session.Manager opened with them: a session's boxes get its
// socket, and destroying the session closes it. Sockets left by an
// earlier server are removed.
func NewServer(ctx context.Context, dataDir string, exists func(ctx context.Context, id string) bool, h http.Handler, o *Options) *Server {
	var opts Options
	if o != nil {
		opts = *o
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{dataDir: dataDir, exists: exists, handler: h, log: log, ctx: ctx, live: map[string]*socket{},
		limits: limits(log, opts.MaxConns), tenant: opts.Tenant}
	// One total for every session's socket: each socket is its own
	// listener, and a thousand sessions × PerPeer must not reach the fd
	// limit. Each tenant gets a share of it, so that one tenant's sessions
	// cannot hold every place and leave another's `quro call`, pip and
	// apt-get without a connection.
	perTenant := share.Of(s.limits.Max, s.limits.PerPeer)
	s.limits.Shared = share.New("in-session connections", s.limits.Max, perTenant)
	s.limits.ShareRefusal = connlimit.HTTPRefusalSaying(fmt.Sprintf(
		"the tenant's share of the in-session connections is in use (%d of the server's %d, over all its sessions); close idle connections or retry later",
		perTenant, s.limits.Max))
	old, _ := filepath.Glob(filepath.Join(SocketDir(dataDir), "*.sock"))
	// run/api.sock: the one socket of every session, before sessions had
	// their own.
	for _, p := range append(old, filepath.Join(dataDir, "run", "api.sock")) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().Type() == os.ModeSocket {
			os.Remove(p)
		}
	}
	return s
}

// Hooks are what the session.Manager is opened with (session.Open) to
// tie the sessions' boxes to this server.
func (s *Server) Hooks() *session.BoxHooks {
	return &session.BoxHooks{Binds: s.Binds, Destroyed: s.Destroyed}
}

// Binds returns the bind that puts sess's socket at SocketInBox in its
// boxes, making and serving the socket if it is not yet. A session that
// no longer exists gets none; so does every session when the socket
// cannot be made (the error is logged): its code then cannot call back.
func (s *Server) Binds(sess *session.Session) []sandbox.Bind {
	if !idPattern.MatchString(sess.ID) || sess.UID <= 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if sk := s.live[sess.ID]; sk != nil {
		return []sandbox.Bind{{Src: sk.path, Dst: SocketInBox}}
	}
	// Checked under mu: Destroyed, which takes mu, runs after the row is
	// gone, so a socket made here is either seen and closed by it or never
	// made.
	if !s.exists(s.ctx, sess.ID) {
		return nil
	}
	path := SocketPath(s.dataDir, sess.ID)
	ln, err := Listen(path, sess.UID)
	if err != nil {
		s.log.Error("cannot make the in-session socket; the session's code cannot call back", "session", sess.ID, "err", err)
		return nil
	}
	ctx, cancel := context.WithCancel(s.ctx)
	lim := s.limits
	id, tenant := sess.ID, sess.Tenant
	lim.Tenant = func(net.Conn) string { return s.tenantOf(id, tenant) }
	limited := connlimit.New(ln, &lim)
	sk := &socket{ln: limited, path: path, cancel: cancel, done: make(chan struct{})}
	s.live[sess.ID] = sk
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(sk.done)
		if err := Serve(ctx, limited, ForSession(sess.ID, s.handler)); err != nil && ctx.Err() == nil {
			s.log.Error("in-session calls stopped", "session", sess.ID, "err", err)
		}
	}()
	return []sandbox.Bind{{Src: path, Dst: SocketInBox}}
}

// tenantOf is the tenant of session id now (Options.Tenant), else made,
// the one it had when its socket was made.
func (s *Server) tenantOf(id, made string) string {
	if s.tenant != nil {
		if t := s.tenant(s.ctx, id); t != "" {
			return t
		}
	}
	return made
}

// Shares are the in-session connections' total and each tenant's share.
func (s *Server) Shares() share.Stats { return s.limits.Shared.Stats() }

var idPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Destroyed closes sess's socket, its connections included, and removes
// it.
func (s *Server) Destroyed(sess *session.Session) {
	s.mu.Lock()
	sk := s.live[sess.ID]
	delete(s.live, sess.ID)
	s.mu.Unlock()
	if sk == nil {
		os.Remove(SocketPath(s.dataDir, sess.ID))
		return
	}
	sk.cancel()
	<-sk.done
	s.retire(sk)
	os.Remove(sk.path)
}

// retire keeps the counters of a socket that is closed.
func (s *Server) retire(sk *socket) {
	st := sk.ln.Stats()
	s.mu.Lock()
	s.gone.RefusedTotal += st.RefusedTotal
	s.gone.RefusedPeer += st.RefusedPeer
	s.gone.RefusedShare += st.RefusedShare
	s.gone.Evicted += st.Evicted
	s.mu.Unlock()
}

// Stats are the connection counts of every session's socket together:
// those held now, and the refusals and evictions since the server started.
func (s *Server) Stats() connlimit.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.gone
	st.Open, st.Pending = 0, 0
	for _, sk := range s.live {
		x := sk.ln.Stats()
		st.Open += x.Open
		st.Pending += x.Pending
		st.RefusedTotal += x.RefusedTotal
		st.RefusedPeer += x.RefusedPeer
		st.RefusedShare += x.RefusedShare
		st.Evicted += x.Evicted
	}
	return st
}

// Sockets is the number of sessions' sockets being served.
func (s *Server) Sockets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Close stops every socket and removes them; sessions' boxes get none
// after it.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	live := s.live
	s.live = map[string]*socket{}
	s.mu.Unlock()
	for _, sk := range live {
		sk.cancel()
	}
	s.wg.Wait()
	for _, sk := range live {
		os.Remove(sk.path)
	}
}

// Serve serves h on ln for code in sessions until ctx ends.
//
// Code in a box is hostile, so the server holds nothing for it without a
// bound: ln is capped (a *connlimit.Listener as given, else wrapped with
// the default limits) in all and per peer uid, so a background process of one
// session cannot take the server's descriptors; headers, bodies, idle
// keep-alive connections and responses have connlimit's timeouts.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	if _, ok := ln.(*connlimit.Listener); !ok {
		l := limits(nil, 0)
		ln = connlimit.New(ln, &l)
	}
	srv := connlimit.NewServer(h, &connlimit.HTTPOptions{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if lc, ok := c.(*connlimit.Conn); ok {
				c = lc.NetConn() // the *net.UnixConn, for SO_PEERCRED
			}
			return ConnContext(ctx, c)
		},
	})
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("in-session socket: %w", err)
}

// limits are the in-session sockets' connection limits: max in all (1024
// when 0), 32 per peer uid (so per session); over them a connection is
// refused, never another's evicted (a uid cannot be forged, so one session
// cannot take another's share). A Server adds each tenant's share of max
// (NewServer).
func limits(log *slog.Logger, max int) connlimit.Options {
	if max <= 0 {
		max = 1024
	}
	return connlimit.Options{Name: "insession", Max: max, PerPeer: 32, Peer: connlimit.PeerUID,
		Refusal: connlimit.HTTPRefusal("in-session"), Logger: log}
}
