package ws_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// tokenIDAuth: tokens "t1" and "t2" of tenant alice, each its own token id.
func tokenIDAuth(r *http.Request) (controller.Caller, error) {
	switch tok := httpauth.Bearer(r); tok {
	case "t1", "t2":
		return controller.Caller{Tenant: "alice", Scope: capability.ScopeExec, TokenID: tok}, nil
	}
	return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "a valid token is needed")
}

func setupWith(t *testing.T, o ws.Options) *env {
	t.Helper()
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	o.Access = rest.Access{Auth: tokenIDAuth}
	o.PTY = a.OpenPTY
	w := ws.New(a.Controller, &o)
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: o.Access, WebSocket: w.Handlers()}))
	t.Cleanup(srv.Close)
	t.Cleanup(w.Wait)
	return &env{a: a, ws: w, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
}

func bearer(tok string) []string { return []string{ws.Protocol, ws.BearerPrefix + tok} }

// A client that answers pings (coder/websocket does, while it reads) is
// kept past many idle timeouts; a connection that completed the upgrade
// and then answers nothing is closed once a ping goes unanswered.
func TestIdleTimeoutKeepsAnsweringClientsAndClosesSilentOnes(t *testing.T) {
	// Pings every 750 ms, each to be answered within 3 s: a client that
	// answers must never be taken for silent by a loaded machine's late
	// wake-up (1 s of slack was thin at a load of 60).
	const idle = 3 * time.Second
	e := setupWith(t, ws.Options{IdleTimeout: idle})
	s := e.session(t, "idle")
	pty := "/v1/sessions/" + s.ID + "/pty"

	c, resp, err := e.dial(t, pty, bearer("t1"), nil)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	defer c.CloseNow()
	out := make(chan string, 1024)
	go func() {
		defer close(out)
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			out <- string(b)
		}
	}()

	// The silent one: the upgrade by hand on a raw connection, then
	// nothing; reading what the server sends answers no ping.
	raw, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	req := "GET " + pty + " HTTP/1.1\r\nHost: " + e.srv.Listener.Addr().String() +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13" +
		"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: quro.v1, quro.bearer.t2\r\n\r\n"
	if _, err := raw.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(raw)
	up, err := http.ReadResponse(br, nil)
	if err != nil || up.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("raw upgrade: %v %v", up, err)
	}
	// The server closes it: the read ends (EOF or a reset), well before
	// this generous deadline.
	raw.SetReadDeadline(time.Now().Add(2 * time.Minute))
	_, err = io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the silent connection was not closed: %v", err)
	}

	// By now the answering client has been pinged many times over more
	// than one idle timeout; it still works.
	time.Sleep(2 * idle)
	if err := c.Write(ctxT(t), websocket.MessageBinary, []byte("echo still-$((2+3))\n")); err != nil {
		t.Fatalf("the answering client was closed: %v", err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "still-5") {
		b, ok := <-out
		if !ok {
			t.Fatalf("the answering client was closed; it read %q", got.String())
		}
		got.WriteString(b)
	}
	c.Close(websocket.StatusNormalClosure, "bye")
}

// The cap counts one token's connections on every WebSocket route: the
// one past it is refused with 429 before the upgrade, another token
// still gets one, and a closed connection frees its place.
func TestStreamsPerTokenCap(t *testing.T) {
	lim := streamcap.New(2, "--max-streams-per-token")
	e := setupWith(t, ws.Options{Streams: lim})
	s := e.session(t, "cap")
	pty := "/v1/sessions/" + s.ID + "/pty"
	t1 := controller.Caller{Tenant: "alice", TokenID: "t1"}

	var held []*websocket.Conn
	for range 2 {
		c, resp, err := e.dial(t, pty, bearer("t1"), nil)
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		t.Cleanup(func() { c.CloseNow() })
		readMsg(t, c) // hello
		held = append(held, c)
	}
	for _, path := range []string{pty, "/v1/stream/run_code"} {
		_, resp, err := e.dial(t, path, bearer("t1"), nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: a third connection of the token: %v, %v; want 429", path, resp, err)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: 429 without Retry-After", path)
		}
	}
	other, resp, err := e.dial(t, pty, bearer("t2"), nil)
	if err != nil {
		t.Fatalf("another token was refused: %v (%v)", err, resp)
	}
	defer other.CloseNow()

	held[0].Close(websocket.StatusNormalClosure, "bye")
	for lim.Held(t1) > 1 { // the handler returns after the close
		time.Sleep(10 * time.Millisecond)
	}
	c, resp, err := e.dial(t, pty, bearer("t1"), nil)
	if err != nil {
		t.Fatalf("a place freed by a close was not given: %v (%v)", err, resp)
	}
	c.CloseNow()
}
