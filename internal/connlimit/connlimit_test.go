package connlimit_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/connlimit"
	"github.com/quro-dev/quro/internal/share"
)

// serve starts the package's server on a capped loopback listener: /public
// answers anyone, everything else needs "Bearer good" (401 otherwise).
func serve(t *testing.T, opts *connlimit.Options, ho *connlimit.HTTPOptions) (*connlimit.Listener, string) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(raw, opts)
	good := func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer good" }
	var h connlimit.HTTPOptions
	if ho != nil {
		h = *ho
	}
	h.Authenticated = good
	srv := connlimit.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/public" && !good(r) {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, "no token\n")
			return
		}
		io.WriteString(w, "ok\n")
	}), &h)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln, raw.Addr().String()
}

// dial connects from the loopback address from (127.x.y.z).
func dial(t *testing.T, from, to string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a request on c and reads its response.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, path, token string) (*http.Response, string) {
	t.Helper()
	req := "GET " + path + " HTTP/1.1\r\nHost: x\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// closedByServer waits until the server closes c (EOF or reset), having
// sent nothing but, perhaps, a refusal.
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// An attacker without a token, from one address or many, fills the slots
// with half-sent headers and idle keep-alive connections; each new
// connection closes the oldest of them, so an authenticated client always
// gets in and, once authenticated, stays. Only trusted connections make
// the listener refuse.
func TestEvictsUnauthenticatedForNewcomers(t *testing.T) {
	ln, addr := serve(t, &connlimit.Options{Max: 8, PerPeer: 4, Evict: true, Refusal: connlimit.HTTPRefusal("test")}, nil)

	// One address: half-sent headers. Past 4, each new one closes that
	// address's oldest.
	var one []net.Conn
	for range 10 {
		c := dial(t, "127.0.0.1", addr)
		io.WriteString(c, "GET /public HTTP/1.1\r\nHost: x\r\n")
		one = append(one, c)
	}
	for i, c := range one[:6] {
		if got := closedByServer(t, c); got != "" {
			t.Fatalf("evicted connection %d got %q", i, got)
		}
	}
	if s := ln.Stats(); s.Open != 4 || s.Pending != 4 || s.Evicted != 6 {
		t.Fatalf("after one address's flood: %+v", s)
	}

	// Many addresses (127.0.1.x), idle keep-alive after a public answer:
	// the total stays at 8.
	var many []net.Conn
	for i := range 20 {
		c := dial(t, fmt.Sprintf("127.0.1.%d", i+1), addr)
		if resp, body := roundTrip(t, c, bufio.NewReader(c), "/public", ""); resp.StatusCode != 200 || body != "ok\n" {
			t.Fatalf("public: %d %q", resp.StatusCode, body)
		}
		many = append(many, c)
		if s := ln.Stats(); s.Open > 8 {
			t.Fatalf("%d connections held; the cap is 8", s.Open)
		}
	}
	for _, c := range many[:12] {
		closedByServer(t, c)
	}

	// The admin gets in from the flooded address, and stays through
	// another flood.
	admin := dial(t, "127.0.0.1", addr)
	abr := bufio.NewReader(admin)
	if resp, body := roundTrip(t, admin, abr, "/v1/x", "good"); resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("admin: %d %q", resp.StatusCode, body)
	}
	var more []net.Conn
	for i := range 20 {
		c := dial(t, fmt.Sprintf("127.0.2.%d", i+1), addr)
		io.WriteString(c, "GET /public HTTP/1.1\r\n")
		more = append(more, c)
	}
	for _, c := range more[:13] { // 7 pending slots are left beside the admin
		closedByServer(t, c)
	}
	if resp, body := roundTrip(t, admin, abr, "/v1/x", "good"); resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("admin after the flood: %d %q", resp.StatusCode, body)
	}
	if s := ln.Stats(); s.Open != 8 || s.Pending != 7 {
		t.Fatalf("after the floods: %+v", s)
	}

	// Trusted connections are never evicted: with all 8 trusted, a new
	// one is refused at once with a 503.
	for i := range 7 {
		c := dial(t, fmt.Sprintf("127.0.3.%d", i+1), addr)
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/v1/x", "good"); resp.StatusCode != 200 {
			t.Fatalf("trusted %d: %d", i, resp.StatusCode)
		}
	}
	c := dial(t, "127.0.4.1", addr)
	if got := closedByServer(t, c); !strings.HasPrefix(got, "HTTP/1.1 503") || !strings.Contains(got, "connection limit") {
		t.Fatalf("over the cap with every slot trusted: %q", got)
	}
	if s := ln.Stats(); s.Open != 8 || s.Pending != 0 || s.RefusedTotal != 1 {
		t.Fatalf("all trusted: %+v", s)
	}
}

// Without eviction (the in-session socket), a peer over its share is
// refused, and other peers are not affected.
func TestPerPeerRefusal(t *testing.T) {
	ln, addr := serve(t, &connlimit.Options{Max: 10, PerPeer: 3, Refusal: connlimit.HTTPRefusal("test")}, nil)
	var held []net.Conn
	for range 3 {
		c := dial(t, "127.0.0.1", addr)
		io.WriteString(c, "GET /public HTTP/1.1\r\n")
		held = append(held, c)
	}
	for range 5 {
		c := dial(t, "127.0.0.1", addr)
		if got := closedByServer(t, c); !strings.HasPrefix(got, "HTTP/1.1 503") {
			t.Fatalf("over the peer's share: %q", got)
		}
	}
	c := dial(t, "127.0.0.2", addr)
	if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/v1/x", "good"); resp.StatusCode != 200 {
		t.Fatalf("another peer: %d", resp.StatusCode)
	}
	if s := ln.Stats(); s.RefusedPeer != 5 {
		t.Fatalf("%+v", s)
	}
	// Without eviction, the peer's own connections were never touched:
	// each still completes its request.
	for i, c := range held {
		if _, err := io.WriteString(c, "Host: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 12)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "HTTP/1.1 200" {
			t.Fatalf("held connection %d: %q %v", i, buf, err)
		}
	}
}

// A client without credentials holds nothing once answered: the 401
// closes the connection. Half-sent headers and idle keep-alive
// connections end at their timeouts.
func TestTimeoutsAndCloseOn401(t *testing.T) {
	_, addr := serve(t, &connlimit.Options{Max: 10}, &connlimit.HTTPOptions{HeaderTimeout: 100 * time.Millisecond, IdleTimeout: 100 * time.Millisecond})
	c := dial(t, "127.0.0.1", addr)
	br := bufio.NewReader(c)
	resp, _ := roundTrip(t, c, br, "/v1/x", "")
	if resp.StatusCode != 401 || !resp.Close {
		t.Fatalf("tokenless: %d close=%v", resp.StatusCode, resp.Close)
	}
	if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
		t.Fatalf("after the 401: %q %v", rest, err)
	}
	half := dial(t, "127.0.0.1", addr)
	io.WriteString(half, "GET /public HTTP/1.1\r\nHost: x\r\n")
	closedByServer(t, half) // the header timeout
	idle := dial(t, "127.0.0.1", addr)
	ibr := bufio.NewReader(idle)
	if resp, _ := roundTrip(t, idle, ibr, "/public", ""); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("public: %d close=%v", resp.StatusCode, resp.Close)
	}
	if rest, err := io.ReadAll(ibr); len(rest) != 0 || err != nil { // the idle timeout
		t.Fatalf("idle: %q %v", rest, err)
	}
}

// Listeners sharing a share.Pool hold at most its size together (the
// sessions' sockets: one listener each, one total), and each tenant at
// most its share: two tenants, a at its share is refused with the share
// refusal while b still connects, until the total refuses b too; a place
// freed on one listener is usable on another.
func TestSharedPoolSpansListenersAndTenants(t *testing.T) {
	pool := share.New("test connections", 3, 2)
	tenant := func(c net.Conn) string {
		if strings.HasPrefix(c.RemoteAddr().String(), "127.0.0.1:") || strings.HasPrefix(c.RemoteAddr().String(), "127.0.0.2:") {
			return "a"
		}
		return "b"
	}
	opts := &connlimit.Options{Name: "shared", PerPeer: 2, Shared: pool, Tenant: tenant,
		Refusal: connlimit.HTTPRefusal("shared"), ShareRefusal: []byte("HTTP/1.1 503 share\r\n\r\n")}
	_, addr1 := serve(t, opts, nil)
	ln2, addr2 := serve(t, opts, nil)
	ok := func(what, ip, addr string) net.Conn {
		t.Helper()
		c := dial(t, ip, addr)
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/public", ""); resp.StatusCode != 200 {
			t.Fatalf("%s: %d", what, resp.StatusCode)
		}
		return c
	}
	c1 := ok("a's first", "127.0.0.1", addr1)
	ok("a's second", "127.0.0.2", addr2)
	// a at its share, on a listener where its peer holds nothing.
	if got := closedByServer(t, dial(t, "127.0.0.2", addr1)); !strings.Contains(got, "503 share") {
		t.Fatalf("a past its share got %q", got)
	}
	ok("b's first", "127.0.0.3", addr2)
	if pool.Stats().Held != 3 {
		t.Fatalf("pool %+v, want 3 held", pool.Stats())
	}
	// Over the shared total: refused on the second listener, though b
	// holds less than its share there.
	if got := closedByServer(t, dial(t, "127.0.0.4", addr2)); !strings.Contains(got, "at its connection limit") {
		t.Fatalf("b over the total got %q, want the listener's refusal", got)
	}
	if s := ln2.Stats(); s.RefusedTotal != 1 {
		t.Fatalf("listener 2 stats %+v, want one refusal for the total", s)
	}
	// Freeing a place of a's on the first listener lets b take it on the
	// second.
	c1.Close()
	for pool.Held("a") != 1 {
		runtime.Gosched() // the server goroutine notices the close
	}
	ok("b after a's close", "127.0.0.4", addr2)
	if s := pool.Stats(); s.RefusedShare != 1 || s.RefusedFull != 1 {
		t.Fatalf("pool %+v", s)
	}
}

// TestNilOptionsAreDefaults: nil options mean no limit and the package's
// timeouts, as for every constructor of the project.
func TestNilOptionsAreDefaults(t *testing.T) {
	ln, addr := serve(t, nil, nil)
	if o := ln.Options(); o.Max != 0 || o.PerPeer != 0 || o.Peer == nil || o.Logger == nil {
		t.Errorf("options %+v", o)
	}
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() }) // all three stay open: no limit
		if _, err := io.WriteString(c, "GET /public HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 12)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "HTTP/1.1 200" {
			t.Fatalf("connection %d: %q %v", i, buf, err)
		}
	}
	srv := connlimit.NewServer(http.NotFoundHandler(), nil)
	if srv.ReadHeaderTimeout != connlimit.HeaderTimeout || srv.IdleTimeout != connlimit.IdleTimeout {
		t.Errorf("timeouts %v %v", srv.ReadHeaderTimeout, srv.IdleTimeout)
	}
}

// The attack: a token holder fills every slot with authenticated
// keep-alive connections that then do nothing. With EvictIdle, a newcomer
// (even one without a token) takes the slot of the one idle the longest,
// which is closed; a trusted connection with a request in flight is never
// taken, so when every slot is busy, the newcomer is refused.
func TestEvictIdleTrusted(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(raw, &connlimit.Options{Max: 4, PerPeer: 3, Evict: true, EvictIdle: true, Refusal: connlimit.HTTPRefusal("test")})
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv := connlimit.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok\n")
	}), &connlimit.HTTPOptions{Authenticated: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer good" }})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr := raw.Addr().String()
	waitStats := func(what string, ok func(connlimit.Stats) bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for s := ln.Stats(); !ok(s); s = ln.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v", what, s)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// One peer holds its 3 slots with idle authenticated connections: its
	// fourth connection takes the slot of the first.
	var held []net.Conn
	for range 3 {
		c := dial(t, "127.0.0.1", addr)
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/x", "good"); resp.StatusCode != 200 {
			t.Fatalf("trusted: %d", resp.StatusCode)
		}
		held = append(held, c)
		// The server marks a connection idle after its answer: wait, so
		// that the first one is the longest idle.
		waitStats("idle trusted", func(s connlimit.Stats) bool { return s.Idle == len(held) })
	}
	c4 := dial(t, "127.0.0.1", addr)
	if got := closedByServer(t, held[0]); got != "" {
		t.Fatalf("the evicted idle connection got %q", got)
	}
	br4 := bufio.NewReader(c4)
	if resp, body := roundTrip(t, c4, br4, "/x", "good"); resp.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("the newcomer: %d %q", resp.StatusCode, body)
	}
	for i, c := range held[1:] { // the others are still served
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/x", "good"); resp.StatusCode != 200 {
			t.Fatalf("held %d: %d", i+1, resp.StatusCode)
		}
	}
	if s := ln.Stats(); s.EvictedIdle != 1 || s.Open != 3 {
		t.Fatalf("after the peer's eviction: %+v", s)
	}

	// Busy trusted connections are not taken: with all 4 slots at work
	// (3 of one peer, 1 of another), a newcomer is refused with a 503.
	busy := []net.Conn{held[1], held[2], c4, dial(t, "127.0.0.2", addr)}
	for _, c := range busy {
		if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitStats("four busy", func(s connlimit.Stats) bool { return s.Open == 4 && s.Idle == 0 && s.Pending == 0 })
	if got := closedByServer(t, dial(t, "127.0.0.3", addr)); !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Fatalf("over the cap with every slot busy: %q", got)
	}
	unblock()
	for i, c := range busy {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("busy %d: %v %v", i, resp, err)
		}
		resp.Body.Close()
	}
	waitStats("four idle", func(s connlimit.Stats) bool { return s.Idle == 4 })
	if s := ln.Stats(); s.EvictedIdle != 1 {
		t.Fatalf("busy connections were evicted: %+v", s)
	}
}

// Without EvictIdle, idle trusted connections are kept: the newcomer is
// refused (the in-session socket and Evict alone).
func TestIdleTrustedKeptWithoutEvictIdle(t *testing.T) {
	ln, addr := serve(t, &connlimit.Options{Max: 2, Evict: true, Refusal: connlimit.HTTPRefusal("test")}, nil)
	for i := range 2 {
		c := dial(t, fmt.Sprintf("127.0.5.%d", i+1), addr)
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), "/x", "good"); resp.StatusCode != 200 {
			t.Fatalf("trusted %d: %d", i, resp.StatusCode)
		}
	}
	if got := closedByServer(t, dial(t, "127.0.5.9", addr)); !strings.HasPrefix(got, "HTTP/1.1 503") {
		t.Fatalf("over the cap: %q", got)
	}
	if s := ln.Stats(); s.EvictedIdle != 0 || s.Open != 2 {
		t.Fatalf("%+v", s)
	}
}

// A connection of the listener passes a copy from a file on to the TCP
// connection it wraps (the kernel's copy): the HTTP server finds
// io.ReaderFrom on it, and the bytes arrive whole.
func TestConnReadFromPassesFilesOn(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := connlimit.New(raw, nil)
	defer ln.Close()
	want := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	path := t.TempDir() + "/f"
	if err := os.WriteFile(path, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	rf, ok := c.(io.ReaderFrom)
	if !ok {
		t.Fatalf("%T is no io.ReaderFrom", c)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := rf.ReadFrom(io.LimitReader(f, int64(len(want))))
	c.Close()
	if err != nil || n != int64(len(want)) {
		t.Fatalf("ReadFrom: %d bytes, %v", n, err)
	}
	if g := <-got; g != want {
		t.Fatalf("received %d bytes, want %d", len(g), len(want))
	}
}

// A response of the server NewServer makes passes a copy from a file on
// to the connection (the kernel's copy, sendfile, on a TCP connection):
// the handler's writer is an io.ReaderFrom whose copy reaches the
// connection's own ReadFrom, and the bytes arrive whole. The writer the
// handler gets wraps the server's (closeOnRefusal): without a ReadFrom of
// its own, the server copied every file through a 32 KiB buffer.
func TestServerPassesAFileCopyToTheConnection(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &readFromCounter{Listener: raw}
	ln := connlimit.New(counted, nil)
	want := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	path := t.TempDir() + "/f"
	if err := os.WriteFile(path, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := connlimit.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rf, ok := w.(io.ReaderFrom)
		if !ok {
			http.Error(w, fmt.Sprintf("%T is no io.ReaderFrom", w), http.StatusInternalServerError)
			return
		}
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Length", fmt.Sprint(len(want)))
		rf.ReadFrom(io.LimitReader(f, int64(len(want))))
	}), nil)
	go srv.Serve(ln)
	defer srv.Close()
	res, err := http.Get("http://" + raw.Addr().String() + "/f")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != 200 || string(b) != want {
		t.Fatalf("%d, %d bytes (%v): %.100s", res.StatusCode, len(b), err, b)
	}
	if n := counted.calls.Load(); n == 0 {
		t.Fatal("the file's copy never reached the connection's ReadFrom")
	}
}

// readFromCounter's connections count their ReadFrom calls and pass them
// on to the TCP connection.
type readFromCounter struct {
	net.Listener
	calls atomic.Int64
}

func (l *readFromCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, calls: &l.calls}, nil
}

type countingConn struct {
	net.Conn
	calls *atomic.Int64
}

func (c *countingConn) ReadFrom(r io.Reader) (int64, error) {
	c.calls.Add(1)
	return c.Conn.(io.ReaderFrom).ReadFrom(r)
}
