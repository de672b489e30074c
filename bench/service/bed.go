package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
)

// bed is one real App served on a loopback listener the way `quro serve`
// serves it (cmd/quro/serve.go): token authentication from the store on
// every request, REST under /v1/ and MCP streamable HTTP at /mcp, behind the
// same origin/Host check. The WebSocket routes and /metrics are left out:
// nothing here uses them.
type bed struct {
	App    *app.App
	Token  string
	Caller controller.Caller // what the token authenticates as, for in-process calls
	URL    string            // http://127.0.0.1:port

	srv    *http.Server
	client *http.Client // keep-alive, bearer token
	mcp    *mcp.ClientSession
}

// newBed assembles the App in dataDir with the embedded interpreter
// extracted under install, issues an exec token for the local tenant,
// listens on 127.0.0.1:0 and connects one MCP client session.
func newBed(ctx context.Context, dataDir, install string, limits app.Limits) (*bed, error) {
	a, err := app.New(ctx, dataDir, &app.Options{Python: &python.EmbeddedOptions{InstallRoot: install}, Limits: limits})
	if err != nil {
		return nil, err
	}
	b := &bed{App: a}
	if err := b.start(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *bed) start(ctx context.Context) error {
	a := b.App
	if err := a.Python.Warm(ctx); err != nil {
		return err
	}
	iss, err := a.CreateToken(ctx, "bench", "", []string{"exec"}, "bench")
	if err != nil {
		return err
	}
	b.Token = iss.Token
	if b.Caller, err = a.VerifyToken(ctx, iss.Token); err != nil {
		return err
	}
	b.Caller.Path = "bench"

	log := slog.New(slog.DiscardHandler)
	authFn := a.Authenticate()
	access := rest.Access{Auth: authFn}
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Logger: log, Access: access}))
	mcpH := quromcp.Handler(a.Controller, authFn, &quromcp.Options{Logger: log})
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := access.Check(r); e != nil { // serve.go's guard
			rest.WriteError(w, http.StatusForbidden, e)
			return
		}
		mcpH.ServeHTTP(w, r)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	b.URL = "http://" + ln.Addr().String()
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }() // http.ErrServerClosed, at Close

	b.client = &http.Client{Transport: &bearer{token: b.Token, rt: &http.Transport{
		MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute,
	}}}
	mc := mcp.NewClient(&mcp.Implementation{Name: "quro-bench", Version: "1"}, nil)
	b.mcp, err = mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL + "/mcp", HTTPClient: b.client}, nil)
	return err
}

// Close ends the MCP session, the server and the App.
func (b *bed) Close() {
	if b.mcp != nil {
		b.mcp.Close()
	}
	if b.srv != nil {
		b.srv.Close()
	}
	b.App.Close()
}

// bearer adds the token to every request, as an agent's HTTP client does.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (t *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.rt.RoundTrip(r)
}

// runArgs is run_code's input for print(1), in session (default when "").
func runArgs(session string) []byte {
	b, _ := json.Marshal(app.RunCodeInput{Code: "print(1)", Session: session})
	return b
}

// InProcess is run_code through the controller, as the token's caller.
func (b *bed) InProcess(ctx context.Context, args []byte) error {
	reply, err := b.App.Controller.Call(ctx, b.Caller, "run_code", args)
	if err != nil {
		return err
	}
	return checkResult(reply.Output.(*runcode.Result))
}

// REST is POST /v1/{capability} with body, decoded like a client would.
func (b *bed) REST(ctx context.Context, capability string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+"/v1/"+capability, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
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
		return fmt.Errorf("%s: HTTP %d: %s", capability, resp.StatusCode, bytes.TrimSpace(data))
	}
	if capability != "run_code" {
		return nil
	}
	var res runcode.Result
	if err := json.Unmarshal(data, &res); err != nil {
		return err
	}
	return checkResult(&res)
}

// MCP is tools/call run_code over the one streamable HTTP session.
func (b *bed) MCP(ctx context.Context, args map[string]any) error {
	res, err := b.mcp.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: args})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("run_code over MCP: error result %+v", res.Content)
	}
	if t, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(t.Text, "1") {
		return fmt.Errorf("run_code over MCP: unexpected content %+v", res.Content[0])
	}
	return nil
}

func checkResult(r *runcode.Result) error {
	if r.ExitCode != 0 || r.Error != "" || r.Stdout != "1\n" {
		return fmt.Errorf("unexpected result: exit %d, error %q, stdout %q, stderr %q", r.ExitCode, r.Error, r.Stdout, r.Stderr)
	}
	return nil
}
