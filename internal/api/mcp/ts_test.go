package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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
