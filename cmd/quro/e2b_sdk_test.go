package main

import (
	"bufio"
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

// e2bDir holds the E2B SDK scenario and its pinned e2b and
// @e2b/code-interpreter packages (make test runs npm ci there).
const e2bDir = "../../test/e2b"

// e2bAreaSkip names the scenario areas whose server side is not built yet,
// with the missing piece. Delete an area's line when it lands.
// QURO_E2B_SDK_ALL=1 runs them all the same (to see where they stand).
var e2bAreaSkip = map[string]string{}

// TestE2BSDK runs E2B's own SDKs (npm e2b 2.51.0, @e2b/code-interpreter
// 2.8.0, unchanged) against a real `quro serve`, with only the three
// environment variables docs/e2b.md tells a user to set, and checks that
// they see what they would see from E2B: test/e2b/scenario/*.mjs, one
// subtest per area, one failure per check that fails.
func TestE2BSDK(t *testing.T) {
	if _, err := os.Stat(filepath.Join(e2bDir, "node_modules", "@e2b", "code-interpreter")); err != nil {
		t.Skip("\n\n*** SKIPPED: the E2B SDKs are not installed (test/e2b/node_modules is missing).\n" +
			"*** Run `npm ci --prefix test/e2b` (make test does) to test quro against E2B's SDKs. ***\n\n")
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on PATH (make test-deps installs it)")
	}
	// The SDKs need node >= 20.18.1 (their package.json's engines);
	// Debian 12's nodejs is 18.
	if out, err := exec.Command("node", "-p", `const [a, b, c] = process.versions.node.split(".").map(Number); a > 20 || (a == 20 && (b > 18 || (b == 18 && c >= 1)))`).Output(); err != nil || strings.TrimSpace(string(out)) != "true" {
		v, _ := exec.Command("node", "--version").Output()
		t.Skip("\n\n*** SKIPPED: E2B's SDKs need node >= 20.18.1; this node is " + strings.TrimSpace(string(v)) + ". ***\n\n")
	}
	areas := []string{"control", "commands", "pty", "files", "code", "code-js"}
	all := os.Getenv("QURO_E2B_SDK_ALL") != ""
	var run []string
	for _, area := range areas {
		if e2bAreaSkip[area] == "" || all {
			run = append(run, area)
		}
	}
	if len(run) == 0 {
		for _, area := range areas {
			t.Run(area, func(t *testing.T) { t.Skip(e2bAreaSkip[area]) })
		}
		return
	}
	srv := startServer(t)
	// A tenant's key, as a user of the SDKs would have: read and exec.
	key, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "sdk", "--scopes", "read,exec")
	if code != 0 {
		t.Fatalf("token create: %s", errs)
	}
	// Another tenant's, which must find nothing of the first one's.
	other, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "sdk-other", "--scopes", "read,exec")
	if code != 0 {
		t.Fatalf("token create: %s", errs)
	}
	env := append(os.Environ(),
		"E2B_API_KEY="+strings.TrimSpace(key),
		"E2B_OTHER_API_KEY="+strings.TrimSpace(other),
		"E2B_API_URL="+srv.url+"/e2b",
		"E2B_SANDBOX_URL="+srv.url,
	)
	for _, area := range areas {
		t.Run(area, func(t *testing.T) {
			if why := e2bAreaSkip[area]; why != "" && !all {
				t.Skip(why)
			}
			runE2BArea(t, area, env)
		})
	}
}

// runE2BArea runs node test/e2b/scenario.mjs area and fails t once per
// failed check.
func runE2BArea(t *testing.T, area string, env []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(e2bDir, "scenario.mjs"), area)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	passed, failed := 0, 0
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var c struct {
			Check string
			OK    bool
			Error string
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil || c.Check == "" {
			t.Logf("scenario: %s", sc.Text())
			continue
		}
		if c.OK {
			passed++
			continue
		}
		failed++
		t.Errorf("%s: %s", c.Check, c.Error)
	}
	t.Logf("%s: %d checks passed, %d failed", area, passed, failed)
	// A script that ends with an error outside a check (the area's
	// Sandbox.create, a crash) is a failure of its own.
	if runErr != nil && failed == 0 {
		t.Errorf("node scenario.mjs %s: %v\nstderr:\n%s", area, runErr, stderr.String())
	} else if t.Failed() && stderr.Len() > 0 {
		t.Logf("stderr:\n%s", stderr.String())
	}
	if passed+failed == 0 && runErr == nil {
		t.Errorf("node scenario.mjs %s ran no check", area)
	}
}
