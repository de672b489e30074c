package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/quro-dev/quro/internal/capability"
)

// bridgeMCP relays MCP between stdio (r, w) and endpoint (/mcp and its
// query) of the server of t, so that quro mcp on a data directory a server
// runs on uses that server's sessions, state and audit, as the other
// commands do. Each message goes through as it came, both ways (the go-sdk
// transports frame them: newline-delimited JSON on stdio, streamable HTTP
// to the server); calls go out concurrently, so that a slow tool call holds
// up no other. It returns when the client closes stdio (once the calls in
// flight are answered) or the server goes away.
func bridgeMCP(ctx context.Context, t *target, endpoint string, r io.Reader, w io.Writer) error {
	c := newTargetCaller(t)
	rt := &bridgeTransport{next: c.client.Transport, token: t.token.value}
	if rt.next == nil {
		rt.next = http.DefaultTransport
	}
	// No redirects: the transport adds the token to every request, and a
	// redirect may lead to another host.
	hc := &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	remote, err := (&mcp.StreamableClientTransport{Endpoint: c.base + endpoint, HTTPClient: hc}).Connect(ctx)
	if err != nil {
		return fmt.Errorf("connecting to the MCP endpoint of %s: %w", c.name, err)
	}
	defer remote.Close() // ends the MCP session on the server; its quro sessions stay
	local, err := (&mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}}).Connect(ctx)
	if err != nil {
		return err
	}
	defer local.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	calls := &inFlight{ids: map[jsonrpc.ID]bool{}}
	// answering is held (shared) by each answer from taking its call off
	// calls until its error is written, and taken whole before returning:
	// a call a failed write had just taken off was in no one's list, and
	// the process could exit before its answer was out (the client read
	// EOF instead of the way to pass a token).
	var answering sync.RWMutex
	// answer sends the client the error of a call still in flight.
	answer := func(id jsonrpc.ID, msg string) {
		answering.RLock()
		defer answering.RUnlock()
		if calls.end(id) {
			_ = local.Write(ctx, &jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: -32603, Message: msg}})
		}
	}
	defer answering.Lock() // deferred last, so run first: ctx and local still open
	remoteErr := make(chan error, 1)
	go func() { // server → client
		for {
			msg, err := remote.Read(ctx)
			if err != nil {
				remoteErr <- err
				return
			}
			res, isResponse := msg.(*jsonrpc.Response)
			if isResponse {
				rt.noteVersion(res)
			}
			if err := local.Write(ctx, msg); err != nil {
				remoteErr <- err
				return
			}
			if isResponse {
				calls.end(res.ID) // once written: the client may be waiting for the last one to leave
			}
		}
	}()
	clientErr := make(chan error, 1)
	go func() { // client → server
		for {
			msg, err := local.Read(ctx)
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil // the client is done
				}
				clientErr <- err
				return
			}
			req, ok := msg.(*jsonrpc.Request)
			if !ok || !req.IsCall() {
				// Notifications and answers to the server's requests keep
				// their order; one that cannot be sent has nobody to tell.
				_ = remote.Write(ctx, msg)
				continue
			}
			calls.begin(req.ID)
			go func() {
				if err := remote.Write(ctx, req); err != nil {
					answer(req.ID, rt.explain(c, err))
				}
			}()
		}
	}()
	select {
	case err = <-clientErr:
		// The client closed its end: answer the calls it is still owed,
		// unless the server goes away first.
		select {
		case <-calls.drained():
			return err
		case rerr := <-remoteErr:
			err = errors.Join(err, rerr)
		}
	case err = <-remoteErr:
	}
	err = fmt.Errorf("the MCP connection to %s: %w", c.name, err)
	for _, id := range calls.all() {
		answer(id, rt.explain(c, err))
	}
	return err
}

// inFlight is the calls relayed to the server and not answered yet.
type inFlight struct {
	mu   sync.Mutex
	ids  map[jsonrpc.ID]bool
	done chan struct{} // closed once ids is empty, when someone waits
}

func (f *inFlight) begin(id jsonrpc.ID) {
	f.mu.Lock()
	f.ids[id] = true
	f.mu.Unlock()
}

// end removes id and tells whether it was in flight.
func (f *inFlight) end(id jsonrpc.ID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.ids[id]
	delete(f.ids, id)
	if len(f.ids) == 0 && f.done != nil {
		close(f.done)
		f.done = nil
	}
	return was
}

// drained is closed when no call is in flight.
func (f *inFlight) drained() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	if len(f.ids) == 0 {
		close(ch)
	} else {
		f.done = ch
	}
	return ch
}

func (f *inFlight) all() []jsonrpc.ID {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []jsonrpc.ID
	for id := range f.ids {
		ids = append(ids, id)
	}
	return ids
}

// bridgeTransport adds the caller's token to each request to the server,
// and the protocol version the session agreed on (the go-sdk client sets
// it from its own handshake, which a relay does not go through).
type bridgeTransport struct {
	next  http.RoundTripper
	token string

	mu           sync.Mutex
	version      string
	unauthorized bool
}

func (b *bridgeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	b.mu.Lock()
	if v := b.version; v != "" && req.Header.Get("Mcp-Protocol-Version") == "" {
		req.Header.Set("Mcp-Protocol-Version", v)
	}
	b.mu.Unlock()
	resp, err := b.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		b.mu.Lock()
		b.unauthorized = true
		b.mu.Unlock()
	}
	return resp, err
}

// noteVersion keeps the protocol version of an initialize result.
func (b *bridgeTransport) noteVersion(res *jsonrpc.Response) {
	var init struct {
		ProtocolVersion string          `json:"protocolVersion"`
		ServerInfo      json.RawMessage `json:"serverInfo"`
	}
	if res.Error != nil || json.Unmarshal(res.Result, &init) != nil || init.ProtocolVersion == "" || init.ServerInfo == nil {
		return
	}
	b.mu.Lock()
	b.version = init.ProtocolVersion
	b.mu.Unlock()
}

// explain is the message of a call the server did not take.
func (b *bridgeTransport) explain(c *httpCaller, err error) string {
	b.mu.Lock()
	unauthorized := b.unauthorized
	b.mu.Unlock()
	if unauthorized {
		return c.authMessage(&capability.Error{Code: "unauthorized", Message: "the server refused the token"}).Message
	}
	return fmt.Sprintf("quro mcp relays to the server %s, which did not take the call: %v", c.name, err)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
