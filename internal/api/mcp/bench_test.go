package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

// servedBed is one real App served as `quro serve` serves it: a real exec
// token verified on every request, REST under /v1/ and MCP streamable HTTP
// at /mcp behind the same origin/Host check, on a loopback listener.
type servedBed struct {
	app    *app.App
	url    string
	token  string
	caller controller.Caller
	client *http.Client // keep-alive, no token (the callers add it)
}

func newServedBed(tb testing.TB, opts *quromcp.Options) *servedBed {
	tb.Helper()
	ctx := context.Background()
	a, err := app.New(ctx, dataDir(tb), &app.Options{Python: testPython})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	if a.Python != nil {
		if err := a.Python.Warm(ctx); err != nil {
			tb.Fatal(err)
		}
	}
	// A tenant of its own: the local tenant's process ceiling is shared by
	// every quro on the machine (one cgroup per tenant name).
	iss, err := a.CreateToken(ctx, "bench", "mcp-bench", []string{"exec"}, "bench")
	if err != nil {
		tb.Fatal(err)
	}
	caller, err := a.VerifyToken(ctx, iss.Token)
	if err != nil {
		tb.Fatal(err)
	}
	auth := a.Authenticate()
	access := rest.Access{Auth: auth}
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Access: access}))
	mcpH := quromcp.Handler(a.Controller, auth, opts)
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := access.Check(r); e != nil { // cmd/quro/serve.go's guard
			rest.WriteError(w, http.StatusForbidden, e)
			return
		}
		mcpH.ServeHTTP(w, r)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { srv.Close() })
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute}
	tb.Cleanup(tr.CloseIdleConnections)
	return &servedBed{app: a, url: "http://" + ln.Addr().String(), token: iss.Token, caller: caller, client: &http.Client{Transport: tr}}
}

// tokenRT adds the bed's token to every request, as an agent's client does.
type tokenRT struct {
	token string
	rt    http.RoundTripper
}

func (t *tokenRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.rt.RoundTrip(r)
}

// rest is POST /v1/run_code with body, the result decoded.
func (b *servedBed) rest(ctx context.Context, body []byte) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/run_code", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := b.client.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	var r runcode.Result
	if err := json.Unmarshal(data, &r); err != nil {
		return err
	}
	return checkPrint1(&r)
}

func checkPrint1(r *runcode.Result) error {
	if r.ExitCode != 0 || r.Error != "" || r.Stdout != "1\n" {
		return fmt.Errorf("unexpected result: exit %d, error %q, stdout %q, stderr %q", r.ExitCode, r.Error, r.Stdout, r.Stderr)
	}
	return nil
}

// sdkSession connects the official Go SDK client to the bed.
func (b *servedBed) sdkSession(tb testing.TB) *mcp.ClientSession {
	tb.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "quro-bench", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   b.url + "/mcp",
		HTTPClient: &http.Client{Transport: &tokenRT{token: b.token, rt: b.client.Transport}},
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cs.Close() })
	return cs
}

func sdkCall(ctx context.Context, cs *mcp.ClientSession, args map[string]any) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: args})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("error result %+v", res.Content)
	}
	if t, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(t.Text, "1") {
		return fmt.Errorf("unexpected content %+v", res.Content[0])
	}
	return nil
}

// rawSession is an MCP session driven by plain HTTP requests: what the
// server costs without the SDK client's own work, and what a client other
// than the SDK's sees.
type rawSession struct {
	url, token string
	client     *http.Client
	id         string
}

// rawConnect initializes a session by hand at url (the /mcp endpoint) with
// the bearer token.
func rawConnect(tb testing.TB, client *http.Client, url, token string) *rawSession {
	tb.Helper()
	s := &rawSession{url: url, token: token, client: client}
	ctx := context.Background()
	resp, data, err := s.post(ctx, []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("initialize: %v %v %s", err, resp, data)
	}
	s.id = resp.Header.Get("Mcp-Session-Id")
	if s.id == "" {
		tb.Fatal("initialize: no session id")
	}
	if resp, data, err = s.post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || resp.StatusCode != http.StatusAccepted {
		tb.Fatalf("initialized: %v %v %s", err, resp, data)
	}
	tb.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Session-Id", s.id)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return s
}

// post sends body on the session (as s.token), read whole.
func (s *rawSession) post(ctx context.Context, body []byte) (*http.Response, []byte, error) {
	return s.postAs(ctx, s.token, body)
}

func (s *rawSession) postAs(ctx context.Context, token string, body []byte) (*http.Response, []byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if s.id != "" {
		req.Header.Set("Mcp-Session-Id", s.id)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, data, err
}

// call posts a tools/call of run_code and decodes its result from the
// JSON or event-stream answer.
func (s *rawSession) call(ctx context.Context, body []byte) error {
	resp, data, err := s.post(ctx, body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	msg, err := jsonRPCMessage(resp.Header.Get("Content-Type"), data)
	if err != nil {
		return err
	}
	var m struct {
		Result struct {
			IsError           bool            `json:"isError"`
			StructuredContent *runcode.Result `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return err
	}
	if m.Result.IsError || m.Result.StructuredContent == nil {
		return fmt.Errorf("error result: %s", msg)
	}
	return checkPrint1(m.Result.StructuredContent)
}

// jsonRPCMessage is the last message of an answer: the body of a JSON
// answer, or the data of the last event of an event stream.
func jsonRPCMessage(contentType string, data []byte) ([]byte, error) {
	if strings.HasPrefix(contentType, "application/json") {
		return data, nil
	}
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			last = slices.Clone(d)
		}
	}
	if last == nil {
		return nil, fmt.Errorf("no message in the answer (%s): %q", contentType, data)
	}
	return last, nil
}

// BenchmarkToolsCallVsREST measures warm run_code print(1) through one real
// served App (token auth on every request), the paths interleaved in each
// iteration so that a noisy machine hits them alike: REST POST /v1/run_code,
// MCP tools/call with the official Go SDK client, and the same tools/call
// posted by a plain HTTP client (the server's part of MCP, without the SDK
// client's). It reports each path's median and the ratios to REST:
//
//	go test -run '^$' -bench ToolsCallVsREST -benchtime 2000x ./internal/api/mcp/
func BenchmarkToolsCallVsREST(b *testing.B) {
	bed := newServedBed(b, nil)
	ctx := context.Background()
	restBody, _ := json.Marshal(app.RunCodeInput{Code: "print(1)"})
	sdkArgs := map[string]any{"code": "print(1)"}
	rawBody := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(1)"}}}`)
	cs := bed.sdkSession(b)
	raw := rawConnect(b, bed.client, bed.url+"/mcp", bed.token)
	paths := []struct {
		name string
		f    func() error
	}{
		{"in-process", func() error {
			reply, err := bed.app.Controller.Call(ctx, bed.caller, "run_code", restBody)
			if err != nil {
				return err
			}
			return checkPrint1(reply.Output.(*runcode.Result))
		}},
		{"rest", func() error { return bed.rest(ctx, restBody) }},
		{"mcp-sdk", func() error { return sdkCall(ctx, cs, sdkArgs) }},
		{"mcp-raw", func() error { return raw.call(ctx, rawBody) }},
	}
	for _, p := range paths { // the first run starts the worker; warm connections
		for range 20 {
			if err := p.f(); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
		}
	}
	ds := make([][]time.Duration, len(paths))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for k := range paths {
			j := (i + k) % len(paths) // rotate the order, so that none always follows another
			t := time.Now()
			if err := paths[j].f(); err != nil {
				b.Fatalf("%s: %v", paths[j].name, err)
			}
			ds[j] = append(ds[j], time.Since(t))
		}
	}
	b.StopTimer()
	med := make([]float64, len(paths))
	for j, p := range paths {
		slices.Sort(ds[j])
		med[j] = float64(ds[j][len(ds[j])/2]) / 1e3
		b.ReportMetric(med[j], p.name+"-µs")
	}
	b.ReportMetric(med[2]/med[1], "mcp-sdk/rest")
	b.ReportMetric(med[3]/med[1], "mcp-raw/rest")
}

// BenchmarkToolsCall is BenchmarkToolsCallVsREST's paths one at a time (for
// a CPU profile of one path):
//
//	go test -run '^$' -bench 'ToolsCall$/mcp-raw' -cpuprofile cpu.out ./internal/api/mcp/
func BenchmarkToolsCall(b *testing.B) {
	bed := newServedBed(b, nil)
	ctx := context.Background()
	restBody, _ := json.Marshal(app.RunCodeInput{Code: "print(1)"})
	rawBody := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(1)"}}}`)
	run := func(name string, f func() error) {
		b.Run(name, func(b *testing.B) {
			for range 20 {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("in-process", func() error {
		reply, err := bed.app.Controller.Call(ctx, bed.caller, "run_code", restBody)
		if err != nil {
			return err
		}
		return checkPrint1(reply.Output.(*runcode.Result))
	})
	run("rest", func() error { return bed.rest(ctx, restBody) })
	cs := bed.sdkSession(b)
	run("mcp-sdk", func() error { return sdkCall(ctx, cs, map[string]any{"code": "print(1)"}) })
	raw := rawConnect(b, bed.client, bed.url+"/mcp", bed.token)
	run("mcp-raw", func() error { return raw.call(ctx, rawBody) })
}

// BenchmarkSessionOpen is what a client that opens a session per call
// pays on top of the call: initialize, notifications/initialized and the
// DELETE that ends the session (each session has a server of its own,
// built for its caller).
//
//	go test -run '^$' -bench SessionOpen ./internal/api/mcp/
func BenchmarkSessionOpen(b *testing.B) {
	bed := newServedBed(b, nil)
	ctx := context.Background()
	for b.Loop() {
		s := &rawSession{url: bed.url + "/mcp", token: bed.token, client: bed.client}
		resp, data, err := s.post(ctx, []byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("initialize: %v %v %s", err, resp, data)
		}
		s.id = resp.Header.Get("Mcp-Session-Id")
		if resp, data, err = s.post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || resp.StatusCode != http.StatusAccepted {
			b.Fatalf("initialized: %v %v %s", err, resp, data)
		}
		req, _ := http.NewRequest(http.MethodDelete, s.url, nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		req.Header.Set("Mcp-Session-Id", s.id)
		resp, err = bed.client.Do(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			b.Fatalf("DELETE: %v %v", err, resp)
		}
		resp.Body.Close()
	}
}
