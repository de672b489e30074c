package ws_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

type tailIn struct {
	Lines []string `json:"lines"`
}

type tailOut struct {
	Count int `json:"count"`
}

// TestStreamsWhatTheRegistryDeclares: the stream route runs exactly the
// capabilities registered as streaming — a new one streams without the
// WebSocket server knowing its name, and one that does not declare it is
// refused with the list of those that do.
func TestStreamsWhatTheRegistryDeclares(t *testing.T) {
	reg := capability.NewRegistry()
	tail := func(ctx context.Context, in tailIn) (*tailOut, error) {
		out := runcode.OutputFrom(ctx)
		for _, l := range in.Lines {
			out("stdout", []byte(l+"\n"))
		}
		return &tailOut{Count: len(in.Lines)}, nil
	}
	reg.Register(capability.New("tail", "Streams lines.", capability.ScopeExec, tail).Streaming())
	reg.Register(capability.New("quiet_tail", "Does not declare streaming.", capability.ScopeExec, tail))
	ctl := controller.New(reg, nil)
	access := rest.Access{Auth: tokenAuth}
	w := ws.New(ctl, &ws.Options{Access: access})
	srv := httptest.NewServer(rest.New(ctl, &rest.Options{Access: access, WebSocket: w.Handlers()}))
	t.Cleanup(srv.Close)
	e := &env{ws: w, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}

	c, _, err := e.dial(t, "/v1/stream/tail", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.Write(ctxT(t), websocket.MessageText, mustJSON(tailIn{Lines: []string{"a", "b"}}))
	var got string
	for {
		_, raw, m := readMsg(t, c)
		if m.Type == "output" {
			got += m.Data
			continue
		}
		if m.Type != "result" || string(m.Output) != `{"count":2}` || got != "a\nb\n" {
			t.Fatalf("message %s after output %q, want the result after a\\nb\\n", raw, got)
		}
		break
	}

	req, _ := http.NewRequest("GET", srv.URL+"/v1/stream/quiet_tail", nil)
	req.Header.Set("Authorization", "Bearer exec-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(body), `\"quiet_tail\" cannot be streamed; stream one of tail`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestPTYByName: the terminal route takes the session's name as well as
// its id; get_session_status, called as the caller, says which session
// that is (its typed output's SessionID), and the terminal is that one's.
func TestPTYByName(t *testing.T) {
	e := setup(t)
	s := e.session(t, "by-name")
	c, _, err := e.dial(t, "/v1/sessions/by-name/pty", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, raw, hello := readMsg(t, c); hello == nil || hello.Type != "hello" || hello.Session != s.ID {
		t.Fatalf("hello %s, want session %s", raw, s.ID)
	}
}

// TestEveryWebSocketRouteHasAHandler: each kind of WebSocket route in the
// REST table is served by this package.
func TestEveryWebSocketRouteHasAHandler(t *testing.T) {
	h := ws.New(controller.New(capability.NewRegistry(), nil), nil).Handlers()
	n := 0
	for _, rt := range rest.Routes {
		if rt.WebSocket == "" {
			continue
		}
		n++
		if h[rt.WebSocket] == nil {
			t.Errorf("%s %s: no handler for %q", rt.Method, rt.Pattern, rt.WebSocket)
		}
	}
	if n == 0 {
		t.Error("the table has no WebSocket route")
	}
}
