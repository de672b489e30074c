package mcp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mgclient "github.com/mark3labs/mcp-go/client"
	mgtransport "github.com/mark3labs/mcp-go/client/transport"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/controller"
)

var (
	adminCaller = controller.Caller{Tenant: "alice", TokenID: "t-admin"}
	roCaller    = controller.Caller{Tenant: "alice", TokenID: "t-ro"}
)

// openStream opens the event stream of an initialized session with a raw
// GET; the response's headers have arrived when it returns.
func openStream(ctx context.Context, t *testing.T, url, token, session string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// silentSession initializes a session by hand, as a client that will not
// answer pings.
func silentSession(t *testing.T, url, token string) string {
	t.Helper()
	id := rawInitialize(t, url, token)
	if r := rawPost(t, url, token, id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.StatusCode != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", r.StatusCode, bodyOf(r))
	}
	return id
}

func waitHeld(t *testing.T, lim *streamcap.Limiter, c controller.Caller, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for lim.Held(c) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d streams, want %d", c.TokenID, lim.Held(c), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHTTPStreamKeepalive: the Go SDK's client, which answers pings,
// keeps its event stream past many idle timeouts and goes on calling; a
// client that holds the stream but answers no ping has it ended (its
// session stays, for its POSTs).
func TestHTTPStreamKeepalive(t *testing.T) {
	// Pings every 750 ms, each to be answered within 3 s: a client that
	// answers must never be taken for silent by a loaded machine's late
	// wake-up (1 s of slack was thin at a load of 60).
	const idle = 3 * time.Second
	var ended atomic.Int32
	t.Cleanup(quromcp.OnStreamEnded(func() { ended.Add(1) }))
	a := newApp(t)
	lim := streamcap.New(4, "--max-streams-per-token")
	h := quromcp.Handler(a.Controller, tokens, &quromcp.Options{Streams: lim, StreamIdleTimeout: idle})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	rt := &bearer{}
	rt.token.Store("admin")
	cs, err := connectHTTP(t, srv.URL, rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitHeld(t, lim, adminCaller, 1) // the SDK's client opens its stream

	silent := silentSession(t, srv.URL, "ro")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp := openStream(ctx, t, srv.URL, "ro", silent)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %d %s", resp.StatusCode, bodyOf(resp))
	}
	_, err = io.Copy(io.Discard, resp.Body) // reads the pings, answers none
	resp.Body.Close()
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		t.Fatalf("the stream of a client that answers no ping was not ended: %v", err)
	}
	if n := ended.Load(); n != 1 {
		t.Fatalf("%d streams ended, want the silent one", n)
	}
	waitHeld(t, lim, roCaller, 0)
	if n := h.(quromcp.Counter).Count(); n != 2 {
		t.Errorf("%d sessions after the stream ended, want both kept", n)
	}

	// The SDK's client has answered pings over more than an idle
	// timeout by now; its stream stands and it still calls.
	time.Sleep(2 * idle)
	if n := ended.Load(); n != 1 {
		t.Fatalf("the stream of a client that answers pings was ended (%d ended)", n)
	}
	if got := lim.Held(adminCaller); got != 1 {
		t.Errorf("the SDK client holds %d streams, want 1", got)
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatalf("the SDK client after the idle timeouts: %v", err)
	}
}

// TestHTTPStreamsPerTokenCap: the event stream past a token's cap is
// refused with 429, naming the cap; another token still gets one; an
// ended stream frees its place.
func TestHTTPStreamsPerTokenCap(t *testing.T) {
	a := newApp(t)
	lim := streamcap.New(1, "--max-streams-per-token")
	srv := httptest.NewServer(quromcp.Handler(a.Controller, tokens, &quromcp.Options{Streams: lim}))
	t.Cleanup(srv.Close)

	s1, s2 := silentSession(t, srv.URL, "ro"), silentSession(t, srv.URL, "ro")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx1, cancel1 := context.WithCancel(ctx)
	first := openStream(ctx1, t, srv.URL, "ro", s1)
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first GET: %d %s", first.StatusCode, bodyOf(first))
	}
	refused := openStream(ctx, t, srv.URL, "ro", s2)
	body := bodyOf(refused)
	if refused.StatusCode != http.StatusTooManyRequests || refused.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, "--max-streams-per-token") {
		t.Fatalf("a second stream of the token: %d %q; want 429 naming the cap", refused.StatusCode, body)
	}

	rt := &bearer{}
	rt.token.Store("admin")
	cs, err := connectHTTP(t, srv.URL, rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitHeld(t, lim, adminCaller, 1)
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}

	cancel1()
	first.Body.Close()
	waitHeld(t, lim, roCaller, 0)
	again := openStream(ctx, t, srv.URL, "ro", s2)
	defer again.Body.Close()
	if again.StatusCode != http.StatusOK {
		t.Fatalf("a stream in the place freed: %d %s", again.StatusCode, bodyOf(again))
	}
}

// TestMcpGoClientWithoutStreamIsKept: mcp-go's client keeps no event
// stream by default, so no ping reaches it; its session is not closed for
// that (as the SDK's own KeepAlive would), and it goes on calling past
// many idle timeouts.
func TestMcpGoClientWithoutStreamIsKept(t *testing.T) {
	const idle = time.Second
	var ended atomic.Int32
	t.Cleanup(quromcp.OnStreamEnded(func() { ended.Add(1) }))
	a := newApp(t)
	lim := streamcap.New(4, "--max-streams-per-token")
	h := quromcp.Handler(a.Controller, tokens, &quromcp.Options{Streams: lim, StreamIdleTimeout: idle})
	tr, err := mgtransport.NewStreamableHTTP(serveHandler(t, h),
		mgtransport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer admin"}))
	if err != nil {
		t.Fatal(err)
	}
	c := mgclient.NewClient(tr, mgclient.WithProtocolVersion("2025-11-25"))
	defer c.Close()
	startMcpGo(t, c)
	time.Sleep(3 * idle)
	if n := ended.Load(); n != 0 {
		t.Fatalf("%d streams ended", n)
	}
	if n := h.(quromcp.Counter).Count(); n != 1 {
		t.Fatalf("%d sessions after the idle timeouts, want mcp-go's", n)
	}
	if o := mcpGoCall(t, c, "run_code", map[string]any{"lang": "shell", "code": "echo kept"}); o.IsError || !strings.Contains(o.text(), "kept") {
		t.Fatalf("mcp-go after the idle timeouts: %+v", o)
	}
}
