package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
)

// The live event stream across nodes: GET /v1/events without replay on
// any node streams the caller's tenant's events of every node. The node
// called subscribes to its own bus and asks every other live node for
// the same stream (PeerEvents), with the caller's own credential, which
// each node checks and answers with that tenant's events only, and the
// signed forwarding header, under which a node streams its own events
// and asks no one else. A stream with replay names one session and goes
// to its owner (Router.ref).

// peerJoin bounds the first connection to a node, up to its hello: a
// node that has not answered by then is named unanswered, and joins the
// stream when it does.
const peerJoin = 10 * time.Second

// peerRetry is the pause before a node whose stream ended is asked
// again, and the period at which the stream looks for nodes that came up.
const peerRetry = 2 * time.Second

// maxPeerEvent bounds one event a node sends (an output event holds at
// most 16 KiB of output, a call's input 4 KiB a string).
const maxPeerEvent = 1 << 20

// PeerEvents streams the live events of the cluster's other nodes for
// the caller whose credential (an Authorization value, "" without
// authentication) is cred, until ctx ends or send reports false: each
// event as its node sent it, Node set to that node. ready is called once,
// when every live node has answered (its stream subscribed) or failed to
// within peerJoin, with the nodes that joined and those that did not;
// nodes that come up later, or whose stream ended, are asked again.
// Under a signed forwarding header (ctx marked ServeHere by the router)
// it streams nothing: another node is merging, and asked this one for its
// own events only.
func (rt *Router) PeerEvents(ctx context.Context, cred string, ready func(joined, unanswered []string), send func(events.Event) bool) {
	if controller.IsServeHere(ctx) {
		ready(nil, nil)
		return
	}
	rt.init()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		watching = map[string]bool{}
		wg       sync.WaitGroup
	)
	defer wg.Wait()
	// start asks each live node not yet watched; first reports the
	// first round's outcome through joined.
	start := func(first func(node string, ok bool)) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, node := range rt.Table.Nodes() {
			if node.Name == rt.Table.Self() || watching[node.Name] || !node.Live(time.Now()) {
				continue
			}
			watching[node.Name] = true
			n++
			wg.Add(1)
			go func() {
				defer wg.Done()
				rt.watchPeer(ctx, node.Name, cred, first, func(ev events.Event) bool {
					if !send(ev) {
						cancel()
						return false
					}
					return true
				})
				mu.Lock()
				delete(watching, node.Name)
				mu.Unlock()
			}()
		}
		return n
	}
	type outcome struct {
		node string
		ok   bool
	}
	results := make(chan outcome)
	n := start(func(node string, ok bool) {
		select {
		case results <- outcome{node, ok}:
		case <-ctx.Done():
		}
	})
	var joined, unanswered []string
	for range n {
		select {
		case o := <-results:
			if o.ok {
				joined = append(joined, o.node)
			} else {
				unanswered = append(unanswered, o.node)
			}
		case <-ctx.Done():
			return
		}
	}
	slices.Sort(joined)
	slices.Sort(unanswered)
	ready(joined, unanswered)
	tick := time.NewTicker(peerRetry)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			start(nil)
		}
	}
}

// watchPeer streams node's events to send until ctx ends, send reports
// false, the node is no longer live, or it refuses the caller. first,
// when set, is told once whether the first connection reached the
// node's hello within peerJoin.
func (rt *Router) watchPeer(ctx context.Context, node, cred string, first func(string, bool), send func(events.Event) bool) {
	told := first == nil
	tell := func(ok bool) {
		if !told {
			told = true
			first(node, ok)
		}
	}
	defer tell(false)
	for ctx.Err() == nil {
		n, ok := rt.Table.Node(node)
		if !ok || !n.Live(time.Now()) {
			return
		}
		refused := rt.peerStream(ctx, n, cred, tell, send)
		if refused || ctx.Err() != nil {
			return
		}
		tell(false)
		t := time.NewTimer(peerRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// peerStream is one connection to node n: joined is told
// true at its hello, then each event goes to send. It reports whether the
// node refused the caller (401, 403: asking again is no use).
func (rt *Router) peerStream(ctx context.Context, n Node, cred string, joined func(bool), send func(events.Event) bool) (refused bool) {
	hdr := http.Header{}
	if cred != "" {
		hdr.Set("Authorization", cred)
	}
	hdr.Set(HeaderForwardedBy, rt.forwardedBy())
	hdr.Set(HeaderForwardedPath, "ws")
	u := url.URL{Scheme: rt.TLS.scheme("ws"), Host: n.Address, Path: eventsPath}
	ctx = toNode(ctx, n.Name)
	dctx, cancel := context.WithTimeout(ctx, peerJoin)
	c, resp, err := websocket.Dial(dctx, u.String(), &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: rt.client}) //nolint:bodyclose // websocket.Dial closes it ("you never need to close resp.Body yourself")
	if err != nil {
		cancel()
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			rt.Logger.Warn("cluster: a node refused the caller's event stream", "node", n.Name, "status", resp.StatusCode)
			return true
		}
		return false
	}
	defer c.CloseNow()
	c.SetReadLimit(maxPeerEvent)
	// The node's hello says its stream is subscribed.
	_, data, err := c.Read(dctx)
	cancel()
	var hello struct{ Type string }
	if err != nil || json.Unmarshal(data, &hello) != nil || hello.Type != "hello" {
		return false
	}
	joined(true)
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return false
		}
		var ev events.Event
		if json.Unmarshal(data, &ev) != nil {
			continue
		}
		switch ev.Type {
		case events.TypeCall, events.TypeOutput, events.TypeEnd, events.TypeHold, events.TypeDropped:
		default:
			continue // the node's answers to control messages: none are sent on this connection
		}
		ev.Node = n.Name
		if !send(ev) {
			return false
		}
	}
}
