package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// text is what s holds.
func (s *syncBuffer) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// toolText calls a tool and returns its text, failing on an error.
func toolText(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	if res.IsError {
		t.Fatalf("%s failed: %s", name, b.String())
	}
	return b.String()
}

// TestMCPThroughTheRunningServer: with quro serve running on the data
// directory, quro mcp relays to the server's /mcp with the data
// directory's admin token, so that a session made through it is the
// server's: alive, seen by quro call, and its shell's state shared with
// quro exec. Two calls in flight at once both come back. Without a token
// the client is told how to pass one.
func TestMCPThroughTheRunningServer(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	settled(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cmd := exec.Command(quroBin(t), "mcp", "--data", srv.data)
	cmd.Env = cliEnv()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v\nstderr: %s", err, stderr.text())
	}
	defer func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if t.Failed() {
			t.Logf("quro mcp stderr:\n%s", stderr.text())
		}
	}()
	if init := cs.InitializeResult(); init == nil || init.ServerInfo == nil || !strings.Contains(init.ServerInfo.Name, "quro") {
		t.Fatalf("initialize result %+v, want quro's", init)
	}

	toolText(t, ctx, cs, "create_session", map[string]any{"name": "viamcp"})
	var wg sync.WaitGroup
	texts := make([]string, 2)
	for i, code := range []string{"print(6 * 7)", "print(7 * 6)"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": code}})
			if err != nil || res.IsError {
				t.Errorf("run_code %q: %v %+v", code, err, res)
				return
			}
			texts[i] = res.Content[0].(*mcp.TextContent).Text
		}()
	}
	wg.Wait()
	for i, text := range texts {
		if !strings.Contains(text, "42") {
			t.Errorf("run_code %d: %q, want 42", i, text)
		}
	}
	toolText(t, ctx, cs, "terminal_exec", map[string]any{"session": "viamcp", "command": "cd /tmp && export FROM=mcp"})

	out, errs, code := cli(t, "call", "--json", "--data", srv.data, "get_session_status", `{"session":"viamcp"}`)
	var st struct {
		Alive bool `json:"alive"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || !st.Alive {
		t.Fatalf("quro call get_session_status: %d %q %q, want alive", code, out, errs)
	}
	if out, errs, code := cli(t, "exec", "--data", srv.data, "-s", "viamcp", "--", "echo $FROM; pwd"); code != 0 || out != "mcp\n/tmp\n" {
		t.Fatalf("quro exec in the session quro mcp made: %d %q %q", code, out, errs)
	}
	for _, p := range auditPaths(t, srv.data, "create_session") {
		if p != "mcp" {
			t.Errorf("create_session audited as %q, want mcp", p)
		}
	}

	// Another data directory's quro mcp, pointed at this server without
	// a token: the client is told which token to pass, and how.
	other := exec.Command(quroBin(t), "mcp", "--data", t.TempDir(), "--server", srv.url)
	other.Env = cliEnv()
	_, err = mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: other}, nil)
	if err == nil || !strings.Contains(err.Error(), "--token-file") || strings.Contains(err.Error(), srv.token) {
		t.Fatalf("quro mcp --server without a token: %v, want the way to pass one", err)
	}
}
