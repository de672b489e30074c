// Package events is the bus of live server events a web UI watches: every
// call on a session that changes or runs something, from any access path,
// as it begins, the output it streams, and how it ended (published by the
// controller, the one place every call passes), and the take-over of a
// session's shell by a person. A subscriber sees only its tenant's events.
// Publishing never blocks: a subscriber that falls behind its bounded
// queue loses the newest events and is told how many it lost.
package events

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	Time       time.Time      `json:"time"`
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

	mu   sync.RWMutex
	subs map[string]map[*Sub]struct{} // by tenant
}

// New returns an empty bus.
func New() *Bus { return &Bus{subs: map[string]map[*Sub]struct{}{}} }

// CallID returns a new id for a call's events.
func (b *Bus) CallID() string {
	return "c" + strconv.FormatUint(b.calls.Add(1), 10)
}

// Watched reports whether tenant has a subscriber: a publisher may skip
// the work of an event nobody would see.
func (b *Bus) Watched(tenant string) bool {
	if b == nil {
		return false
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.subs[tenant]) > 0
}

// Publish hands e to every subscriber of tenant, stamped with the next
// sequence number and the time. It never blocks.
func (b *Bus) Publish(tenant string, e Event) {
	if b == nil {
		return
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	subs := b.subs[tenant]
	if len(subs) == 0 {
		return
	}
	e.Seq = b.seq.Add(1)
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	for s := range subs {
		s.add(e)
	}
}

// Subscribe returns a subscription to tenant's events that holds at most
// queue unread events (≤ 0: DefaultQueue). Close it when done.
func (b *Bus) Subscribe(tenant string, queue int) *Sub {
	if queue <= 0 {
		queue = DefaultQueue
	}
	s := &Sub{bus: b, tenant: tenant, max: queue, ready: make(chan struct{}, 1)}
	b.mu.Lock()
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
