package ws_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
)

var testPython = pythontest.Options()

// tokenAuth: "exec-token" may run things, "read-token" only read.
func tokenAuth(r *http.Request) (controller.Caller, error) {
	switch httpauth.Bearer(r) {
	case "exec-token":
		return controller.Caller{Tenant: "alice", Scope: capability.ScopeExec}, nil
	case "read-token":
		return controller.Caller{Tenant: "alice", Scope: capability.ScopeRead}, nil
	case "bob-token":
		return controller.Caller{Tenant: "bob", Scope: capability.ScopeAdmin}, nil
	}
	return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "a valid token is needed")
}

type env struct {
	a   *app.App
	ws  *ws.Server
	srv *httptest.Server
	url string // ws://host
}

func setup(t *testing.T) *env {
	t.Helper()
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	access := rest.Access{Auth: tokenAuth}
	w := ws.New(a.Controller, &ws.Options{Access: access, PTY: a.OpenPTY})
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: access, WebSocket: w.Handlers()}))
	t.Cleanup(srv.Close)
	return &env{a: a, ws: w, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) session(t *testing.T, name string) *app.SessionInfo {
	t.Helper()
	args, _ := json.Marshal(map[string]string{"name": name})
	reply, err := e.a.Controller.Call(context.Background(), controller.Caller{Tenant: "alice", Scope: capability.ScopeAdmin}, "create_session", args)
	if err != nil {
		t.Fatal(err)
	}
	return reply.Output.(*app.SessionInfo)
}

func (e *env) dial(t *testing.T, path string, protocols []string, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	url := e.url + path
	var client *http.Client
	if host := hdr.Get("Host"); host != "" {
		// Another name for this server's address, as after DNS rebinding.
		url = "ws://" + host + path
		addr := e.srv.Listener.Addr().String()
		client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
		defer client.CloseIdleConnections()
	}
	return websocket.Dial(ctxT(t), url, &websocket.DialOptions{Subprotocols: protocols, HTTPHeader: hdr, HTTPClient: client})
}

var withToken = []string{ws.Protocol, ws.BearerPrefix + "exec-token"}

type msg struct {
	Type    string          `json:"type"`
	Session string          `json:"session"`
	Cols    int             `json:"cols"`
	Rows    int             `json:"rows"`
	Code    *int            `json:"code"`
	Stream  string          `json:"stream"`
	Data    string          `json:"data"`
	Output  json.RawMessage `json:"output"`
	Text    string          `json:"text"`
	Message string          `json:"message"`
	Error   *struct{ Code, Message string }
}

func readMsg(t *testing.T, c *websocket.Conn) (websocket.MessageType, []byte, *msg) {
	t.Helper()
	typ, data, err := c.Read(ctxT(t))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if typ == websocket.MessageText {
		var m msg
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("text frame is not JSON: %q", data)
		}
		return typ, data, &m
	}
	return typ, data, nil
}

// readUntil reads terminal bytes until the screen output contains want.
func readUntil(t *testing.T, c *websocket.Conn, want string) string {
	t.Helper()
	var got bytes.Buffer
	for !strings.Contains(got.String(), want) {
		typ, data, m := readMsg(t, c)
		if typ == websocket.MessageText {
			t.Fatalf("control message %+v while waiting for %q in %q", m, want, got.String())
		}
		got.Write(data)
	}
	return got.String()
}

func TestPTY(t *testing.T) {
	e := setup(t)
	s := e.session(t, "term")
	c, resp, err := e.dial(t, "/v1/sessions/"+s.ID+"/pty", withToken, nil)
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	defer c.CloseNow()
	if c.Subprotocol() != ws.Protocol {
		t.Fatalf("subprotocol %q", c.Subprotocol())
	}
	_, _, hello := readMsg(t, c)
	if hello == nil || hello.Type != "hello" || hello.Session != s.ID || hello.Cols == 0 {
		t.Fatalf("hello: %+v", hello)
	}
	ctx := ctxT(t)
	c.Write(ctx, websocket.MessageBinary, []byte("echo hi-$((6*7))\n"))
	readUntil(t, c, "hi-42")

	c.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":101,"rows":41}`))
	c.Write(ctx, websocket.MessageBinary, []byte("stty size\n"))
	readUntil(t, c, "41 101")
	c.Close(websocket.StatusNormalClosure, "bye")

	// A reconnect (by the session's name) replays what the terminal showed.
	c2, _, err := e.dial(t, "/v1/sessions/term/pty", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	if _, _, h := readMsg(t, c2); h == nil || h.Cols != 101 || h.Rows != 41 {
		t.Fatalf("hello after resize: %+v", h)
	}
	typ, replay, _ := readMsg(t, c2)
	if typ != websocket.MessageBinary || !strings.Contains(string(replay), "hi-42") || !strings.Contains(string(replay), "41 101") {
		t.Fatalf("replay %q", replay)
	}
	// A bad control message is answered, not fatal.
	c2.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":0,"rows":0}`))
	for {
		typ, _, m := readMsg(t, c2)
		if typ == websocket.MessageText {
			if m.Type != "error" || !strings.Contains(m.Message, "between") {
				t.Fatalf("want an error for a bad size, got %+v", m)
			}
			break
		}
	}
	// The shell's end is told, and closes the socket normally, even while
	// a job it left in the background holds the terminal open (the
	// PTY's reader stops reading drainAfterExit after the shell's exit).
	c2.Write(ctx, websocket.MessageBinary, []byte("sleep 300 & exit 3\n"))
	for {
		typ, _, m := readMsg(t, c2)
		if typ == websocket.MessageText && m.Type == "exit" {
			if m.Code == nil || *m.Code != 3 {
				t.Fatalf("exit %+v", m)
			}
			break
		}
	}
	if _, _, err := c2.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("close after exit: %v", err)
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

func TestAccessBeforeUpgrade(t *testing.T) {
	e := setup(t)
	s := e.session(t, "acc")
	pty := "/v1/sessions/" + s.ID + "/pty"
	for _, tc := range []struct {
		name      string
		path      string
		protocols []string
		hdr       http.Header
		status    int
	}{
		{"no token", pty, []string{ws.Protocol}, nil, 401},
		{"bad token", pty, []string{ws.Protocol, ws.BearerPrefix + "nope"}, nil, 401},
		{"token in the URL is not read", pty + "?token=exec-token&access_token=exec-token", []string{ws.Protocol}, nil, 401},
		{"bearer without quro.v1", pty, []string{ws.BearerPrefix + "exec-token"}, nil, 400},
		{"foreign origin", pty, withToken, http.Header{"Origin": {"https://evil.example"}}, 403},
		{"rebound host", pty, withToken, http.Header{"Host": {"evil.example"}}, 403},
		{"read scope cannot type", pty, []string{ws.Protocol, ws.BearerPrefix + "read-token"}, nil, 403},
		{"unknown session", "/v1/sessions/ghost/pty", withToken, nil, 404},
		{"another tenant's session by id", pty, []string{ws.Protocol, ws.BearerPrefix + "bob-token"}, nil, 404},
		{"another tenant's session by name", "/v1/sessions/acc/pty", []string{ws.Protocol, ws.BearerPrefix + "bob-token"}, nil, 404},
		{"stream of a capability that does not stream", "/v1/stream/list_sessions", withToken, nil, 404},
		{"stream needs its scope", "/v1/stream/run_code", []string{ws.Protocol, ws.BearerPrefix + "read-token"}, nil, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, resp, err := e.dial(t, tc.path, tc.protocols, tc.hdr)
			if err == nil {
				c.CloseNow()
				t.Fatal("upgraded")
			}
			if resp == nil || resp.StatusCode != tc.status {
				t.Fatalf("%v, want %d", err, tc.status)
			}
		})
	}
	// Same origin and the Authorization header work.
	c, _, err := e.dial(t, pty, []string{ws.Protocol}, http.Header{"Origin": {e.srv.URL}, "Authorization": {"Bearer exec-token"}})
	if err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
}

func TestStreamedRuns(t *testing.T) {
	e := setup(t)
	s := e.session(t, "stream")
	for _, tc := range []struct {
		name, capability string
		args             map[string]any
		gate             string
		first, later     msg // the first output, and one that comes after the gate
		result           string
	}{
		{"run_code shell", "run_code",
			map[string]any{"lang": "sh", "session": s.ID, "code": "echo first; while [ ! -e gate1 ]; do sleep 0.01; done; echo second >&2; echo third"},
			"gate1", msg{Stream: "stdout", Data: "first\n"}, msg{Stream: "stderr", Data: "second\n"}, `"stdout":"first\nthird\n"`},
		{"run_code python", "run_code",
			map[string]any{"session": s.ID, "code": "import os, sys, time\nprint('p1', flush=True)\nwhile not os.path.exists('gate2'): time.sleep(0.01)\nprint('p2', file=sys.stderr)"},
			"gate2", msg{Stream: "stdout", Data: "p1\n"}, msg{Stream: "stderr", Data: "p2\n"}, `"stdout":"p1\n"`},
		{"terminal_exec", "terminal_exec",
			map[string]any{"session": s.ID, "command": "echo one; while [ ! -e gate3 ]; do sleep 0.01; done; echo two"},
			"gate3", msg{Stream: "stdout", Data: "one\n"}, msg{Stream: "stdout", Data: "two\n"}, `"output":"one\ntwo\n"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, err := e.dial(t, "/v1/stream/"+tc.capability, withToken, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			c.Write(ctxT(t), websocket.MessageText, mustJSON(tc.args))
			// Output arrives in chunks as the program writes it.
			var first string
			for first != tc.first.Data {
				_, raw, m := readMsg(t, c)
				if m.Type != "output" || m.Stream != tc.first.Stream || !strings.HasPrefix(tc.first.Data, first+m.Data) {
					t.Fatalf("message %s after %q, want output %+v", raw, first, tc.first)
				}
				first += m.Data
			}
			// The run is still waiting for the gate: the output came before the result.
			os.WriteFile(filepath.Join(s.Workspace, tc.gate), nil, 0o644)
			var later string
			for {
				_, raw, m := readMsg(t, c)
				if m.Type == "output" && m.Stream == tc.later.Stream {
					later += m.Data
				}
				seen := strings.Contains(later, tc.later.Data)
				if m.Type == "error" {
					t.Fatalf("error %s", raw)
				}
				if m.Type == "result" {
					if !seen || !strings.Contains(string(m.Output), tc.result) || m.Text == "" {
						t.Fatalf("result %s (later output seen: %v)", raw, seen)
					}
					break
				}
			}
			if _, _, err := c.Read(ctxT(t)); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("close: %v", err)
			}
		})
	}
}

func TestClosingTheSocketCancelsTheRun(t *testing.T) {
	e := setup(t)
	s := e.session(t, "cancel")
	c, _, err := e.dial(t, "/v1/stream/run_code", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	const marker = "987654"
	c.Write(ctxT(t), websocket.MessageText, mustJSON(map[string]any{
		"lang": "sh", "session": s.ID, "code": "sleep " + marker + " & p=$!\n" +
			// Say "started" only once the sleep runs (has exec'd): until
			// then the forked child's command line is the shell's, which
			// holds the marker too, so match the sleep's own argv.
			"until tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q '^sleep " + marker + "'; do :; done\n" +
			"echo started; wait; echo never"}))
	if _, _, m := readMsg(t, c); m.Type != "output" || m.Data != "started\n" {
		t.Fatalf("%+v", m)
	}
	if len(processesWith(marker)) == 0 {
		t.Fatal("the run's sleep is not to be found")
	}
	c.Close(websocket.StatusNormalClosure, "enough")
	e.ws.Wait() // the handler returns only after the run has ended
	if pids := processesWith(marker); len(pids) > 0 {
		t.Fatalf("processes left: %v", pids)
	}
}

// processesWith lists the pids whose command line contains s.
func processesWith(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte("sleep\x00"+s)) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestManyConnectsLeaveNothingBehind(t *testing.T) {
	e := setup(t)
	s := e.session(t, "many")
	pty := "/v1/sessions/" + s.ID + "/pty"
	// Start the session's terminal first: it is meant to outlive viewers.
	c, _, err := e.dial(t, pty, withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	readMsg(t, c)
	c.CloseNow()
	e.ws.Wait()
	http.DefaultClient.CloseIdleConnections()
	fds := openFDs(t)
	ignore := goleak.IgnoreCurrent()

	for i := range 1000 {
		path := pty
		if i%2 == 1 {
			path = "/v1/stream/run_code"
		}
		c, _, err := e.dial(t, path, withToken, nil)
		if err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
		if i%2 == 0 {
			readMsg(t, c) // hello: attached
		}
		c.CloseNow()
	}
	e.ws.Wait()
	http.DefaultClient.CloseIdleConnections()
	if n := e.ws.Active(); n != 0 {
		t.Fatalf("%d handlers still active", n)
	}
	if got := openFDs(t); len(got) > len(fds) {
		t.Errorf("open files: %d before, %d after; new: %v", len(fds), len(got), newFDs(fds, got))
	}
	goleak.VerifyNone(t, ignore)
}

// openFDs maps the test process's open descriptors to what they are
// (their /proc/self/fd link: a file's path, socket:[inode], pipe:[inode],
// anon_inode:[eventpoll], ...), leaving out the database's: the SQLite
// pool opens another connection (quro.db, -wal, -shm) when concurrent
// calls need one and keeps it idle, which is no leak of a WebSocket
// handler. A descriptor whose link cannot be read (closed between the
// listing and the read, e.g. the listing's own) is not counted.
func openFDs(t *testing.T) map[string]string {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := map[string]string{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || strings.HasPrefix(filepath.Base(target), "quro.db") {
			continue
		}
		fds[e.Name()] = target
	}
	return fds
}

// newFDs lists the descriptors of after that were not open (as the same
// thing) before, for the failure message.
func newFDs(before, after map[string]string) []string {
	var out []string
	for fd, target := range after {
		if before[fd] != target {
			out = append(out, fd+" -> "+target)
		}
	}
	sort.Strings(out)
	return out
}
