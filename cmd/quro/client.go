package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
)

// Where the CLI's commands run. quro run, exec, term, session and call go
// through a server when there is one to go through, in this order:
//
//  1. --server URL, else QURO_URL;
//  2. inside a session's box, the server's in-session socket;
//  3. the server running on the data directory (its serve marker, see
//     findServer);
//
// else they open the data directory in-process. Through a server they
// share its sessions, their state and its audit log.

// serverFlags are --server and --token-file, on every command that can go
// through a server.
func (g *globals) serverFlags(cmd *cobra.Command, persistent bool) {
	f := cmd.Flags()
	if persistent {
		f = cmd.PersistentFlags()
	}
	f.StringVar(&g.server, "server", "", "base URL of a quro server, e.g. http://127.0.0.1:7070 (env QURO_URL); default: the server running on --data, else in-process")
	f.StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token for the server (env QURO_TOKEN holds the token itself; default: the data directory's admin.token when the server is the one running on it)")
}

// token is a bearer token and where it came from (for messages; the token
// itself is never printed).
type token struct{ value, source string }

// target is the server to call, or "" for in-process.
type target struct {
	url   string
	token token
	// dataDir is the CLI's data directory and local whether the server is
	// the one running on it, for the message when a token is missing.
	dataDir string
	local   bool
}

// target picks the server the command goes through (see above) and its
// token. An explicit server gets the data directory's admin token only
// when it is the server running on that data directory: the token of one
// server is never sent to another.
func (g *globals) target() (*target, error) {
	t := &target{dataDir: g.dataDir}
	live, _ := findServer(g.dataDir)
	switch {
	case g.server != "":
		t.url = g.server
	case os.Getenv("QURO_URL") != "":
		t.url = os.Getenv("QURO_URL")
	default:
		if fi, err := os.Stat(insession.SocketInBox); err == nil && fi.Mode().Type() == os.ModeSocket {
			t.url = "unix://" + insession.SocketInBox
		} else if live != nil {
			t.url = live.url
		}
	}
	if t.url == "" {
		return t, nil
	}
	t.local = live != nil && sameServer(t.url, live.addr)
	switch {
	case g.tokenFile != "":
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		t.token = token{strings.TrimSpace(string(b)), "--token-file " + g.tokenFile}
		if t.token.value == "" {
			return nil, fmt.Errorf("--token-file %s is empty", g.tokenFile)
		}
	case strings.TrimSpace(os.Getenv("QURO_TOKEN")) != "":
		t.token = token{strings.TrimSpace(os.Getenv("QURO_TOKEN")), "QURO_TOKEN"}
	case t.local:
		file := filepath.Join(g.dataDir, AdminTokenFile)
		if b, err := os.ReadFile(file); err == nil {
			t.token = token{strings.TrimSpace(string(b)), file}
		}
	}
	return t, nil
}

// sameServer tells whether raw names the server listening on addr: same
// port, and the same address or a loopback name for a loopback one.
func sameServer(raw string, addr netip.AddrPort) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" {
		return false
	}
	host, port := u.Hostname(), u.Port()
	if port == "" || port != fmt.Sprint(addr.Port()) {
		return false
	}
	if host == "localhost" {
		return addr.Addr().IsLoopback()
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return ip.Unmap() == addr.Addr().Unmap() || (ip.IsLoopback() && addr.Addr().IsLoopback())
}

// backend runs capabilities for a command: through the server of target,
// or on an App opened in this process.
type backend struct {
	g      *globals
	remote *httpCaller // nil: in-process
	app    *app.App
}

// backend returns the command's backend; close it when done. Options that
// configure an in-process App have no effect on a server: a warning says so.
func (g *globals) backend(cmd *cobra.Command) (*backend, error) {
	t, err := g.target()
	if err != nil {
		return nil, err
	}
	b := &backend{g: g}
	if t.url == "" {
		a, err := g.open(cmd.Context())
		if err != nil {
			return nil, err
		}
		b.app = a
		return b, nil
	}
	b.remote = newTargetCaller(t)
	for _, name := range []string{"max-stdout", "max-stderr", "isolation"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			fmt.Fprintf(cmd.ErrOrStderr(), "quro: --%s applies in-process only; the server at %s uses its own settings\n", name, b.remote.name)
		}
	}
	return b, nil
}

// operatorBackend is the backend of an operator's command (quro token,
// quro tenant): the App on the data directory, in this process — whoever
// holds the data directory is the operator, even when no token of the
// server is at hand — unless --server or QURO_URL names a server, which
// then acts for the token it is given.
func (g *globals) operatorBackend(cmd *cobra.Command) (*backend, error) {
	if g.server == "" && os.Getenv("QURO_URL") == "" {
		return g.localBackend(cmd)
	}
	return g.backend(cmd)
}

// localBackend is the App on the data directory, in this process, called
// as the local admin (quro rootfs: the host's rootfs directory).
func (g *globals) localBackend(cmd *cobra.Command) (*backend, error) {
	a, err := g.open(cmd.Context())
	if err != nil {
		return nil, err
	}
	return &backend{g: g, app: a}, nil
}

func (b *backend) close() {
	if b.app != nil {
		b.app.Close()
	}
}

// output calls the capability name with in and decodes its structured
// output into out. In-process errors are returned as the controller gives
// them; a server's as the *capability.Error it sent.
func (b *backend) output(ctx context.Context, name string, in, out any) error {
	args, err := json.Marshal(in)
	if err != nil {
		return err
	}
	var raw []byte
	if b.remote != nil {
		raw, err = b.remote.do(ctx, http.MethodPost, "/v1/"+name, args, "application/json")
	} else {
		var reply *controllerReply
		reply, err = b.localCall(ctx, name, args)
		if err == nil {
			raw, err = json.Marshal(reply.Output)
		}
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// text calls the capability and returns the text a model reads.
func (b *backend) text(ctx context.Context, name string, in any) (string, error) {
	args, err := json.Marshal(in)
	if err != nil {
		return "", err
	}
	if b.remote != nil {
		raw, err := b.remote.do(ctx, http.MethodPost, "/v1/"+name, args, "text/plain")
		return strings.TrimRight(string(raw), "\n"), err
	}
	reply, err := b.localCall(ctx, name, args)
	if err != nil {
		return "", err
	}
	return reply.Text, nil
}

// controllerReply is what localCall returns.
type controllerReply struct {
	Output any
	Text   string
}

func (b *backend) localCall(ctx context.Context, name string, args json.RawMessage) (*controllerReply, error) {
	reply, err := b.app.Controller.Call(ctx, b.g.caller(), name, args)
	if err != nil {
		return nil, err
	}
	return &controllerReply{Output: reply.Output, Text: reply.Text}, nil
}

// unixTransport dials the unix socket path whatever the URL's host.
func unixTransport(path string) *http.Transport {
	return &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}
}

// authMessage rewrites a server's refusal of the token (401) into what to
// do about it from the command line.
func (c *httpCaller) authMessage(e *capability.Error) *capability.Error {
	where := fmt.Sprintf("the server keeps its admin token in admin.token in its data directory (%s when it runs with --data %s; quro token create --data DIR makes more)",
		filepath.Join(c.t.dataDir, AdminTokenFile), c.t.dataDir)
	if c.t.token.value == "" {
		return &capability.Error{Code: e.Code, Message: fmt.Sprintf(
			"the server %s wants a token and none was found: pass --token-file FILE (a file holding the token) or set QURO_TOKEN=<token>; %s", c.name, where)}
	}
	return &capability.Error{Code: e.Code, Message: fmt.Sprintf(
		"%s (the token came from %s): pass the right one with --token-file FILE or QURO_TOKEN=<token>; %s", e.Message, c.t.token.source, where)}
}
