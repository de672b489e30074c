package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chromium is the browser the UI's end-to-end test drives (Debian's
// chromium package; make test installs it).
const chromium = "/usr/bin/chromium"

// TestWebUI drives the web UI in headless Chromium against a real quro
// serve (web/e2e/run.mjs): sign in, create a session, type in its
// terminal and read the screen, reload and find the same terminal with its
// scrollback, run Python that prints and displays an HTML artifact in the
// sandboxed frame, an XSS attempt in program output that stays text, the
// audit log and the status page. Screenshots go to $QURO_E2E_OUT (a
// temporary folder by default; docs/ui/ holds the ones docs/ui.md shows).
func TestWebUI(t *testing.T) {
	webDir, _ := filepath.Abs("../../web")
	var missing []string
	if _, err := os.Stat(chromium); err != nil {
		missing = append(missing, chromium+" (apt-get install chromium)")
	}
	if _, err := os.Stat(filepath.Join(webDir, "node_modules", "playwright-core")); err != nil {
		missing = append(missing, "web/node_modules (npm ci --prefix web)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		missing = append(missing, "node")
	}
	if len(missing) > 0 {
		t.Skip("\n\n*** SKIPPED: the web UI's browser test needs " + strings.Join(missing, ", ") + ".\n" +
			"*** make test installs them; without them the UI is not tested in a browser. ***\n\n")
	}
	out := os.Getenv("QURO_E2E_OUT")
	if out == "" {
		out = t.TempDir()
	}
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(webDir, "e2e", "run.mjs"))
	cmd.Env = append(os.Environ(), "QURO_URL="+srv.url, "QURO_TOKEN="+srv.token, "QURO_E2E_OUT="+out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("steps:\n%s", stderr.String())
	var sum struct {
		OK    bool
		Steps []struct {
			Name  string
			OK    bool
			Error string
		}
		Problems []string
		Dialogs  []string
	}
	if jerr := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &sum); jerr != nil {
		t.Fatalf("node e2e/run.mjs: %v; no summary (%v):\n%s", err, jerr, stdout.String())
	}
	for _, s := range sum.Steps {
		if !s.OK {
			t.Errorf("step %q: %s", s.Name, s.Error)
		}
	}
	for _, p := range sum.Problems {
		t.Errorf("problem: %s", p)
	}
	if err != nil || !sum.OK || len(sum.Steps) < 10 {
		t.Fatalf("e2e run failed (%v); screenshots in %s", err, out)
	}
	t.Logf("screenshots in %s", out)
}
