package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
)

// agentStep is what test/mcp-ts/agent.mjs saw of one tool call.
type agentStep struct {
	Text          string   `json:"text"`
	Types         []string `json:"types"`
	MIMETypes     []string `json:"mimeTypes"`
	IsError       bool     `json:"isError"`
	ProtocolError string   `json:"protocolError"`
}

// TestScriptedAgentTask is issue 27's agent task through the official
// TypeScript client, on the default profile, as an exec token: what the
// model reads of each result holds what it needs — no host path, the
// workspace as /home/user, images as image content, a table's text beside
// its HTML, an edit applied, two commands sent at once both run, a server
// and its log, a prompt answered and one left behind, and an out-of-memory
// kill named with its limit.
func TestScriptedAgentTask(t *testing.T) {
	if !embeddedPython {
		t.Skip("the task's Python (its state, a table's forms) is the embedded interpreter's, which this build does not have")
	}
	if _, err := os.Stat(filepath.Join(tsDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skip("\n\n*** SKIPPED: the TypeScript MCP client is not installed: run `npm ci --prefix test/mcp-ts` (make test does). ***\n\n")
	}
	dir := dataDir(t)
	lim := sandbox.DefaultLimits()
	lim.Memory = 256 << 20
	a, err := app.New(context.Background(), dir, &app.Options{Python: testPython, Sandbox: &sandbox.Options{Limits: &lim}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	execToken := func(*http.Request) (controller.Caller, error) {
		return controller.Caller{Tenant: "acme", Scope: capability.ScopeExec, TokenID: "t1"}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(tsDir, "agent.mjs"), serveHTTP(t, a, execToken, nil))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node agent.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
	var got struct {
		Tools []string             `json:"tools"`
		Steps map[string]agentStep `json:"steps"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	// The default profile, and every tool the task uses is in it.
	for _, n := range []string{"run_code", "terminal_exec", "send_input", "read_file", "write_file", "edit_file", "start_process", "read_process_output"} {
		if !slices.Contains(got.Tools, n) {
			t.Errorf("the default profile does not list %s: %v", n, got.Tools)
		}
	}
	if len(got.Tools) > 12 {
		t.Errorf("the default profile lists %d tools", len(got.Tools))
	}
	step := func(name string) agentStep {
		t.Helper()
		s, ok := got.Steps[name]
		if !ok || s.ProtocolError != "" {
			t.Fatalf("step %s: %+v", name, s)
		}
		return s
	}
	// Nothing a model reads names the host's directories.
	hostDirs := []string{dir, filepath.Dir(dir), "/sessions/"}
	for name, s := range got.Steps {
		for _, h := range hostDirs {
			if strings.Contains(s.Text, h) {
				t.Errorf("%s shows the host path %q:\n%s", name, h, s.Text)
			}
		}
	}
	want := func(name string, isError bool, parts ...string) agentStep {
		t.Helper()
		s := step(name)
		if s.IsError != isError {
			t.Errorf("%s: isError %v, want %v:\n%s", name, s.IsError, isError, s.Text)
		}
		for _, p := range parts {
			if !strings.Contains(s.Text, p) {
				t.Errorf("%s: the text lacks %q:\n%s", name, p, s.Text)
			}
		}
		return s
	}
	want("write_csv", false)
	want("stats", false, "mean y = 4.33")
	want("table", false, "mean    4.33")
	if s := want("chart", false); !slices.Contains(s.MIMETypes, "image/png") {
		t.Errorf("an SVG reaches the model as %v, not a PNG image", s.Types)
	}
	want("png_write", false, "wrote")
	if s := want("png_read", false, "PNG"); !slices.Equal(s.MIMETypes, []string{"image/png"}) {
		t.Errorf("read_file of a PNG answers %v, not an image", s.Types)
	}
	want("test_fail", false, "AssertionError", "[exit 1]")
	want("edit", false, "return sum(xs) / len(xs)")
	want("view", false, "     1\tdef mean(xs):", "     2\t    return sum(xs) / len(xs)")
	want("test_pass", false, "tests pass", "/home/user/stats")
	want("parallel_one", false, "one")
	want("parallel_two", false, "two")
	want("server", false, "running")
	want("fetch", false, "x,y\n1,2")
	want("server_log", false, "GET /stats/data.csv")
	want("prompt", false, "name? ", "waiting for input", "send_input")
	want("answer", false, "hi quro")
	want("prompt_again", false, "waiting for input")
	want("moved_on", false, "moved on", "interrupted")
	want("oom", false, "exit code 137", "memory limit (256 MiB) was reached")
	want("after_oom", false, "still here")
}
