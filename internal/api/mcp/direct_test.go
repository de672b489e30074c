package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// rpcAnswer is one JSON-RPC answer as a raw client reads it.
type rpcAnswer struct {
	status      int
	contentType string
	ID          json.RawMessage `json:"id"`
	Result      *outcome        `json:"result"`
	Error       *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func rawRPC(t *testing.T, s *rawSession, token, body string) *rpcAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, data, err := s.postAs(ctx, token, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	a := &rpcAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type")}
	if resp.StatusCode != http.StatusOK {
		return a
	}
	msg, err := jsonRPCMessage(a.contentType, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(msg, a); err != nil {
		t.Fatalf("%v: %s", err, msg)
	}
	return a
}

// A plain tools/call is answered with one JSON object, the same result the
// SDK's event stream carries for the same call with a progress token (which
// must stream, so the SDK serves it); the session stays pinned to its caller
// on both paths, and what is not a plain call still reaches the SDK.
func TestHTTPDirectCall(t *testing.T) {
	var mu sync.Mutex
	var records []controller.Record
	a := newApp(t, func(_ context.Context, r *controller.Record) {
		mu.Lock()
		defer mu.Unlock()
		records = append(records, *r)
	})
	calls := func() []controller.Record {
		mu.Lock()
		defer mu.Unlock()
		return append([]controller.Record(nil), records...)
	}
	s := rawConnect(t, http.DefaultClient, serveHTTP(t, a, tokens, nil), "admin")

	direct := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"help","arguments":{}}}`)
	if direct.status != 200 || direct.contentType != "application/json" || string(direct.ID) != "7" || direct.Result == nil || direct.Result.IsError {
		t.Fatalf("a plain call: %d %q id %s %+v", direct.status, direct.contentType, direct.ID, direct.Result)
	}
	streamed := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":"eight","method":"tools/call","params":{"name":"help","arguments":{},"_meta":{"progressToken":"p"}}}`)
	if streamed.status != 200 || streamed.contentType != "text/event-stream" || string(streamed.ID) != `"eight"` || streamed.Result == nil {
		t.Fatalf("a call with a progress token: %d %q id %s %+v", streamed.status, streamed.contentType, streamed.ID, streamed.Result)
	}
	if !reflect.DeepEqual(direct.Result, streamed.Result) {
		t.Fatalf("the direct answer differs from the SDK's:\n%+v\n%+v", direct.Result, streamed.Result)
	}
	if n := len(calls()); n != 2 {
		t.Fatalf("%d calls reached the controller, want 2", n)
	}
	if c := calls()[0].Caller; c.Path != "mcp" || c.TokenID != "t-admin" {
		t.Fatalf("the direct call ran as %+v", c)
	}

	t.Run("string id and run_code", func(t *testing.T) {
		r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":"a\"b","method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(6*7)"}}}`)
		if r.contentType != "application/json" || string(r.ID) != `"a\"b"` || r.Result == nil || r.Result.IsError || !strings.Contains(r.Result.text(), "42") {
			t.Fatalf("%q %s %+v", r.contentType, r.ID, r.Result)
		}
	})

	t.Run("bad arguments are a tool error the model can act on", func(t *testing.T) {
		r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"run_code","arguments":{"cod":"print(1)"}}}`)
		if r.contentType != "application/json" || r.Result == nil || !r.Result.IsError || !strings.Contains(r.Result.text(), "invalid_argument") {
			t.Fatalf("%q %+v", r.contentType, r.Result)
		}
	})

	t.Run("another caller is refused before any tool", func(t *testing.T) {
		before := len(calls())
		for _, tok := range []string{"ro", "wrong"} {
			r := rawRPC(t, s, tok, `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"help","arguments":{}}}`)
			if r.status != http.StatusForbidden && r.status != http.StatusUnauthorized {
				t.Fatalf("token %q on admin's session: HTTP %d", tok, r.status)
			}
		}
		if n := len(calls()); n != before {
			t.Fatalf("%d calls of another caller reached the controller", n-before)
		}
	})

	t.Run("an unknown tool is the SDK's protocol error", func(t *testing.T) {
		r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}`)
		if r.Error == nil || !strings.Contains(r.Error.Message, "unknown tool") {
			t.Fatalf("%d %q %+v %+v", r.status, r.contentType, r.Result, r.Error)
		}
	})

	t.Run("case-mangled keys go to the SDK", func(t *testing.T) {
		// encoding/json would match "Params" to params; the SDK does not,
		// so this call has no name for it.
		r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":12,"method":"tools/call","Params":{"name":"help"}}`)
		if r.status == 200 && r.Result != nil && !r.Result.IsError {
			t.Fatalf("a call without params was served: %+v", r.Result)
		}
	})
}

// recordTypes records the Content-Type of each answer to a POST.
type recordTypes struct {
	mu    sync.Mutex
	types []string
}

func (rt *recordTypes) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost {
		rt.mu.Lock()
		rt.types = append(rt.types, resp.Header.Get("Content-Type"))
		rt.mu.Unlock()
	}
	return resp, err
}

func (rt *recordTypes) last() string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.types[len(rt.types)-1]
}

// The official Go client's plain calls take the direct path (a JSON
// answer), and its calls with a progress token the SDK's event stream.
func TestHTTPDirectCallGoClient(t *testing.T) {
	a := newApp(t)
	rt := &recordTypes{}
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, nil), rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := callTool(t, cs, "help", nil); err != nil || o.IsError || o.text() == "" {
		t.Fatalf("%v %+v", err, o)
	}
	if ct := rt.last(); ct != "application/json" {
		t.Fatalf("a plain call was answered as %q", ct)
	}
	params := &mcp.CallToolParams{Name: "help", Arguments: map[string]any{}}
	params.SetProgressToken("p")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if res, err := cs.CallTool(ctx, params); err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	if ct := rt.last(); ct != "text/event-stream" {
		t.Fatalf("a call with a progress token was answered as %q", ct)
	}
}

// notifications/cancelled naming a direct call ends it, with the connection
// that carries the call still open, and kills the run's processes; so does
// the end of the session (DELETE), as for a call the SDK serves.
func TestHTTPDirectCallCancelled(t *testing.T) {
	t.Run("notifications/cancelled", func(t *testing.T) {
		directCallCancelled(t, func(s *rawSession) {
			resp, data, err := s.post(context.Background(), []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long","reason":"test"}}`))
			if err != nil || resp.StatusCode != http.StatusAccepted {
				t.Fatalf("notifications/cancelled: %v %v %s", err, resp, data)
			}
		})
	})
	t.Run("DELETE", func(t *testing.T) {
		directCallCancelled(t, func(s *rawSession) {
			req, _ := http.NewRequest(http.MethodDelete, s.url, nil)
			req.Header.Set("Authorization", "Bearer "+s.token)
			req.Header.Set("Mcp-Session-Id", s.id)
			resp, err := s.client.Do(req)
			if err != nil || resp.StatusCode != http.StatusNoContent {
				t.Fatalf("DELETE: %v %v", err, resp)
			}
			resp.Body.Close()
		})
	})
}

func directCallCancelled(t *testing.T, cancel func(*rawSession)) {
	a := newApp(t)
	s := rawConnect(t, http.DefaultClient, serveHTTP(t, a, tokens, nil), "admin")
	st := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_session_status","arguments":{}}}`)
	if st.Result == nil || st.Result.IsError {
		t.Fatalf("%+v", st)
	}
	// The host path (a caller reads /home/user).
	ws := filepath.Join(a.DataDir, "sessions", st.Result.Structured["id"].(string), "workspace")
	fifo := filepath.Join(ws, "pid.fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		data []byte
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		_, data, err := s.post(context.Background(), []byte(`{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":"run_code","arguments":{"lang":"shell","code":"echo $$ > pid.fifo; exec sleep 300","timeout_ms":600000}}}`))
		done <- answer{data, err}
	}()
	// Opening the FIFO waits for the run to open it: then the run is on.
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("the run wrote %q", b)
	}
	host := pid
	if hp, ok := sandboxtest.HostPID(pid, ws); ok {
		host = hp
	}
	fd, err := unix.PidfdOpen(host, 0)
	if err != nil {
		t.Fatalf("pidfd of %d (box pid %d): %v", host, pid, err)
	}
	defer unix.Close(fd)

	cancel(s)
	var ans answer
	select {
	case ans = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the call still runs a minute after it was canceled")
	}
	var r rpcAnswer
	if ans.err != nil || json.Unmarshal(ans.data, &r) != nil || r.Result == nil || !strings.Contains(r.Result.text(), "canceled by the caller") {
		t.Fatalf("the canceled call answered %v %s", ans.err, ans.data)
	}
	// The pidfd becomes readable when the process exits.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 30_000)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(fds, 30_000)
	}
	if err != nil || n != 1 {
		t.Fatalf("the run's process %d is still alive 30 s after the cancel (%v)", host, err)
	}
}

// A session with no request for SessionTimeout is closed (the SDK no longer
// keeps this timeout, since direct calls do not reach it).
func TestHTTPSessionIdleTimeout(t *testing.T) {
	a := newApp(t)
	closed := make(chan struct{}, 1)
	t.Cleanup(quromcp.OnIdleClosed(func() {
		select {
		case closed <- struct{}{}:
		default:
		}
	}))
	h := quromcp.Handler(a.Controller, tokens, &quromcp.Options{SessionTimeout: 200 * time.Millisecond})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	s := rawConnect(t, http.DefaultClient, srv.URL, "admin")
	if r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"help","arguments":{}}}`); r.Result == nil {
		t.Fatalf("%+v", r)
	}
	select {
	case <-closed:
	case <-time.After(time.Minute): // only a guard against waiting forever
		t.Fatal("the idle session is still held a minute later")
	}
	if n := h.(quromcp.Counter).Count(); n != 0 {
		t.Fatalf("%d sessions held after the idle one was closed", n)
	}
	if r := rawRPC(t, s, "admin", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"help","arguments":{}}}`); r.status != http.StatusNotFound {
		t.Fatalf("a call on the timed-out session: HTTP %d", r.status)
	}
}
