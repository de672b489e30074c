package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// logServer is a `quro serve` (in-process, like startServer) whose stderr
// the test reads once it stopped.
type logServer struct {
	*server
	pprof string // the profiler's base URL, with --pprof
	stop  func() string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// startLogServer starts quro serve with flags and no spare sessions
// (testServeFlags); stop ends it (a clean shutdown, which writes the last
// summaries) and returns its stderr.
func startLogServer(t *testing.T, flags ...string) *logServer {
	t.Helper()
	return startLogServerAtDefaults(t, testServeFlags(flags)...)
}

// startLogServerAtDefaults is startLogServer at the server's defaults,
// spare sessions included.
func startLogServerAtDefaults(t *testing.T, flags ...string) *logServer {
	t.Helper()
	data := t.TempDir()
	seedPython(t, data)
	var stderr syncBuffer
	return startLogServerOn(t, data, &stderr, func() string {
		stderr.mu.Lock()
		defer stderr.mu.Unlock()
		return stderr.b.String()
	}, flags...)
}

// startLogServerOn is startLogServer on data, with stderr on w; stop
// returns what read returns.
func startLogServerOn(t testing.TB, data string, w io.Writer, read func() string, flags ...string) *logServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	root := newRoot(strings.NewReader(""), pw, w)
	root.SetArgs(append([]string{"serve", "--addr", "127.0.0.1:0", "--data", data}, flags...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	var once sync.Once
	stop := func() string {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
		return read()
	}
	t.Cleanup(func() { stop() })
	srv := &logServer{server: &server{data: data}, stop: stop}
	br := bufio.NewReader(pr)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("serve printed no address: %v\n%s", err, stop())
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "quro_") {
			srv.token = line
		}
		if rest, ok := strings.CutPrefix(line, "quro profiler on "); ok {
			srv.pprof, _, _ = strings.Cut(rest, " ")
		}
		if url, ok := strings.CutPrefix(line, "quro listening on "); ok {
			srv.url = url
			break
		}
	}
	go io.Copy(io.Discard, br)
	if srv.token == "" { // printed on the first start only
		tok, err := os.ReadFile(filepath.Join(data, AdminTokenFile))
		if err != nil {
			t.Fatal(err)
		}
		srv.token = strings.TrimSpace(string(tok))
	}
	return srv
}

// calls makes n list_capabilities calls over one keep-alive connection.
func calls(t testing.TB, url, token string, n int) {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	for range n {
		req, _ := http.NewRequest("POST", url+"/v1/list_capabilities", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("list_capabilities: %d", resp.StatusCode)
		}
	}
}

// logLines parses stderr's lines (text or JSON) into their keys.
func logLines(t *testing.T, stderr string, jsonFormat bool) []map[string]string {
	t.Helper()
	var out []map[string]string
	for line := range strings.Lines(stderr) {
		m := map[string]string{}
		if jsonFormat {
			var v map[string]any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				t.Fatalf("a log line is not JSON (%v): %q", err, line)
			}
			for k, x := range v {
				m[k] = fmt.Sprint(x)
			}
		} else {
			// The text handler's key=value and key="quoted value" pairs.
			for len(line) > 0 {
				line = strings.TrimLeft(line, " \n")
				k, rest, ok := strings.Cut(line, "=")
				if !ok {
					break
				}
				var v string
				if strings.HasPrefix(rest, `"`) {
					n := 1
					for n < len(rest) && (rest[n] != '"' || rest[n-1] == '\\') {
						n++
					}
					v = rest[1:n]
					rest = rest[min(n+1, len(rest)):]
				} else {
					v, rest, _ = strings.Cut(rest, " ")
				}
				m[k] = strings.TrimSpace(v)
				line = rest
			}
		}
		out = append(out, m)
	}
	return out
}

func count(lines []map[string]string, keyvals ...string) int {
	n := 0
next:
	for _, l := range lines {
		for i := 0; i+1 < len(keyvals); i += 2 {
			if l[keyvals[i]] != keyvals[i+1] {
				continue next
			}
		}
		n++
	}
	return n
}

// TestServeLogsO1LinesAtDefault: at the default level, a server under N
// calls writes a handful of lines (start, stop), not one per call; at
// debug, one "call" line per call; with --log-format json, every line is
// a JSON object.
func TestServeLogsO1LinesAtDefault(t *testing.T) {
	// 60 calls: a line per call at the default level is 60 lines against
	// the bound of 20 below, so the count still tells O(1) from O(n) (it
	// was 300: each call, list_capabilities with every schema, costs its
	// server CPU, and four servers ran them).
	const n = 60
	for _, tc := range []struct {
		flags []string
		json  bool
		calls int // "call" lines wanted
	}{
		{nil, false, 0},
		{[]string{"--log-format", "json"}, true, 0},
		{[]string{"--log-level", "debug"}, false, n},
		{[]string{"--log-level", "debug", "--log-format", "json"}, true, n},
	} {
		t.Run(strings.Join(append([]string{"default"}, tc.flags...), " "), func(t *testing.T) {
			t.Parallel() // each its own server, data directory and stderr
			// The server at its defaults (spare sessions made as it
			// starts and after the calls) logs a handful of lines; the
			// other cases are about the log's flags (testServeFlags).
			start := startLogServer
			if tc.flags == nil {
				start = startLogServerAtDefaults
			}
			srv := start(t, tc.flags...)
			calls(t, srv.url, srv.token, n)
			stderr := srv.stop()
			lines := logLines(t, stderr, tc.json)
			if got := count(lines, "msg", "call", "capability", "list_capabilities"); got != tc.calls {
				t.Errorf("%d call lines for %d calls, want %d", got, n, tc.calls)
			}
			if tc.calls == 0 && len(lines) > 20 {
				t.Errorf("%d lines for %d calls at level info, want a handful:\n%s", len(lines), n, stderr)
			}
			// A message written once per call passes its burst of 10
			// within the 60 calls, and the stop sums up what was held
			// back: at the default level, nothing was.
			if got := count(lines, "msg", "repeated log lines suppressed"); tc.calls == 0 && got != 0 {
				t.Errorf("%d summaries of suppressed lines for %d calls at level info, want none:\n%s", got, n, stderr)
			}
			if strings.Contains(stderr, srv.token) {
				t.Error("the log shows the admin token")
			}
		})
	}
}

// TestServeAccessLog: --access-log writes one line per request, at the
// default level, without the query or any header; the tenant of each
// authenticated request.
func TestServeAccessLog(t *testing.T) {
	t.Parallel()
	const n, bad = 50, 20
	srv := startLogServer(t, "--access-log")
	calls(t, srv.url, srv.token, n)
	for range bad {
		if r := do(t, "POST", srv.url+"/v1/list_capabilities?token=query-secret", "application/json", "{}",
			"Authorization", "Bearer quro_not-a-token"); r.status != 401 {
			t.Fatalf("bad token: %d", r.status)
		}
	}
	stderr := srv.stop()
	lines := logLines(t, stderr, false)
	if got := count(lines, "msg", "http"); got != n+bad {
		t.Errorf("%d access lines for %d requests:\n%s", got, n+bad, stderr)
	}
	if got := count(lines, "msg", "http", "method", "POST", "path", "/v1/list_capabilities", "status", "200", "tenant", ""); got != n {
		t.Errorf("%d access lines of the admin's calls (status 200, local tenant), want %d", got, n)
	}
	for _, l := range lines {
		if l["msg"] == "http" && l["status"] == "401" {
			if _, ok := l["tenant"]; ok {
				t.Errorf("a refused request names a tenant: %v", l)
			}
			if l["bytes"] == "0" || l["duration"] == "" || l["peer"] == "" {
				t.Errorf("an access line lacks its bytes, duration or peer: %v", l)
			}
		}
	}
	for _, secret := range []string{srv.token, "query-secret", "not-a-token"} {
		if strings.Contains(stderr, secret) {
			t.Errorf("the access log shows %q", secret)
		}
	}
}

// TestServeHostileClientLogsO1: requests a client makes to be refused
// (bad tokens; another caller's MCP session, which logs a warning) make a
// bounded number of lines; the suppressed ones are counted in a summary,
// so none goes unaccounted.
func TestServeHostileClientLogsO1(t *testing.T) {
	t.Parallel()
	const n = 500
	srv := startLogServer(t)
	other, _, code := quro(t, "", "token", "create", "--data", srv.data, "--tenant", "acme", "--scopes", "read")
	other = strings.TrimSpace(other)
	if code != 0 || other == "" {
		t.Fatal("token create failed")
	}
	for range n {
		if r := do(t, "POST", srv.url+"/v1/list_capabilities", "application/json", "{}",
			"Authorization", "Bearer quro_not-a-token"); r.status != 401 {
			t.Fatalf("bad token: %d", r.status)
		}
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequest("POST", srv.url+"/mcp", strings.NewReader(init))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+srv.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d %q", resp.StatusCode, session)
	}
	for range n {
		if r := do(t, "POST", srv.url+"/mcp", "application/json", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
			"Authorization", "Bearer "+other, "Mcp-Session-Id", session, "Accept", "application/json, text/event-stream"); r.status != 403 {
			t.Fatalf("another caller's MCP session: %d %s", r.status, r.body)
		}
	}
	stderr := srv.stop()
	lines := logLines(t, stderr, false)
	const warn = "mcp: request for a session of another caller refused"
	shown := count(lines, "msg", warn)
	suppressed := 0
	for _, l := range lines {
		if l["msg"] == "repeated log lines suppressed" && l["line"] == warn {
			var k int
			fmt.Sscan(l["suppressed"], &k)
			suppressed += k
		}
	}
	if shown+suppressed != n {
		t.Errorf("%d warnings shown and %d suppressed for %d refusals:\n%s", shown, suppressed, n, stderr)
	}
	if len(lines) > 60 {
		t.Errorf("%d lines for %d refused requests, want a bounded number:\n%s", len(lines), 2*n, stderr)
	}
}

func TestServeLogFlagsChecked(t *testing.T) {
	for _, args := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}, {"--pprof", "0.0.0.0:6060"}} {
		_, errs, code := quro(t, "", append([]string{"serve", "--addr", "127.0.0.1:0", "--data", t.TempDir()}, args...)...)
		if code == 0 || !strings.Contains(errs, args[0]) {
			t.Errorf("%v: exit %d, %q", args, code, errs)
		}
	}
}

// TestQuietBoundsEachMessage: at info and above, each message logs its
// burst, then one line a second; the rest is counted and summed up, with
// the ids of the suppressed lines (internal errors), and the count is
// exact. Debug lines and other messages are not held back.
func TestQuietBoundsEachMessage(t *testing.T) {
	var buf syncBuffer
	q := newQuiet(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), 10, 1, time.Hour)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q.lim.now = func() time.Time { return now }
	log := slog.New(q).With("path", "rest")
	for i := range 500 {
		log.Error("internal error", "id", fmt.Sprintf("id%03d", i), "err", fmt.Sprintf("cause %d", i))
		log.Debug("call", "n", i)
	}
	log.Warn("another message")
	now = now.Add(2 * time.Second) // two more tokens
	log.Error("internal error", "id", "late1")
	log.Error("internal error", "id", "late2")
	log.Error("internal error", "id", "late3") // suppressed
	q.close()
	lines := logLines(t, buf.b.String(), true)
	if got := count(lines, "msg", "call"); got != 500 {
		t.Errorf("%d debug lines of 500", got)
	}
	if got := count(lines, "msg", "another message"); got != 1 {
		t.Errorf("another message: %d lines", got)
	}
	shown := count(lines, "msg", "internal error")
	if shown != 12 || count(lines, "msg", "internal error", "id", "late2") != 1 {
		t.Errorf("%d internal errors shown, want the burst of 10 and 2 a token each", shown)
	}
	var sum map[string]string
	for _, l := range lines {
		if l["msg"] == "repeated log lines suppressed" {
			if sum != nil {
				t.Fatalf("two summaries: %v, %v", sum, l)
			}
			sum = l
		}
	}
	ids := strings.Split(sum["ids"], ",")
	if sum["line"] != "internal error" || sum["level"] != "ERROR" || sum["suppressed"] != "491" ||
		len(ids) != logSummaryIDs || ids[0] != "id010" || sum["ids_not_listed"] != "391" || sum["last_err"] != "cause 499" {
		t.Errorf("summary: %v", sum)
	}
}

// BenchmarkServeLogPerCall: warm run_code print(1) calls over REST with a
// keep-alive client, against quro serve whose stderr is a pipe that a
// reader drains (as journald does): at the default level (no line per
// call), at debug (one line per call, as every call logged before), and
// with the access log. log-B/op is the log's bytes per call.
//
//	go test ./cmd/quro/ -run '^$' -bench BenchmarkServeLogPerCall -benchtime 2000x -count 5
func BenchmarkServeLogPerCall(b *testing.B) {
	// The embedded Python, extracted once, linked into each data directory
	// (as seedPython does).
	shared := b.TempDir()
	root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	root.SetArgs([]string{"run", "--data", shared, "-c", "print(1)"})
	if err := root.Execute(); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name  string
		flags []string
	}{
		{"info", nil},
		{"debug", []string{"--log-level", "debug"}},
		{"access-log", []string{"--access-log"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := b.TempDir()
			if out, err := exec.Command("cp", "-al", filepath.Join(shared, "python"), filepath.Join(data, "python")).CombinedOutput(); err != nil {
				b.Fatalf("%v %s", err, out)
			}
			os.Remove(filepath.Join(data, "python", ".lock"))
			pr, pw, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			var logged atomic.Int64
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				buf := make([]byte, 64<<10)
				for {
					n, err := pr.Read(buf)
					logged.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
			srv := startLogServerOn(b, data, pw, func() string { pw.Close(); <-drained; return "" }, bc.flags...)
			client := &http.Client{Timeout: time.Minute}
			call := func() {
				req, _ := http.NewRequest("POST", srv.url+"/v1/run_code", strings.NewReader(`{"code":"print(1)"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+srv.token)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("run_code: %d %s", resp.StatusCode, body)
				}
			}
			for range 20 { // the session's worker, warm
				call()
			}
			before := logged.Load()
			b.ResetTimer()
			for b.Loop() {
				call()
			}
			b.StopTimer()
			srv.stop()
			b.ReportMetric(float64(logged.Load()-before)/float64(b.N), "log-B/op")
		})
	}
}

// A body a handler hands over as a reader (E2B's GET /files, a file for
// the kernel's copy) reaches the server's own ReadFrom through the access
// log, and is counted.
func TestAccessLogPassesReadFromOn(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logged, nil))
	const size = 1 << 20
	var sawReaderFrom bool
	srv := httptest.NewServer(accessLog(log, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rf, ok := w.(io.ReaderFrom)
		sawReaderFrom = ok
		if ok {
			_, _ = rf.ReadFrom(io.LimitReader(zeros{}, size))
		}
	})))
	res, err := http.Get(srv.URL + "/x")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	srv.Close() // the handler and its log line are done
	if !sawReaderFrom || err != nil || n != size || res.StatusCode != 200 {
		t.Fatalf("ReadFrom offered: %v; %d bytes, %v, status %d", sawReaderFrom, n, err, res.StatusCode)
	}
	if !strings.Contains(logged.String(), `"bytes":1048576`) || !strings.Contains(logged.String(), `"status":200`) {
		t.Fatalf("access line: %s", logged.String())
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
