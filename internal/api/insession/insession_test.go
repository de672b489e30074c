package insession_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
)

// sessionsOf opens a store and a session manager under dir with two
// sessions of two tenants: c5's "alpha" and c23's "beta".
func sessionsOf(t *testing.T, dir string, hooks *session.BoxHooks) (*session.Manager, *session.Session, *session.Session) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := session.Open(ctx, st, dir, hooks)
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Create(session.WithTenant(ctx, "c5"), "alpha")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create(session.WithTenant(ctx, "c23"), "beta")
	if err != nil {
		t.Fatal(err)
	}
	return m, a, b
}

// whoami answers with the session Auth resolves, or 401 and the error.
func whoami(r *insession.Resolver) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := r.Auth(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "session=%s tenant=%s", c.Session, c.Tenant)
	})
}

// curlAs requests /whoami on the in-session socket from a real box whose
// process runs under s's uid, with bind as its socket, the way code in a
// session calls back; it returns what curl printed and its exit status.
func curlAs(t *testing.T, sb *sandbox.Sandbox, s *session.Session, bind []sandbox.Bind) (string, int) {
	t.Helper()
	var out strings.Builder
	exit, err := sb.Run(context.Background(), &sandbox.Spec{
		Args: []string{"curl", "-sS", "--unix-socket", insession.SocketInBox, "http://quro/whoami"},
		Dir:  s.Workspace(), TmpDir: s.TmpDir(), UID: s.UID, Binds: bind,
		Stdout: &out, Stderr: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), exit.Code
}

// A session's socket answers only as that session, and only to processes
// running under that session's uid: another session's process cannot
// connect (the socket is its owner's alone), and when the mode would let
// it, the server refuses it on its peer uid. Destroying the session
// removes the socket.
func TestSocketIsItsSessionsAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: sessions have uids of their own only under a root server")
	}
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Skip("needs curl")
	}
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Boxed() {
		t.Skip("needs the box (bubblewrap)")
	}
	dir := t.TempDir()
	// The server is made first, the Manager with its hooks: the server
	// asks the Manager only once boxes are made.
	var m *session.Manager
	exists := func(ctx context.Context, id string) bool { return m.Exists(ctx, id) }
	resolver := &insession.Resolver{}
	srv := insession.NewServer(context.Background(), dir, exists, whoami(resolver), nil)
	m, a, b := sessionsOf(t, dir, srv.Hooks())
	resolver.Sessions = m
	t.Cleanup(srv.Close)
	// The session's binds: its workspace at /home/user, and its socket.
	var sock string
	for _, bd := range a.Binds() {
		if bd.Dst == insession.SocketInBox {
			if sock != "" || bd.Src != insession.SocketPath(dir, a.ID) || bd.Writable {
				t.Fatalf("binds %+v", a.Binds())
			}
			sock = bd.Src
		}
	}
	if sock == "" {
		t.Fatalf("no socket among the binds %+v", a.Binds())
	}
	binds := []sandbox.Bind{{Src: sock, Dst: insession.SocketInBox}}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != a.UID || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket owned by %d mode %v; want %d and 0600", st.Uid, fi.Mode().Perm(), a.UID)
	}
	if out, code := curlAs(t, sb, a, binds); code != 0 || out != "session="+a.ID+" tenant=c5" {
		t.Fatalf("the session itself: %d %q", code, out)
	}
	// c23's process given c5's socket: no connection at all.
	if out, code := curlAs(t, sb, b, binds); code == 0 || strings.Contains(out, "session=") {
		t.Fatalf("another session's uid connected: %d %q", code, out)
	}
	// And if the socket's mode let it in, the server refuses it.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if out, code := curlAs(t, sb, b, binds); code != 0 || !strings.Contains(out, "not of the session") || strings.Contains(out, "session=") {
		t.Fatalf("another session's uid answered as c5: %d %q", code, out)
	}
	// b's own socket is b's.
	if out, _ := curlAs(t, sb, b, b.Binds()); out != "session="+b.ID+" tenant=c23" {
		t.Fatalf("b's socket: %q", out)
	}
	if err := m.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket of a destroyed session left: %v", err)
	}
	for _, bd := range a.Binds() {
		if bd.Dst == insession.SocketInBox {
			t.Fatalf("a destroyed session got a socket: %+v", a.Binds())
		}
	}
	if srv.Sockets() != 1 {
		t.Fatalf("%d sockets served, want b's only", srv.Sockets())
	}
}

// The resolver decides on every request from the store: a session's uid
// is accepted on its own socket only, a destroyed session's socket answers
// nobody, and a request without a peer or a socket is refused.
func TestResolverChecksEveryRequest(t *testing.T) {
	dir := t.TempDir()
	m, a, b := sessionsOf(t, dir, nil)
	r := &insession.Resolver{Sessions: m}
	ask := func(id string, uid int, withPeer bool) (string, int) {
		req, _ := http.NewRequest("GET", "http://quro/whoami", nil)
		ctx := req.Context()
		if withPeer {
			ctx = insession.WithPeer(ctx, &syscall.Ucred{Pid: 1, Uid: uint32(uid), Gid: uint32(uid)})
		}
		rec := &recorder{h: http.Header{}}
		h := whoami(r)
		if id != "" {
			h = insession.ForSession(id, h)
		}
		h.ServeHTTP(rec, req.WithContext(ctx))
		return rec.body.String(), rec.code
	}
	if out, _ := ask(a.ID, a.UID, true); out != "session="+a.ID+" tenant=c5" {
		t.Fatalf("a on a: %q", out)
	}
	for _, tc := range []struct {
		name     string
		id       string
		uid      int
		withPeer bool
	}{
		{"b's uid on a's socket", a.ID, b.UID, true},
		{"a's uid on b's socket", b.ID, a.UID, true},
		{"no peer", a.ID, a.UID, false},
		{"no socket", "", a.UID, true},
		{"root", a.ID, 0, true},
		{"unknown session", strings.Repeat("f", 32), a.UID, true},
	} {
		if out, code := ask(tc.id, tc.uid, tc.withPeer); code != http.StatusUnauthorized || strings.Contains(out, "session=") {
			t.Errorf("%s: %d %q", tc.name, code, out)
		}
	}
	// A spare session (nobody's until claimed) answers nobody, not even
	// its own uid: it would otherwise be a caller of the tenant "-spare".
	spare, err := m.CreateSpare(context.Background(), "c5", "none")
	if err != nil {
		t.Fatal(err)
	}
	if out, code := ask(spare.ID, spare.UID, true); code != http.StatusUnauthorized || strings.Contains(out, "session=") {
		t.Errorf("a spare's own uid on its socket: %d %q", code, out)
	}
	if err := m.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if out, code := ask(a.ID, a.UID, true); code != http.StatusUnauthorized || !strings.Contains(out, "destroyed") {
		t.Fatalf("destroyed session answered: %d %q", code, out)
	}
}

type recorder struct {
	h    http.Header
	code int
	body strings.Builder
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(c int) {
	if r.code == 0 {
		r.code = c
	}
}

// A data directory too deep for a socket path is refused with a message
// that says so, not bind's "invalid argument".
func TestListenRefusesTooLongAPath(t *testing.T) {
	_, err := insession.Listen(filepath.Join(t.TempDir(), strings.Repeat("d", 120), "x.sock"), 0)
	if err == nil || !strings.Contains(err.Error(), "shorter data directory") {
		t.Fatalf("%v", err)
	}
}

// One tenant cannot hold every in-session connection: its sessions
// together get a share of the sockets' total, past which its connections
// are refused with a message naming the share, while another tenant's
// sessions still connect. Real sockets, real connections.
func TestTenantShareOfConnections(t *testing.T) {
	dir := t.TempDir()
	var m *session.Manager
	exists := func(ctx context.Context, id string) bool { return m.Exists(ctx, id) }
	tenantOf := func(ctx context.Context, id string) string {
		if s, err := m.ByIDAnyTenant(ctx, id); err == nil {
			return s.Tenant
		}
		return ""
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	// A total of 64: each tenant's share is 32, one session's own cap.
	srv := insession.NewServer(context.Background(), dir, exists, ok, &insession.Options{MaxConns: 64, Tenant: tenantOf})
	t.Cleanup(srv.Close)
	m, a1, b := sessionsOf(t, dir, srv.Hooks())
	a2, err := m.Create(session.WithTenant(context.Background(), "c5"), "alpha2")
	if err != nil {
		t.Fatal(err)
	}
	if st := srv.Shares(); st.Max != 64 || st.PerTenant != 32 {
		t.Fatalf("shares %+v", st)
	}
	sock := func(s *session.Session) string {
		for _, bd := range srv.Binds(s) {
			return bd.Src
		}
		t.Fatalf("no socket for %s", s.Name)
		return ""
	}
	// get makes a connection to path and a request on it, kept open; it
	// returns the answer's status line and body.
	get := func(path string) (string, string) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// A refused connection is answered and closed at once, and the
		// request may then meet a closed socket (EPIPE): the answer is
		// read all the same.
		_, werr := io.WriteString(c, "GET / HTTP/1.1\r\nHost: quro\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil && werr != nil {
			err = werr
		}
		if err != nil {
			return err.Error(), ""
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.Status, string(body)
	}
	pa1, pa2, pb := sock(a1), sock(a2), sock(b)
	// c5 holds 32 connections: 20 on one session's socket, 12 on another's.
	for i := range 32 {
		p := pa1
		if i >= 20 {
			p = pa2
		}
		if st, body := get(p); st != "200 OK" || body != "ok" {
			t.Fatalf("c5's connection %d: %s %q", i, st, body)
		}
	}
	// c5 is at its share on both sockets, though neither session is at
	// its own cap.
	for _, p := range []string{pa1, pa2} {
		if st, body := get(p); !strings.HasPrefix(st, "503") || !strings.Contains(body, "tenant's share of the in-session connections") || !strings.Contains(body, "32 of the server's 64") {
			t.Fatalf("c5 past its share: %s %q", st, body)
		}
	}
	// c23's session still connects, as often as its share allows.
	for i := range 5 {
		if st, body := get(pb); st != "200 OK" || body != "ok" {
			t.Fatalf("c23's connection %d while c5 holds its share: %s %q", i, st, body)
		}
	}
	if st := srv.Stats(); st.RefusedShare != 2 || st.Open != 37 {
		t.Fatalf("stats %+v", st)
	}
	if st := srv.Shares(); st.Held != 37 || st.Tenants != 2 || st.Top != 32 {
		t.Fatalf("shares %+v", st)
	}
}
