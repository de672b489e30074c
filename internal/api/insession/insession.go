// Package insession lets code running in a session call the service back,
// the way an agent does (`quro call` inside a terminal). The server listens
// on one unix socket that the sandbox binds into every box at SocketInBox;
// the kernel tells the server the uid of each connecting process
// (SO_PEERCRED), and since every session runs under a uid of its own, the
// uid names the session. No token is involved, so none can leak from a box.
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
	"sync"
	"syscall"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/connlimit"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// SocketInBox is where the socket is inside every box.
const SocketInBox = "/run/quro/api.sock"

// SocketPath is the socket's host path under the data directory.
func SocketPath(dataDir string) string { return filepath.Join(dataDir, "run", "api.sock") }

// Bind is the sandbox bind that puts the socket of dataDir into boxes.
func Bind(dataDir string) sandbox.Bind {
	return sandbox.Bind{Src: SocketPath(dataDir), Dst: SocketInBox}
}

// Listen makes the socket at path (replacing a stale one) that every
// session uid may connect to.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// Connecting needs write permission on the socket; who connects is
	// decided by the peer uid, not by the file's mode.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

type credKey struct{}

// ConnContext records the peer credentials of a unix connection in the
// context of its requests (http.Server.ConnContext).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
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
	return context.WithValue(ctx, credKey{}, cred)
}

// Resolver finds the session of a peer uid.
type Resolver struct {
	Sessions *session.Manager

	mu    sync.Mutex
	byUID map[int]string // session uid → session id
}

// Auth is the httpauth.Func of the in-session socket.
func (r *Resolver) Auth(req *http.Request) (controller.Caller, error) {
	cred, ok := req.Context().Value(credKey{}).(*syscall.Ucred)
	if !ok {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "not a connection on the in-session socket")
	}
	uid := int(cred.Uid)
	if uid == os.Geteuid() {
		return controller.Caller{}, capability.Errorf(capability.Unauthenticated,
			"calls from inside a session need the server to run as root, so that each session has a uid of its own")
	}
	s, err := r.find(req.Context(), uid)
	if err != nil {
		return controller.Caller{}, err
	}
	return controller.Caller{Tenant: s.Tenant, Scope: capability.ScopeExec, TokenID: "session:" + s.ID[:12], Session: s.ID}, nil
}

func (r *Resolver) find(ctx context.Context, uid int) (*session.Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.byUID[uid]; ok {
		if s, err := r.Sessions.ByIDAnyTenant(ctx, id); err == nil {
			return s, nil
		}
	}
	all, err := r.Sessions.AllTenants(ctx)
	if err != nil {
		return nil, err
	}
	r.byUID = map[int]string{}
	clash := map[int]bool{}
	for _, s := range all {
		u := sandbox.SessionUID(s.Workspace())
		if _, dup := r.byUID[u]; dup {
			clash[u] = true
		}
		r.byUID[u] = s.ID
	}
	if clash[uid] {
		return nil, capability.Errorf(capability.Unauthenticated, "two sessions share uid %d; cannot tell which is calling", uid)
	}
	id, ok := r.byUID[uid]
	if !ok {
		return nil, capability.Errorf(capability.Unauthenticated, "uid %d is not a session's", uid)
	}
	return r.Sessions.ByIDAnyTenant(ctx, id)
}

// Serve serves h on ln for code in sessions until ctx ends.
//
// Code in a box is hostile, so the server holds nothing for it without a
// bound: ln is capped (a *connlimit.Listener as given, else wrapped with
// InSessionLimits) in all and per peer uid, so a background process of one
// session cannot take the server's descriptors; headers, bodies, idle
// keep-alive connections and responses have connlimit's timeouts.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	if _, ok := ln.(*connlimit.Listener); !ok {
		ln = connlimit.New(ln, InSessionLimits(nil))
	}
	srv := connlimit.NewServer(h, connlimit.HTTPOptions{
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

// InSessionLimits are the in-session socket's connection limits: 1024 in
// all, 32 per peer uid (so per session); over them a connection is
// refused, never another's evicted (a uid cannot be forged, so one session
// cannot take another's share).
func InSessionLimits(log *slog.Logger) connlimit.Options {
	return connlimit.Options{Name: "insession", Max: 1024, PerPeer: 32, Peer: connlimit.PeerUID,
		Refusal: connlimit.HTTPRefusal("in-session"), Logger: log}
}
