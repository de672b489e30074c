package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){"quro": func() { os.Exit(Main()) }})
}

// TestScripts runs the CLI transcripts in testdata/script.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("QURO_DATA", env.WorkDir+"/data")
			return nil
		},
	})
}

// startServer runs `quro serve --addr 127.0.0.1:0` in-process and returns
// its base URL; the server stops when the test ends.
func startServer(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	root := newRoot(strings.NewReader(""), pw, io.Discard)
	root.SetArgs([]string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir()})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("serve printed no address: %v", err)
	}
	go io.Copy(io.Discard, pr)
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "quro listening on ")
	if !ok {
		t.Fatalf("unexpected first line %q", line)
	}
	return url
}

type httpResult struct {
	status int
	body   string
	ctype  string
}

func do(t *testing.T, method, url, ctype, body string, hdr ...string) httpResult {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpResult{resp.StatusCode, string(b), resp.Header.Get("Content-Type")}
}

func TestHTTPServer(t *testing.T) {
	base := startServer(t)
	const js = "application/json"
	for _, tc := range []struct {
		name, method, path, ctype, body string
		hdr                             []string
		status                          int
		want                            string // substring of the body
	}{
		{"run python", "POST", "/v1/run_code", js, `{"code":"print(6*7)"}`, nil, 200, `"stdout":"42\n"`},
		{"run shell exit code", "POST", "/v1/run_code", js, `{"code":"exit 5","lang":"sh"}`, nil, 200, `"exit_code":5`},
		{"model text", "POST", "/v1/run_code", js, `{"code":"print('hi')"}`, []string{"Accept", "text/plain"}, 200, "hi\n"},
		{"text via query", "POST", "/v1/run_code?format=text", js, `{"code":"import sys; sys.stderr.write('bad')"}`, nil, 200, "⚠️ stderr:\nbad"},
		{"no content type is json", "POST", "/v1/run_code", "", `{"code":"print(1)"}`, nil, 200, `"exit_code":0`},
		{"curl -d form label with a JSON body", "POST", "/v1/run_code", "application/x-www-form-urlencoded", `{"code":"print(1)"}`, nil, 200, `"exit_code":0`},
		{"form body that is not JSON", "POST", "/v1/run_code", "application/x-www-form-urlencoded", `code=print(1)`, nil, 400, "not valid JSON"},
		{"capabilities", "GET", "/v1/capabilities", "", "", nil, 200, `"name":"run_code"`},
		{"status", "GET", "/v1/status", "", "", nil, 200, `"pid":`},
		{"help", "GET", "/v1/help", "", "", nil, 200, `"text":"Quro runs code`},
		{"post a no-arg capability", "POST", "/v1/get_service_status", js, ``, nil, 200, `"version"`},
		{"malformed json", "POST", "/v1/run_code", js, `{"code":`, nil, 400, `"code":"invalid_argument"`},
		{"unknown field", "POST", "/v1/run_code", js, `{"code":"1","extra":1}`, nil, 400, `unknown field \"extra\"`},
		{"empty code", "POST", "/v1/run_code", js, `{"code":""}`, nil, 400, "code is empty"},
		{"unknown lang", "POST", "/v1/run_code", js, `{"code":"1","lang":"cobol"}`, nil, 400, "supported: python"},
		{"missing session", "POST", "/v1/run_code", js, `{"code":"1","session":"ghost"}`, nil, 404, `"code":"not_found"`},
		{"unknown capability", "POST", "/v1/nope", js, `{}`, nil, 404, "no capability"},
		{"unknown route", "GET", "/v1/nope/deeper", "", "", nil, 404, "no route"},
		{"wrong content type", "POST", "/v1/run_code", "text/plain", `print(1)`, nil, 415, "application/json"},
		{"too large", "POST", "/v1/run_code", js, `{"code":"` + strings.Repeat("x", 17<<20) + `"}`, nil, 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, base+tc.path, tc.ctype, tc.body, tc.hdr...)
			if r.status != tc.status || !strings.Contains(r.body, tc.want) {
				t.Fatalf("%d %s\nwant %d containing %q", r.status, trim(r.body), tc.status, tc.want)
			}
			if r.status >= 400 {
				var e struct {
					Error struct{ Code, Message string }
				}
				if json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
					t.Errorf("error body is not {error:{code,message}}: %s", trim(r.body))
				}
			}
		})
	}
}

func TestServeRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7070", ":7070", "192.0.2.1:80", "example.com:80"} {
		if err := checkLoopback(addr); err == nil {
			t.Errorf("%s accepted", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:7070", "localhost:7070"} {
		if err := checkLoopback(addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
