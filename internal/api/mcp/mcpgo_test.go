package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mgclient "github.com/mark3labs/mcp-go/client"
	mgtransport "github.com/mark3labs/mcp-go/client/transport"
	mgmcp "github.com/mark3labs/mcp-go/mcp"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
)

// The third client of the table: github.com/mark3labs/mcp-go (v1.2.1),
// beside the official Go and TypeScript SDKs.
//
// mcp-go speaks protocol 2026-07-28 first: it probes with server/discover
// and, if the probe succeeds, sends every later request at 2026-07-28. The
// SDK's streamable HTTP handler keeps sessions, so it serves only the
// versions before 2026-07-28; quro answers the probe with
// UnsupportedProtocolVersionError and mcp-go falls back to initialize at
// 2025-11-25 (see refuseModernDiscover). On stdio the SDK serves 2026-07-28
// and mcp-go stays on it. A client that must talk to servers without that
// answer can pin the version: client.WithProtocolVersion("2025-11-25").

// startMcpGo initializes c and returns the protocol version it settled on.
func startMcpGo(t *testing.T, c *mgclient.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var req mgmcp.InitializeRequest
	req.Params.ClientInfo = mgmcp.Implementation{Name: "quro-test-mcp-go", Version: "1"}
	res, err := c.Initialize(ctx, req)
	if err != nil {
		t.Fatalf("mcp-go initialize: %v", err)
	}
	if res.ServerInfo.Name != "quro" {
		t.Fatalf("server info %+v", res.ServerInfo)
	}
	return c.ProtocolVersion()
}

func mcpGoCall(t *testing.T, c *mgclient.Client, name string, args map[string]any) *outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var req mgmcp.CallToolRequest
	req.Params.Name = name
	req.Params.Arguments = args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return &outcome{Protocol: err.Error()}
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var o outcome
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return &o
}

// runPlanMcpGo carries out the table's plan with an mcp-go client.
func runPlanMcpGo(t *testing.T, c *mgclient.Client) *run {
	t.Helper()
	setup, table := cases()
	r := &run{Results: map[string]*outcome{}}
	for _, sc := range setup {
		r.Setup = append(r.Setup, mcpGoCall(t, c, sc.Name, sc.Arguments))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.ListTools(ctx, mgmcp.ListToolsRequest{})
	if err != nil {
		t.Fatalf("mcp-go tools/list: %v", err)
	}
	for _, tl := range list.Tools {
		b, err := json.Marshal(tl)
		if err != nil {
			t.Fatal(err)
		}
		var lt listedTool
		if err := json.Unmarshal(b, &lt); err != nil {
			t.Fatal(err)
		}
		r.Tools = append(r.Tools, lt)
	}
	for _, tl := range r.Tools {
		tc, ok := table[tl.Name]
		if !ok {
			r.Missing = append(r.Missing, tl.Name)
			continue
		}
		r.Results[tl.Name] = mcpGoCall(t, c, tl.Name, tc.args)
	}
	return r
}

// mcp-go with its defaults calls every tool over streamable HTTP; its
// probe for 2026-07-28 holds no session.
func TestMcpGoClientHTTP(t *testing.T) {
	a := newApp(t)
	h := quromcp.Handler(a.Controller, httpOpen, &quromcp.Options{Tools: "full"})
	url := serveHandler(t, h)
	c, err := mgclient.NewStreamableHttpClient(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v := startMcpGo(t, c); v != "2025-11-25" {
		t.Errorf("mcp-go settled on protocol %q over HTTP, want 2025-11-25", v)
	}
	if n := h.(quromcp.Counter).Count(); n != 1 {
		t.Errorf("%d MCP sessions held after one client connected (the probe must not hold one)", n)
	}
	checkRun(t, a.Controller.Registry().Names(), runPlanMcpGo(t, c))
}

// The documented workaround for servers that accept the probe: pinning
// the protocol version skips it.
func TestMcpGoClientHTTPPinned(t *testing.T) {
	a := newApp(t)
	tr, err := mgtransport.NewStreamableHTTP(serveHTTP(t, a, httpOpen, nil))
	if err != nil {
		t.Fatal(err)
	}
	c := mgclient.NewClient(tr, mgclient.WithProtocolVersion("2025-11-25"))
	defer c.Close()
	if v := startMcpGo(t, c); v != "2025-11-25" {
		t.Errorf("protocol %q", v)
	}
	if o := mcpGoCall(t, c, "run_code", map[string]any{"lang": "shell", "code": "echo pinned"}); o.IsError || !strings.Contains(o.text(), "pinned") {
		t.Fatalf("%+v", o)
	}
}

// mcp-go calls every tool over stdio against the real quro mcp binary
// (there the SDK serves 2026-07-28, and mcp-go speaks it).
func TestMcpGoClientStdio(t *testing.T) {
	bin, err := buildQuro()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	tr := mgtransport.NewStdioWithOptions(bin, nil, []string{"mcp", "--data", dataDir(t), "--tools", "full"}, mgtransport.WithCommandStderrWriter(&stderr))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The server is modern (2026-07-28) and answers server/discover, but
	// a loaded machine can take longer than mcp-go's 5 s probe bound to
	// start it: the client then sends initialize as well, after the late
	// discover had set the session up ("duplicate initialize received").
	// The probe gets the handshake's own minute.
	c := mgclient.NewClient(tr, mgclient.WithDiscoverTimeout(time.Minute))
	defer c.Close()
	v := startMcpGo(t, c)
	t.Logf("mcp-go over stdio speaks %s", v)
	checkRun(t, registered(t), runPlanMcpGo(t, c))
	if t.Failed() {
		t.Logf("quro mcp stderr:\n%s", stderr.String())
	}
}

// A server/discover probe at 2026-07-28 over HTTP gets the error the
// specification wants from a server that does not serve that version, and
// takes no session place.
func TestHTTPModernDiscoverRefused(t *testing.T) {
	a := newApp(t)
	h := quromcp.Handler(a.Controller, httpOpen, nil)
	url := serveHandler(t, h)
	body := `{"jsonrpc":"2.0","id":7,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"probe","version":"1"}}}}`
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "server/discover")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var got struct {
		ID    int `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				Supported []string `json:"supported"`
				Requested string   `json:"requested"`
			} `json:"data"`
		} `json:"error"`
	}
	if resp.StatusCode != 400 || json.Unmarshal(b, &got) != nil || got.ID != 7 || got.Error.Code != -32022 ||
		got.Error.Data.Requested != "2026-07-28" || len(got.Error.Data.Supported) == 0 || got.Error.Data.Supported[0] != "2025-11-25" {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if n := h.(quromcp.Counter).Count(); n != 0 {
		t.Fatalf("the probe holds %d sessions", n)
	}
}

func serveHandler(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// lockedBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
