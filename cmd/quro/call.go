package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// Exit statuses of quro call.
const (
	callFailed = 1 // the capability returned an error
	callUsage  = 2 // the command line or the arguments were wrong
)

func newCallCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "call CAPABILITY ['{json}' | -]",
		Short: "Call any capability with JSON arguments, in-process or on a server",
		Long: `Call one capability with its arguments as a JSON object: the second
argument, or standard input when it is -, or {} when omitted. It prints the
text a model reads, or with --json the structured output.

It goes through a server when there is one: --server URL (or QURO_URL),
else the server running on the data directory (quro serve --data DIR), and
POSTs to URL/v1/CAPABILITY with a bearer token: --token-file FILE, else
QURO_TOKEN, else — for the server running on the data directory — its
admin.token. Without a server it runs in-process, as the local user with
every scope.

Exit status: 0 when the call succeeded (a program's own exit code is part of
the output), 1 when the capability returned an error (its code and message
on stderr), 2 on a usage error.`,
		Example: `  quro call list_capabilities
  quro call run_code '{"code":"print(6*7)"}'
  echo '{"command":"ls"}' | quro call terminal_exec -
  quro call --json get_service_status
  QURO_URL=http://127.0.0.1:7070 quro call help`,
		Args: cobra.ArbitraryArgs, // checked below, to exit with the usage status
		RunE: func(cmd *cobra.Command, args []string) error {
			stderr := cmd.ErrOrStderr()
			if len(args) == 0 || len(args) > 2 {
				fmt.Fprintf(stderr, "quro call: want CAPABILITY and at most one JSON argument, got %d arguments\n", len(args))
				fmt.Fprint(stderr, cmd.UsageString())
				return &exitError{callUsage}
			}
			name := args[0]
			in, err := callArgs(args[1:], g.stdin)
			if err != nil {
				fmt.Fprintln(stderr, "quro call:", err)
				return &exitError{callUsage}
			}
			c, err := newCaller(g)
			if err != nil {
				fmt.Fprintln(stderr, "quro call:", err)
				return &exitError{callUsage}
			}
			defer c.close()
			out, err := c.call(cmd.Context(), name, in, asJSON)
			var ce *capability.Error
			switch {
			case errors.As(err, &ce):
				fmt.Fprintf(stderr, "quro call: %s: %s\n", ce.Code, ce.Message)
				return &exitError{callFailed}
			case err != nil:
				fmt.Fprintln(stderr, "quro call:", err)
				return &exitError{callFailed}
			}
			if !strings.HasSuffix(out, "\n") {
				out += "\n"
			}
			// An answer that did not reach stdout (a full disk, a closed
			// pipe) is a failed command, not a silent success.
			_, err = io.WriteString(cmd.OutOrStdout(), out)
			return err
		},
	}
	f := cmd.Flags()
	g.serverFlags(cmd, false)
	f.BoolVar(&asJSON, "json", false, "print the structured output as JSON instead of the model-facing text")
	defaultHelp := cmd.HelpFunc()
	cmd.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		defaultHelp(cmd, args)
		listCapabilities(cmd, g)
	})
	// Whichever capability it is given (bypass_test.go runs it).
	return annotate(cmd, "*")
}

// callArgs returns the JSON arguments: the argument, stdin for "-", or {}.
func callArgs(args []string, stdin io.Reader) (json.RawMessage, error) {
	src := "{}"
	from := "the arguments"
	if len(args) == 1 {
		src = args[0]
		if src == "-" {
			b, err := io.ReadAll(stdin)
			if err != nil {
				return nil, fmt.Errorf("reading the arguments from stdin: %w", err)
			}
			src, from = string(b), "the arguments on stdin"
			if strings.TrimSpace(src) == "" {
				src = "{}"
			}
		}
	}
	var v any
	if err := json.Unmarshal([]byte(src), &v); err != nil {
		return nil, fmt.Errorf("%s are not valid JSON (%v); pass an object such as '{\"code\":\"print(1)\"}'", from, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("%s must be a JSON object, not %s", from, strings.TrimSpace(src))
	}
	return json.RawMessage(src), nil
}

// caller calls a capability and returns what to print.
type caller interface {
	call(ctx context.Context, name string, args json.RawMessage, asJSON bool) (string, error)
	close()
}

// newCaller picks the server (see target) or the in-process App.
func newCaller(g *globals) (caller, error) {
	t, err := g.target()
	if err != nil {
		return nil, err
	}
	if t.url == "" {
		return &localCaller{g: g}, nil
	}
	return newTargetCaller(t), nil
}

// newHTTPCaller calls server (an http(s) URL, or unix:///path/to.sock)
// with token.
func newHTTPCaller(server, tok string) *httpCaller {
	return newTargetCaller(&target{url: server, token: token{tok, "the caller"}})
}

// newTargetCaller calls the server of t.
func newTargetCaller(t *target) *httpCaller {
	if path, ok := strings.CutPrefix(t.url, "unix://"); ok {
		return &httpCaller{base: "http://localhost", t: t, client: &http.Client{Transport: unixTransport(path)}, name: t.url}
	}
	base := strings.TrimRight(t.url, "/")
	return &httpCaller{base: base, t: t, client: http.DefaultClient, name: base}
}

// localCaller calls the controller of an App opened in this process.
type localCaller struct {
	g  *globals
	cl func() error
}

func (c *localCaller) call(ctx context.Context, name string, args json.RawMessage, asJSON bool) (string, error) {
	a, err := c.g.open(ctx)
	if err != nil {
		return "", err
	}
	c.cl = a.Close
	reply, err := a.Controller.Call(ctx, c.g.caller(), name, args)
	if err != nil {
		return "", controller.Classify(err)
	}
	if !asJSON {
		return reply.Text, nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(reply.Output); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (c *localCaller) close() {
	if c.cl != nil {
		_ = c.cl() // like every deferred Close: the call has its answer
	}
}

// httpCaller POSTs to a quro server's REST API.
type httpCaller struct {
	base   string
	t      *target
	name   string // the server as given, for messages
	client *http.Client
}

func (c *httpCaller) close() {}

func (c *httpCaller) call(ctx context.Context, name string, args json.RawMessage, asJSON bool) (string, error) {
	accept := "text/plain"
	if asJSON {
		accept = "application/json"
	}
	body, err := c.do(ctx, http.MethodPost, "/v1/"+name, args, accept)
	if err != nil {
		return "", err
	}
	if asJSON {
		var b bytes.Buffer
		if json.Indent(&b, body, "", "  ") == nil {
			return b.String(), nil
		}
	}
	return string(body), nil
}

// do sends one request and returns the body of a 2xx answer; any other
// answer becomes the *capability.Error the server sent.
func (c *httpCaller) do(ctx context.Context, method, path string, body []byte, accept string) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("--server %s: %v", c.name, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	if c.t.token.value != "" {
		req.Header.Set("Authorization", "Bearer "+c.t.token.value)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		// The URL error names the method and URL, never the headers.
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s%s: %w", c.name, path, err)
	}
	if resp.StatusCode/100 == 2 {
		return b, nil
	}
	var e struct {
		Error *capability.Error `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error != nil && e.Error.Code != "" {
		if resp.StatusCode == http.StatusUnauthorized {
			return nil, c.authMessage(e.Error)
		}
		return nil, e.Error
	}
	return nil, fmt.Errorf("%s %s%s: %s: %s", method, c.name, path, resp.Status, strings.TrimSpace(string(b)))
}

// listCapabilities ends the help of quro call with the capabilities: the
// server's when one is named, else the in-process registry's.
func listCapabilities(cmd *cobra.Command, g *globals) {
	w := cmd.OutOrStdout()
	type entry struct{ Name, Scope, Description string }
	var list []entry
	if t, err := g.target(); err != nil || t.url != "" {
		if err != nil {
			return
		}
		c := newTargetCaller(t)
		b, err := c.do(cmd.Context(), http.MethodGet, "/v1/capabilities", nil, "application/json")
		var out struct{ Capabilities []entry }
		if err != nil || json.Unmarshal(b, &out) != nil {
			fmt.Fprintf(w, "\n(cannot list the capabilities of %s: %v)\n", c.name, err)
			return
		}
		list = out.Capabilities
	} else {
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		a, err := g.open(ctx)
		if err != nil {
			fmt.Fprintf(w, "\n(cannot list the capabilities: %v)\n", err)
			return
		}
		defer a.Close()
		for _, c := range a.Controller.Registry().List() {
			list = append(list, entry{c.Name, string(c.Scope), c.Description})
		}
	}
	fmt.Fprintln(w, "\nCapabilities (scope; quro call --json list_capabilities gives their schemas):")
	width := 0
	for _, c := range list {
		width = max(width, len(c.Name))
	}
	for _, c := range list {
		fmt.Fprintf(w, "  %-*s  %-5s  %s\n", width, c.Name, c.Scope, firstSentence(c.Description))
	}
}

// firstSentence cuts a description after its first sentence, and that
// to about a line.
func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	if r := []rune(s); len(r) > 90 {
		s = strings.TrimRight(string(r[:89]), " ,;:") + "…"
	}
	return s
}
