package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/runcode"
)

// bed is one real App served with REST and MCP (benchbed), and one MCP
// client session connected to it.
type bed struct {
	*benchbed.Bed
	mcp *mcp.ClientSession
}

// newBed assembles the App in dataDir with the embedded interpreter
// extracted under install, issues an exec token for the local tenant,
// listens on 127.0.0.1:0 and connects one MCP client session.
func newBed(ctx context.Context, dataDir, install string, limits app.Limits) (*bed, error) {
	a, err := app.New(ctx, dataDir, &app.Options{Python: &python.EmbeddedOptions{InstallRoot: install}, Limits: limits})
	if err != nil {
		return nil, err
	}
	served, err := benchbed.Serve(ctx, a, true)
	if err != nil {
		return nil, err
	}
	b := &bed{Bed: served}
	mc := mcp.NewClient(&mcp.Implementation{Name: "quro-bench", Version: "1"}, nil)
	if b.mcp, err = mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.URL + "/mcp", HTTPClient: b.Client}, nil); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Close ends the MCP session, the server and the App.
func (b *bed) Close() {
	if b.mcp != nil {
		b.mcp.Close()
	}
	b.Bed.Close()
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
	if capability != "run_code" {
		return b.Post(ctx, capability, body, nil)
	}
	var res runcode.Result
	if err := b.Post(ctx, capability, body, &res); err != nil {
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
