// Package events is the bus of live server events a web UI watches: every
// call on a session that changes or runs something, from any access path,
// as it begins, the output it streams, and how it ended (published by the
// controller, the one place every call passes), and the take-over of a
// session's shell by a person. A subscriber sees only its tenant's events.
// Publishing never blocks: a subscriber that falls behind its bounded
// queue loses the newest events and is told how many it lost.
//
// The bus also keeps each session's recent events (a bounded ring, see
// ReplayEvents and ReplayBytes) so that a viewer that subscribes late
// is sent first what the session's calls already did, marked Replay.
// A session's ring is released by Forget, at the session's end.
package events

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/internal/recent"
)

// Event types.
const (
	TypeCall    = "call"    // a call began: capability, access path, input
	TypeOutput  = "output"  // output the call's run printed, as it came
	TypeEnd     = "end"     // the call ended: outcome, exit code, text
	TypeHold    = "hold"    // a person took the session's shell, or handed it back
	TypeDropped = "dropped" // this subscriber lost Dropped events
)

// Event is one server event. It names the workspace /home/user and never
// a host path: its input is what the caller sent, its output and text
// what the caller reads.
type Event struct {
	Seq        uint64         `json:"seq"`
	Type       string         `json:"type"`
	Call       string         `json:"call,omitempty"` // the call's id, shared by its call, output and end events
	Session    string         `json:"session,omitempty"`
	Capability string         `json:"capability,omitempty"`
	Path       string         `json:"path,omitempty"`   // the access path: rest, mcp, ws, cli, e2b, in-session
	Person     bool           `json:"person,omitempty"` // the call came from a person holding the session's shell
	Input      map[string]any `json:"input,omitempty"`
	Stream     string         `json:"stream,omitempty"`
	Data       string         `json:"data,omitempty"`
	Outcome    string         `json:"outcome,omitempty"`
	ExitCode   *int           `json:"exit_code,omitempty"`
	Text       string         `json:"text,omitempty"`
	Artifacts  []string       `json:"artifacts,omitempty"`
	Held       *bool          `json:"held,omitempty"`
	Dropped    int            `json:"dropped,omitempty"`
	Replay     bool           `json:"replay,omitempty"` // sent from the session's ring to a viewer that subscribed after it
	// Node is the cluster node whose session the event is of, on a
	// stream that merges the nodes' (GET /v1/events without replay in
	// cluster mode); "" elsewhere.
	Node string    `json:"node,omitempty"`
	Time time.Time `json:"time"`
}

// The bounds of one session's ring of recent events: the last
// ReplayEvents events, and fewer when they hold more than ReplayBytes of
// strings (an output event holds at most 16 KiB, a call's input 4 KiB a
// string: see the controller).
const (
	ReplayEvents = 200
	ReplayBytes  = 256 << 10
)

// ring is one session's recent events, oldest first.
type ring struct {
	tenant string
	evs    []Event
	bytes  int
}

// size is what e holds, roughly: its strings and a fixed overhead.
func size(e *Event) int {
	n := 128 + len(e.Call) + len(e.Session) + len(e.Capability) + len(e.Path) + len(e.Stream) + len(e.Data) + len(e.Outcome) + len(e.Text)
	for _, a := range e.Artifacts {
		n += len(a)
	}
	for k, v := range e.Input {
		n += len(k) + valueSize(v)
	}
	return n
}

func valueSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case []any:
		n := 0
		for _, y := range x {
			n += 16 + valueSize(y)
		}
		return n
	}
	return 16
}

func (r *ring) add(e Event) {
	r.evs = append(r.evs, e)
	r.bytes += size(&e)
	drop := 0
	for len(r.evs)-drop > ReplayEvents || r.bytes > ReplayBytes && len(r.evs)-drop > 1 {
		r.bytes -= size(&r.evs[drop])
		drop++
	}
	if drop > 0 {
		// Copy, so the dropped events' strings are not kept alive by the
		// backing array.
		r.evs = append([]Event(nil), r.evs[drop:]...)
	}
}

// DefaultQueue is how many events a subscriber may lag before it drops.
const DefaultQueue = 1024

// Bus fans events out to the subscribers of their tenant. The zero value
// is not usable; a nil *Bus publishes nothing. Safe for concurrent use.
type Bus struct {
	// Redact, when set, is applied by publishers to the strings of a
	// call's input (audit.RedactTokens: a token pasted into a command
	// keeps its id, never its secret). Set it before the first Publish.
	Redact func(string) string

	seq   atomic.Uint64
	calls atomic.Uint64

	// mu: Publish holds it for reading, Subscribe for writing, so a
	// subscriber's replay and its first live event neither overlap nor
	// leave a gap.
	mu   sync.RWMutex
	subs map[string]map[*Sub]struct{} // by tenant

	ringMu sync.Mutex // the rings, forgotten, and the order of sequence numbers and of delivery
	rings  map[string]*ring
	// forgotten are the sessions Forget released: a call that entered
	// one just before its destroy publishes after it, and must not make
	// its ring again (nothing would release it).
	forgotten recent.Set
}

// New returns an empty bus.
func New() *Bus { return &Bus{subs: map[string]map[*Sub]struct{}{}, rings: map[string]*ring{}} }

// CallID returns a new id for a call's events.
func (b *Bus) CallID() string {
	return "c" + strconv.FormatUint(b.calls.Add(1), 10)
}

// Watched reports whether tenant has a subscriber. (A call's events are
// published whether or not: the session's ring keeps them for a viewer
// that comes later.)
func (b *Bus) Watched(tenant string) bool {
	if b == nil {
		return false
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.subs[tenant]) > 0
}

// Publish hands e to every subscriber of tenant, stamped with the next
// sequence number and the time, and keeps it in its session's ring: a
// call event of a session makes the ring, the session's later events go
// into it. It never blocks.
func (b *Bus) Publish(tenant string, e Event) {
	if b == nil {
		return
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	subs := b.subs[tenant]
	b.ringMu.Lock()
	e.Seq = b.seq.Add(1)
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	if e.Session != "" {
		r := b.rings[e.Session]
		if r == nil && e.Type == TypeCall && !b.forgotten.Has(e.Session) {
			r = &ring{tenant: tenant}
			b.rings[e.Session] = r
		}
		if r != nil && r.tenant == tenant {
			r.add(e)
		}
	}
	// Handed out in the same hold, so each subscriber gets its events in
	// the order of their numbers (a viewer skips what it has seen by them).
	for s := range subs {
		s.add(e)
	}
	b.ringMu.Unlock()
}

// Forget releases session's ring (at the session's end); a call event
// of the session published later makes none.
func (b *Bus) Forget(session string) {
	if b == nil {
		return
	}
	b.ringMu.Lock()
	delete(b.rings, session)
	b.forgotten.Add(session)
	b.ringMu.Unlock()
}

// Rings is how many sessions' rings the bus keeps.
func (b *Bus) Rings() int {
	b.ringMu.Lock()
	defer b.ringMu.Unlock()
	return len(b.rings)
}

// Subscribe returns a subscription to tenant's events that holds at most
// queue unread events (≤ 0: DefaultQueue). Close it when done.
func (b *Bus) Subscribe(tenant string, queue int) *Sub {
	return b.SubscribeReplay(tenant, queue, "")
}

// SubscribeReplay is Subscribe whose first events are the recent events
// of session (its ring, oldest first, each marked Replay) when it is one
// of tenant's (another tenant's session, or one with no calls, replays
// nothing). The live events follow with no gap and none twice.
func (b *Bus) SubscribeReplay(tenant string, queue int, session string) *Sub {
	if queue <= 0 {
		queue = DefaultQueue
	}
	s := &Sub{bus: b, tenant: tenant, max: queue, ready: make(chan struct{}, 1)}
	b.mu.Lock()
	if session != "" {
		b.ringMu.Lock()
		if r := b.rings[session]; r != nil && r.tenant == tenant {
			s.q = make([]Event, len(r.evs))
			for i, e := range r.evs {
				e.Replay = true
				s.q[i] = e
			}
		}
		b.ringMu.Unlock()
		if len(s.q) > 0 {
			s.ready <- struct{}{}
		}
	}
	m := b.subs[tenant]
	if m == nil {
		m = map[*Sub]struct{}{}
		b.subs[tenant] = m
	}
	m[s] = struct{}{}
	b.mu.Unlock()
	return s
}

// Sub is one subscriber's queue of events.
type Sub struct {
	bus    *Bus
	tenant string
	max    int
	ready  chan struct{}

	mu      sync.Mutex
	q       []Event
	dropped int
	closed  bool
}

func (s *Sub) add(e Event) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if len(s.q) >= s.max {
		s.dropped++
	} else {
		s.q = append(s.q, e)
	}
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Next waits for events and returns all that are queued, oldest first;
// when some were dropped since the last Next, the batch ends with a
// TypeDropped event that counts them (events after the batch were lost).
// It fails only when ctx ends or the subscription is closed.
func (s *Sub) Next(ctx context.Context) ([]Event, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, context.Canceled
		}
		if len(s.q) > 0 || s.dropped > 0 {
			out := s.q
			s.q = nil
			if s.dropped > 0 {
				out = append(out, Event{Type: TypeDropped, Dropped: s.dropped, Time: time.Now().UTC()})
				s.dropped = 0
			}
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close ends the subscription.
func (s *Sub) Close() {
	s.bus.mu.Lock()
	if m := s.bus.subs[s.tenant]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(s.bus.subs, s.tenant)
		}
	}
	s.bus.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.q = nil
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}
