package mcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox/sandboxtest"
)

// bearer adds "Authorization: Bearer <token>" to every request; the token
// can change between requests.
type bearer struct {
	token atomic.Value // string
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if tok, _ := b.token.Load().(string); tok != "" {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// connectHTTP connects a Go SDK client to url over streamable HTTP.
func connectHTTP(t *testing.T, url string, rt http.RoundTripper, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "quro-test", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: rt}}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func serveHTTP(t *testing.T, a *app.App, auth func(*http.Request) (controller.Caller, error), opts *quromcp.Options) string {
	t.Helper()
	srv := httptest.NewServer(quromcp.Handler(a.Controller, auth, opts))
	t.Cleanup(srv.Close)
	return srv.URL
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*outcome, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, err
	}
	return toOutcome(t, res), nil
}

func toOutcome(t *testing.T, res *mcp.CallToolResult) *outcome {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var o outcome
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

// runPlan carries out the table's plan with a Go client.
func runPlan(t *testing.T, cs *mcp.ClientSession) *run {
	t.Helper()
	setup, table := cases()
	r := &run{Results: map[string]*outcome{}}
	for _, c := range setup {
		o, err := callTool(t, cs, c.Name, c.Arguments)
		if err != nil {
			o = &outcome{Protocol: err.Error()}
		}
		r.Setup = append(r.Setup, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for tl, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		schema, _ := json.Marshal(tl.OutputSchema)
		r.Tools = append(r.Tools, listedTool{Name: tl.Name, OutputSchema: schema})
	}
	for _, tl := range r.Tools {
		c, ok := table[tl.Name]
		if !ok {
			r.Missing = append(r.Missing, tl.Name)
			continue
		}
		o, err := callTool(t, cs, tl.Name, c.args)
		if err != nil {
			o = &outcome{Protocol: err.Error()}
		}
		r.Results[tl.Name] = o
	}
	return r
}

// Every capability over streamable HTTP with the Go SDK client, then
// artifacts, errors and an unknown tool.
func TestHTTPEveryTool(t *testing.T) {
	var paths sync.Map
	a := newApp(t, func(_ context.Context, r *controller.Record) { paths.Store(r.Caller.Path, true) })
	// ?tools=full: the client chooses the profile that lists every tool.
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, nil)+"/?tools=full", http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, a.Controller.Registry().Names(), runPlan(t, cs))
	paths.Range(func(k, _ any) bool {
		if k != "mcp" {
			t.Errorf("a call reached the controller with path %q", k)
		}
		return true
	})
	checkArtifactsAndErrors(t, cs)
}

func httpOpen(r *http.Request) (controller.Caller, error) {
	return controller.Caller{Scope: capability.ScopeAdmin}, nil
}

func checkArtifactsAndErrors(t *testing.T, cs *mcp.ClientSession) {
	for _, tc := range []struct {
		name string
		args map[string]any
		kind string // "resource" or "image"
		mime string
		data string // substring of the resource text or decoded image
	}{
		{"html", map[string]any{"lang": "html", "code": "<h1>hello</h1>"}, "resource", "text/html", "<h1>hello</h1>"},
		{"svg", map[string]any{"lang": "svg", "code": `<svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>`}, "svg", "image/svg+xml", "<circle"},
		{"png", map[string]any{"code": pngCode}, "image", "image/png", "\x89PNG\r\n"},
		{"jpeg", map[string]any{"code": `display(b"\xff\xd8\xff\xe0\x00\x10JFIF", mime="image/jpeg")`}, "image", "image/jpeg", "\xff\xd8\xff\xe0\x00\x10JFIF"},
		{"markdown", map[string]any{"code": "class M:\n    def _repr_markdown_(self): return '# *hi*'\nM()"}, "resource", "text/markdown", "# *hi*"},
	} {
		t.Run("artifact "+tc.name, func(t *testing.T) {
			if tc.kind == "image" && tc.name != "svg" && !embeddedPython || tc.name == "markdown" && !embeddedPython {
				t.Skip("PNG artifacts come from the embedded Python's display hooks; this build has none")
			}
			o, err := callTool(t, cs, "run_code", tc.args)
			if err != nil {
				t.Fatal(err)
			}
			n := 2
			if tc.kind == "svg" {
				n = 3 // the SVG as a resource, then rasterised to PNG
			}
			if o.IsError || len(o.Content) != n || o.Content[0].Type != "text" || !strings.Contains(o.Content[0].Text, "artifact") {
				t.Fatalf("%+v", o)
			}
			c := o.Content[1]
			switch tc.kind {
			case "svg":
				if c.Type != "resource" || c.Resource == nil || c.Resource.MIMEType != tc.mime || !strings.Contains(c.Resource.Text, tc.data) {
					t.Fatalf("%+v %+v", c, c.Resource)
				}
				if w, h := pngSize(t, o.Content[2]); w != 300 || h != 150 {
					t.Fatalf("the SVG rasterised to %d×%d, want 300×150 (its default size)", w, h)
				}
			case "resource":
				if c.Type != "resource" || c.Resource == nil || c.Resource.MIMEType != tc.mime || !strings.Contains(c.Resource.Text, tc.data) ||
					!strings.HasPrefix(c.Resource.URI, "quro://sessions/") {
					t.Fatalf("%+v %+v", c, c.Resource)
				}
			case "image":
				b, err := base64.StdEncoding.DecodeString(c.Data)
				if c.Type != "image" || c.MIMEType != tc.mime || err != nil || !strings.Contains(string(b), tc.data) {
					t.Fatalf("%+v (%v) %q", c, err, b)
				}
			}
		})
	}
	for _, tc := range []struct {
		name string
		args map[string]any
		code string
	}{
		{"unknown lang", map[string]any{"code": "x", "lang": "cobol"}, "invalid_argument"},
		{"missing session", map[string]any{"code": "print(1)", "session": "ghost"}, "not_found"},
		{"unknown argument", map[string]any{"code": "print(1)", "langg": "py"}, "invalid_argument"},
	} {
		t.Run("error "+tc.name, func(t *testing.T) {
			o, err := callTool(t, cs, "run_code", tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if err := toolError(tc.code)(o); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("unknown tool is a protocol error", func(t *testing.T) {
		_, err := callTool(t, cs, "no_such_tool", map[string]any{})
		if err == nil || !strings.Contains(err.Error(), "no_such_tool") {
			t.Fatalf("%v", err)
		}
	})
}

// tokens is an auth Func over fixed bearer tokens.
func tokens(r *http.Request) (controller.Caller, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer admin":
		return controller.Caller{Tenant: "alice", TokenID: "t-admin", Scope: capability.ScopeAdmin}, nil
	case "Bearer ro":
		return controller.Caller{Tenant: "alice", TokenID: "t-ro", Scope: capability.ScopeRead}, nil
	}
	return controller.Caller{}, capability.Errorf(capability.Unauthenticated, "no valid bearer token")
}

func TestHTTPAuth(t *testing.T) {
	var mu sync.Mutex
	var records []controller.Record
	a := newApp(t, func(_ context.Context, r *controller.Record) {
		mu.Lock()
		defer mu.Unlock()
		records = append(records, *r)
	})
	calls := func() []controller.Record {
		mu.Lock()
		defer mu.Unlock()
		return append([]controller.Record(nil), records...)
	}
	url := serveHTTP(t, a, tokens, nil)

	t.Run("no token is 401 with WWW-Authenticate", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(1)"}}}`
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct{ Error capability.Error }
		if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") ||
			json.Unmarshal(b, &e) != nil || e.Error.Code != capability.Unauthenticated {
			t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b)
		}
		if _, err := connectHTTP(t, url, &bearer{}, nil); err == nil {
			t.Fatal("a client without a token connected")
		}
	})

	rt := &bearer{}
	rt.token.Store("admin")
	cs, err := connectHTTP(t, url, rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := callTool(t, cs, "get_service_status", nil); err != nil || o.IsError {
		t.Fatalf("%v %+v", err, o)
	}
	if got := calls(); len(got) != 1 || got[0].Caller != (controller.Caller{Path: "mcp", Tenant: "alice", TokenID: "t-admin", Scope: capability.ScopeAdmin}) {
		t.Fatalf("the controller saw %+v", got)
	}

	// The Go client ends its session on a 401 or 403, so each of these
	// gets its own.
	t.Run("a rejected request reaches no tool", func(t *testing.T) {
		rt := &bearer{}
		rt.token.Store("admin")
		cs, err := connectHTTP(t, url, rt, nil)
		if err != nil {
			t.Fatal(err)
		}
		rt.token.Store("wrong")
		if _, err := callTool(t, cs, "run_code", map[string]any{"code": "print(1)"}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Fatalf("a call with a bad token: %v", err)
		}
		if n := len(calls()); n != 1 {
			t.Fatalf("%d calls reached the controller", n)
		}
	})

	t.Run("a session is pinned to its caller", func(t *testing.T) {
		rt := &bearer{}
		rt.token.Store("admin")
		cs, err := connectHTTP(t, url, rt, nil)
		if err != nil {
			t.Fatal(err)
		}
		rt.token.Store("ro") // valid, but not the session's caller
		if _, err := callTool(t, cs, "get_service_status", nil); err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Fatalf("another caller used the session: %v", err)
		}
		if n := len(calls()); n != 1 {
			t.Fatalf("%d calls reached the controller", n)
		}
	})

	t.Run("read-only caller", func(t *testing.T) {
		ro := &bearer{}
		ro.token.Store("ro")
		cs, err := connectHTTP(t, url, ro, nil)
		if err != nil {
			t.Fatal(err)
		}
		o, err := callTool(t, cs, "run_code", map[string]any{"code": "print(1)"})
		if err != nil {
			t.Fatal(err)
		}
		if err := toolError("permission_denied")(o); err != nil {
			t.Fatal(err)
		}
		if o, err := callTool(t, cs, "help", nil); err != nil || o.IsError {
			t.Fatalf("help as read-only: %v %+v", err, o)
		}
		got := calls()
		if last := got[len(got)-1]; last.Caller.TokenID != "t-ro" || last.Caller.Path != "mcp" {
			t.Fatalf("%+v", last.Caller)
		}
	})

	// The first admin session still works after all that.
	if o, err := callTool(t, cs, "run_code", map[string]any{"code": "print(6*7)"}); err != nil || o.IsError || !strings.Contains(o.text(), "42") {
		t.Fatalf("%v %+v", err, o)
	}
}

// A client that cancels its call kills the run's processes; the call is
// audited and counted as canceled, not ok; the session goes on. Both ways a
// call is served: streamed by the SDK (the call has a progress token) and
// directly (a plain call, answered as JSON).
func TestCancelKillsTheRun(t *testing.T) {
	t.Run("streamed", func(t *testing.T) { cancelKillsTheRun(t, true) })
	t.Run("direct", func(t *testing.T) { cancelKillsTheRun(t, false) })
}

func cancelKillsTheRun(t *testing.T, withProgress bool) {
	finished := make(chan controller.Record, 16)
	a := newApp(t, func(_ context.Context, r *controller.Record) {
		if r.Capability == "run_code" {
			finished <- *r
		}
	})
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, &quromcp.Options{ProgressEvery: 100 * time.Millisecond}), http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := callTool(t, cs, "get_session_status", nil)
	if err != nil || st.IsError {
		t.Fatalf("%v %+v", err, st)
	}
	// The host path (a caller reads /home/user).
	ws := filepath.Join(a.DataDir, "sessions", st.Structured["id"].(string), "workspace")
	fifo := filepath.Join(ws, "pid.fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
			"lang": "shell", "code": "echo $$ > pid.fifo; sleep 300", "timeout_ms": 600000,
		}}
		if withProgress {
			params.SetProgressToken("cancel-me")
		}
		_, err := cs.CallTool(ctx, params)
		done <- err
	}()
	// Opening the FIFO waits for the run to open it: then the run is on.
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("the run wrote %q", b)
	}
	host := pid
	if hp, ok := sandboxtest.HostPID(pid, ws); ok {
		host = hp
	}
	// A pidfd names this process, not whatever gets its number later.
	fd, err := unix.PidfdOpen(host, 0)
	if err != nil {
		t.Fatalf("pidfd of %d (box pid %d): %v", host, pid, err)
	}
	defer unix.Close(fd)

	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the canceled call returned %v", err)
	}
	// The pidfd becomes readable when the process exits.
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 30_000)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(fds, 30_000)
	}
	if err != nil || n != 1 {
		t.Fatalf("the run's process %d is still alive 30 s after the cancel (%v)", host, err)
	}
	// The server finishes the canceled call after the client gave up on it.
	if r := <-finished; r.Outcome != controller.OutcomeCanceled || r.Caller.Path != "mcp" {
		t.Fatalf("the canceled call finished as %q (path %q)", r.Outcome, r.Caller.Path)
	}
	checkCanceledRecorded(t, a, cs)

	if o, err := callTool(t, cs, "run_code", map[string]any{"code": "echo after", "lang": "shell"}); err != nil || o.IsError || !strings.Contains(o.text(), "after") {
		t.Fatalf("the next call: %v %+v", err, o)
	}
}

// checkCanceledRecorded reads the audit log over MCP and scrapes /metrics:
// the one run_code call so far was canceled.
func checkCanceledRecorded(t *testing.T, a *app.App, cs *mcp.ClientSession) {
	t.Helper()
	o, err := callTool(t, cs, "get_audit_log", map[string]any{"capability": "run_code"})
	if err != nil || o.IsError {
		t.Fatalf("get_audit_log: %v %+v", err, o)
	}
	entries, _ := o.Structured["entries"].([]any)
	if len(entries) != 1 {
		t.Fatalf("audit entries for run_code: %v", entries)
	}
	if e := entries[0].(map[string]any); e["outcome"] != "canceled" || e["path"] != "mcp" {
		t.Fatalf("the canceled call is audited as %v", e)
	}
	srv := httptest.NewServer(a.Metrics.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "quro_calls_total{") && strings.Contains(l, `capability="run_code"`) {
			lines = append(lines, l)
		}
	}
	if want := `quro_calls_total{capability="run_code",outcome="canceled",path="mcp"} 1`; len(lines) != 1 || lines[0] != want {
		t.Fatalf("metrics for run_code: %q, want %q", lines, want)
	}
}

// A run longer than a second tells a client that asked for progress.
func TestProgressNotifications(t *testing.T) {
	a := newApp(t)
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	opts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Params)
	}}
	cs, err := connectHTTP(t, serveHTTP(t, a, httpOpen, nil), http.DefaultTransport, opts)
	if err != nil {
		t.Fatal(err)
	}
	params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"lang": "shell", "code": "sleep 2.5; echo slept"}}
	params.SetProgressToken("tok-1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError {
		t.Fatalf("%v %+v", err, res)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 {
		t.Fatal("no progress notification in a 2.5 s run")
	}
	if p := got[0]; p.ProgressToken != "tok-1" || p.Progress <= 0 || !strings.Contains(p.Message, "run_code running for") {
		t.Fatalf("%+v", p)
	}
}

// ServeStdio serves a whole session on a pair of pipes, as quro mcp does.
func TestServeStdioInProcess(t *testing.T) {
	a := newApp(t)
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- quromcp.ServeStdio(ctx, a.Controller, sr, sw, nil) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "quro-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.IOTransport{Reader: cr, Writer: cw}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := callTool(t, cs, "run_code", map[string]any{"code": "echo $QURO_X-ok", "lang": "sh"})
	if err != nil || o.IsError || !strings.Contains(o.text(), "-ok") {
		t.Fatalf("%v %+v", err, o)
	}
	cs.Close()
	cancel()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "closed") {
		t.Fatalf("ServeStdio: %v", err)
	}
}

// buildQuro builds the quro binary once per test run, or returns
// $QURO_TEST_BIN: make test passes the bin/quro its install step has just
// built from this tree (a link of the binary is seconds of CPU on a
// loaded machine). The slim build always builds its own (make build's
// has the embedded Python).
var buildQuro = sync.OnceValues(func() (string, error) {
	if bin := os.Getenv("QURO_TEST_BIN"); bin != "" && embeddedPython {
		return bin, nil
	}
	dir, err := os.MkdirTemp("", "quro-mcp-test-bin")
	if err != nil {
		return "", err
	}
	builtDir = dir
	bin := filepath.Join(dir, "quro")
	// -trimpath as make build and make test compile: the packages come
	// from the build cache instead of a second compile of the module.
	args := []string{"build", "-trimpath", "-o", bin}
	if !embeddedPython {
		args = append(args, "-tags", "slim")
	}
	out, err := exec.Command("go", append(args, "../../../cmd/quro")...).CombinedOutput()
	if err != nil {
		return "", errors.New("go build: " + err.Error() + "\n" + string(out))
	}
	return bin, nil
})

// builtDir holds the binary buildQuro built ("" when none was built).
var builtDir string

func TestMain(m *testing.M) {
	code := m.Run()
	// Only what a test built: a run of tests that needed no binary (go
	// test -run) builds none here either.
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// Every capability over stdio against the real quro mcp binary.
func TestStdioBinaryEveryTool(t *testing.T) {
	bin, err := buildQuro()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "mcp", "--data", dataDir(t), "--tools", "full")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "quro-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\nstderr: %s", err, stderr.String())
	}
	r := runPlan(t, cs)
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	checkRun(t, registered(t), r)
	if t.Failed() {
		t.Logf("quro mcp stderr:\n%s", stderr.String())
	}
}

// registered is the registry's tool names, from an App of this build.
func registered(t *testing.T) []string {
	return newApp(t).Controller.Registry().Names()
}
