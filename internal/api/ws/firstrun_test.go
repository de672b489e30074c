//go:build !slim

package ws_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
)

// A streamed first Python run on a fresh data directory tells the client
// that the embedded interpreter is being prepared (progress messages)
// before the result. The preparation is held back by holding its lock, as
// another quro process would, until the client has been told.
func TestFirstRunStreamsProgress(t *testing.T) {
	root := t.TempDir()
	a, err := app.New(context.Background(), t.TempDir(), &app.Options{Python: &python.EmbeddedOptions{InstallRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	access := rest.Access{Auth: tokenAuth}
	srv := httptest.NewServer(rest.New(a.Controller, &rest.Options{Access: access, WebSocket: ws.New(a.Controller, &ws.Options{Access: access}).Handlers()}))
	t.Cleanup(srv.Close)
	e := &env{a: a, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}

	os.MkdirAll(filepath.Join(root, "python"), 0o755)
	lock, err := os.OpenFile(filepath.Join(root, "python", ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	c, _, err := e.dial(t, "/v1/stream/run_code", withToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// The run's time budget covers preparing the interpreter, which on a
	// loaded machine takes longer than the default 30 s.
	c.Write(ctxT(t), websocket.MessageText, mustJSON(map[string]any{"code": "print(6 * 7)", "timeout_ms": 600000}))
	_, raw, m := readMsg(t, c)
	if m.Type != "progress" || !strings.Contains(m.Message, "preparing the embedded Python") || !strings.Contains(m.Message, "waiting for another quro process") {
		t.Fatalf("first message %s, want progress", raw)
	}
	unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	var stages []string
	for {
		_, raw, m := readMsg(t, c)
		switch m.Type {
		case "progress":
			stages = append(stages, m.Message)
			continue
		case "output":
			continue
		case "result":
			if !strings.Contains(string(m.Output), `"stdout":"42\n"`) {
				t.Fatalf("result %s", raw)
			}
		default:
			t.Fatalf("message %s", raw)
		}
		break
	}
	// Progress is coalesced to the latest when the client lags; the last
	// one, sent before the result, says the interpreter is ready.
	if len(stages) == 0 || !strings.Contains(stages[len(stages)-1], "ready (") {
		t.Errorf("progress seen:\n%s", strings.Join(stages, "\n"))
	}
}
