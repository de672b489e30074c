package web_test

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/web"
)

func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// Every response carries the policy; the page's style nonce is fresh
// each time and matches the one on its script tag; no inline script.
func TestHeaders(t *testing.T) {
	h := web.Handler()
	nonceRE := regexp.MustCompile(`style-src 'self' 'nonce-([A-Za-z0-9_-]{20,})'`)
	var nonces []string
	for range 2 {
		res, body := get(t, h, "GET", "/")
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		csp := res.Header.Get("Content-Security-Policy")
		m := nonceRE.FindStringSubmatch(csp)
		if m == nil {
			t.Fatalf("no style nonce in %q", csp)
		}
		for _, want := range []string{"script-src 'self';", "frame-ancestors 'none'", "connect-src 'self'", "object-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("CSP lacks %q: %s", want, csp)
			}
		}
		if !strings.Contains(body, `nonce="`+m[1]+`"`) || strings.Contains(body, "__CSP_NONCE__") {
			t.Errorf("the page does not carry its response's nonce:\n%s", body)
		}
		if regexp.MustCompile(`<script(?:\s[^>]*)?>[^<]`).MatchString(body) || !strings.Contains(body, `src="/app.js"`) {
			t.Errorf("inline script in index.html:\n%s", body)
		}
		if res.Header.Get("X-Content-Type-Options") != "nosniff" || res.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("headers: %v", res.Header)
		}
		nonces = append(nonces, m[1])
	}
	if nonces[0] == nonces[1] {
		t.Error("the nonce did not change between responses")
	}

	res, _ := get(t, h, "GET", "/frame.html")
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"sandbox allow-scripts;", "default-src 'none'", "frame-ancestors 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("frame CSP lacks %q: %s", want, csp)
		}
	}
	if strings.Contains(csp, "allow-same-origin") {
		t.Errorf("frame CSP allows same-origin: %s", csp)
	}

	res, _ = get(t, h, "GET", "/app.js")
	if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Content-Type"), "javascript") || res.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("app.js: %d %v", res.StatusCode, res.Header)
	}
	for _, p := range []string{"/nope", "/../web.go", "/.hidden"} {
		if res, _ := get(t, h, "GET", p); res.StatusCode != 404 {
			t.Errorf("GET %s: %d", p, res.StatusCode)
		}
	}
	if res, _ := get(t, h, "POST", "/"); res.StatusCode != 405 {
		t.Errorf("POST /: %d", res.StatusCode)
	}
}

// The committed dist is what web/build.mjs makes of the sources now.
func TestDistUpToDate(t *testing.T) {
	webDir, _ := filepath.Abs("../../web")
	if _, err := os.Stat(filepath.Join(webDir, "node_modules", "esbuild")); err != nil {
		t.Skip("\n\n*** SKIPPED: web/node_modules is missing, so the committed internal/web/dist cannot be checked against web/src.\n" +
			"*** Run `npm ci --prefix web` (make test does). ***\n\n")
	}
	out := t.TempDir()
	cmd := exec.Command("node", filepath.Join(webDir, "build.mjs"), "--out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node build.mjs: %v\n%s", err, b)
	}
	built := os.DirFS(out)
	seen := map[string]bool{}
	fs.WalkDir(built, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		seen[p] = true
		want, _ := fs.ReadFile(built, p)
		got, err := fs.ReadFile(web.Files, p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("internal/web/dist/%s is not what the sources build: run `make web` and commit it", p)
		}
		return nil
	})
	fs.WalkDir(web.Files, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !seen[p] {
			t.Errorf("internal/web/dist/%s is not built from the sources any more: run `make web` and commit", p)
		}
		return err
	})
}
