//go:build !slim

package mcp_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
)

// The first Python run on a fresh data directory waits for the embedded
// interpreter's preparation, and a client that asked for progress is told
// what is going on, not only that the call still runs. The preparation is
// held back by holding its lock, as another quro process would, until the
// client has been told; then the run completes.
func TestFirstRunProgressNotifications(t *testing.T) {
	root := t.TempDir()
	a, err := app.New(context.Background(), dataDir(t), &app.Options{Python: &python.EmbeddedOptions{InstallRoot: root}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	os.MkdirAll(filepath.Join(root, "python"), 0o755)
	lock, err := os.OpenFile(filepath.Join(root, "python", ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	told := make(chan string, 1)
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		if strings.Contains(r.Params.Message, "preparing the embedded Python") {
			select {
			case told <- r.Params.Message:
			default:
			}
		}
	}}
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, &quromcp.Options{ProgressEvery: 50 * time.Millisecond}), http.DefaultTransport, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The run's time budget covers preparing the interpreter, which on a
	// loaded machine takes longer than the default 30 s.
	params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"lang": "python", "code": "6 * 7", "timeout_ms": 600000}}
	params.SetProgressToken("first")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type result struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := cs.CallTool(ctx, params)
		done <- result{res, err}
	}()
	select {
	case msg := <-told:
		if !strings.Contains(msg, "run_code running for") || !strings.Contains(msg, "waiting for another quro process") {
			t.Errorf("progress message %q", msg)
		}
	case r := <-done:
		t.Fatalf("the call ended before its progress was told: %+v %v", r.res, r.err)
	}
	unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	r := <-done
	if r.err != nil || r.res.IsError {
		t.Fatalf("%v %+v", r.err, r.res)
	}
	if text := r.res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, "42") {
		t.Fatalf("result %q", text)
	}
}
