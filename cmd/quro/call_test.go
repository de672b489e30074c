package main

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// quro runs the CLI in-process and returns stdout, stderr and the exit status.
func quro(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(strings.NewReader(stdin), &out, &errb)
	root.SetArgs(args)
	err := root.Execute()
	code := 0
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case err != nil:
		code = 1
		errb.WriteString("quro: " + err.Error() + "\n")
	}
	return out.String(), errb.String(), code
}

func TestCallExitStatus(t *testing.T) {
	data := t.TempDir()
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		code  int
		out   string // substring of stdout
		err   string // substring of stderr
	}{
		{"ok", "", []string{"run_code", `{"lang":"sh","code":"echo 42"}`}, 0, "42\n", ""},
		{"program failure is output", "", []string{"run_code", `{"lang":"sh","code":"exit 9"}`}, 0, "exit code 9", ""},
		{"stdin", `{"lang":"sh","code":"echo in"}`, []string{"run_code", "-"}, 0, "in\n", ""},
		{"unknown capability", "", []string{"nope"}, 1, "", "not_found: no capability"},
		{"invalid argument", "", []string{"run_code", `{"code":""}`}, 1, "", "invalid_argument: code is empty"},
		{"bad json", "", []string{"run_code", `{"code"`}, 2, "", "not valid JSON"},
		{"not an object", "", []string{"run_code", `"x"`}, 2, "", "must be a JSON object"},
		{"no capability", "", nil, 2, "", "want CAPABILITY"},
		{"too many", "", []string{"run_code", "{}", "{}"}, 2, "", "want CAPABILITY"},
		{"unreadable token file", "", []string{"--server", "http://127.0.0.1:1", "--token-file", "/nonexistent/tok", "help"}, 2, "", "--token-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := quro(t, tc.stdin, append([]string{"call", "--data", data}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Fatalf("status %d, stdout %q, stderr %q\nwant %d, %q, %q", code, out, errs, tc.code, tc.out, tc.err)
			}
		})
	}
}

// TestCallServer calls a real `quro serve` over HTTP.
func TestCallServer(t *testing.T) {
	srv := startServer(t)
	base := srv.url
	t.Setenv("QURO_TOKEN", srv.token)
	t.Setenv("QURO_URL", "") // only the flag names the server here
	out, errs, code := quro(t, "", "call", "--server", base, "run_code", `{"code":"print(6*7)"}`)
	if code != 0 || out != "42\n" || errs != "" {
		t.Fatalf("text: %d %q %q", code, out, errs)
	}
	out, errs, code = quro(t, `{"lang":"sh","code":"echo hi"}`, "call", "--server", base, "--json", "run_code", "-")
	if code != 0 || !strings.Contains(out, `"stdout": "hi\n"`) || !strings.Contains(out, `"engine": "shell/sh"`) {
		t.Fatalf("json: %d %q %q", code, out, errs)
	}
	out, errs, code = quro(t, "", "call", "--server", base, "nope")
	if code != 1 || out != "" || !strings.Contains(errs, `quro call: not_found: no capability "nope"`) {
		t.Fatalf("unknown: %d %q %q", code, out, errs)
	}
	out, errs, code = quro(t, "", "call", "--server", base, "run_code", `{"code":"1","lang":"cobol"}`)
	if code != 1 || !strings.Contains(errs, "quro call: invalid_argument: unknown language") {
		t.Fatalf("invalid: %d %q %q", code, out, errs)
	}
	// QURO_URL instead of the flag; help lists the server's capabilities.
	t.Setenv("QURO_URL", base)
	out, errs, code = quro(t, "", "call", "--data", "/nonexistent/never-opened", "list_sessions")
	if code != 0 || !strings.Contains(out, "default") {
		t.Fatalf("QURO_URL: %d %q %q", code, out, errs)
	}
	out, _, _ = quro(t, "", "call", "--help")
	if !strings.Contains(out, "  run_code ") {
		t.Fatalf("help from the server lists no run_code:\n%s", out)
	}
}

func TestCallSendsTheTokenAndNeverPrintsIt(t *testing.T) {
	const secret = "qt_s3cr3t-value"
	var (
		mu  sync.Mutex
		got []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"unauthenticated","message":"bad token"}}`)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QURO_TOKEN", "")
	out, errs, code := quro(t, "", "call", "--server", srv.URL, "--token-file", file, "help")
	if code != 1 || !strings.Contains(errs, "quro call: unauthenticated: bad token") {
		t.Fatalf("%d %q %q", code, out, errs)
	}
	t.Setenv("QURO_TOKEN", secret)
	t.Setenv("QURO_URL", srv.URL+"/")
	out2, errs2, _ := quro(t, "", "call", "run_code", `{"code":"1"}`)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"POST /v1/help Bearer " + secret, "POST /v1/run_code Bearer " + secret}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("server saw:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(out+errs+out2+errs2, secret) {
		t.Error("the token was printed")
	}
}
