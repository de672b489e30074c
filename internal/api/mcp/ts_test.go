package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// tsDir holds the TypeScript client and its pinned @modelcontextprotocol/sdk
// (make test runs npm ci there).
const tsDir = "../../../test/mcp-ts"

// runTSClient runs test/mcp-ts/client.mjs with the table's plan and the
// given transport arguments, and returns what it saw.
func runTSClient(t *testing.T, transport ...string) *run {
	t.Helper()
	if _, err := os.Stat(filepath.Join(tsDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skip("\n\n*** SKIPPED: the TypeScript MCP client is not installed (test/mcp-ts/node_modules is missing).\n" +
			"*** Run `npm ci --prefix test/mcp-ts` (make test does) to test quro against the official TypeScript SDK. ***\n\n")
	}
	var p plan
	p.fromTable(cases())
	planFile := filepath.Join(t.TempDir(), "plan.json")
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(tsDir, "client.mjs"), planFile}, transport...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
	var r run
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("summary: %v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", stderr.String())
	}
	return &r
}

// The official TypeScript client calls every tool over streamable HTTP.
func TestTypeScriptClientHTTP(t *testing.T) {
	a := newApp(t)
	r := runTSClient(t, "--http", serveHTTP(t, a, httpOpen, nil)+"/?tools=full")
	checkRun(t, a.Controller.Registry().Names(), r)
}

// The official TypeScript client calls every tool over stdio against the
// real quro mcp binary.
func TestTypeScriptClientStdio(t *testing.T) {
	bin, err := buildQuro()
	if err != nil {
		t.Fatal(err)
	}
	r := runTSClient(t, "--", bin, "mcp", "--data", dataDir(t), "--tools", "full")
	checkRun(t, registered(t), r)
}

// tokenCount is what test/mcp-ts/tokens.mjs counted for one profile.
type tokenCount struct {
	Tools       []string `json:"tools"`
	Definitions int      `json:"definitions"` // name, description, input schema: what a model reads
	List        int      `json:"list"`        // the whole tools/list result
	Help        int      `json:"help"`        // help without a topic
}

// The budgets of issue 27: a model reads the default profile's tools in
// at most 2,000 tokens (o200k, counted by gpt-tokenizer in the official
// TypeScript client) and help in at most 300; an exec token is listed no
// tool it cannot call. The counts of every profile are logged (-v):
// bench/README.md records them.
func TestToolTokenBudget(t *testing.T) {
	if _, err := os.Stat(filepath.Join(tsDir, "node_modules", "gpt-tokenizer")); err != nil {
		t.Skip("\n\n*** SKIPPED: gpt-tokenizer is not installed in test/mcp-ts: run `npm ci --prefix test/mcp-ts` (make test does). ***\n\n")
	}
	a := newApp(t)
	execToken := func(*http.Request) (controller.Caller, error) {
		return controller.Caller{Tenant: "acme", Scope: capability.ScopeExec, TokenID: "t1"}, nil
	}
	url := serveHTTP(t, a, execToken, nil)
	profiles := a.Controller.Registry().ProfileNames()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(tsDir, "tokens.mjs"), "--http", url}, profiles...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node tokens.mjs: %v\nstderr:\n%s", err, stderr.String())
	}
	var counts map[string]tokenCount
	if err := json.Unmarshal(stdout.Bytes(), &counts); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	reg := a.Controller.Registry()
	for _, p := range profiles {
		c := counts[p]
		t.Logf("profile %-8s %2d tools, definitions %5d tokens, tools/list %5d tokens; help %d tokens", p, len(c.Tools), c.Definitions, c.List, c.Help)
		for _, n := range c.Tools {
			if capb, ok := reg.Get(n); !ok || !capability.ScopeExec.Covers(capb.Scope) {
				t.Errorf("profile %s lists %s to an exec token, which cannot call it", p, n)
			}
		}
	}
	agent := counts[capability.DefaultProfile]
	if len(agent.Tools) == 0 || len(agent.Tools) > 12 {
		t.Errorf("the agent profile lists %d tools: %v", len(agent.Tools), agent.Tools)
	}
	if agent.Definitions > 2000 {
		t.Errorf("the agent profile's definitions are %d tokens; the budget is 2,000", agent.Definitions)
	}
	if agent.Help > 300 {
		t.Errorf("help answers in %d tokens; the budget is 300", agent.Help)
	}
}
