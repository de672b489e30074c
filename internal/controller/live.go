package controller

import (
	"context"
	"encoding/json"
	"sync"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// Bounds of what one event carries: a viewer reads the rest in the
// call's result (output_file keeps a cut output whole).
const (
	liveInputMax = 4 << 10 // each string of the input
	// liveInputTotal bounds the strings of one event's input together: a
	// subscriber's queue (events.DefaultQueue) holds a thousand events,
	// and lists of 64 strings under three keys each cut alone would make
	// one event near 1 MiB, a slow viewer's queue near 1 GiB.
	liveInputTotal = 16 << 10
	liveOutputMax  = 16 << 10 // one output event's data
	liveTextMax    = 4 << 10  // the end event's text
)

// liveInputKeys are the inputs an event shows: what a person watching
// needs to follow the call (the command, the code, the path, the
// packages). Content written to files, secrets' values, variables and
// the bytes typed into a command are left out.
var liveInputKeys = []string{"command", "code", "language", "path", "from", "to", "packages", "cmd", "args", "name", "port", "network"}

// liveCall is a call whose events go to the bus (Options.Events): one
// call event when it began, its output as it came, one end event.
type liveCall struct {
	bus    *events.Bus
	tenant string
	base   events.Event // Call, Session, Capability, Path, Person

	mu      sync.Mutex
	pending map[string][]byte // an incomplete UTF-8 sequence held back, by stream
	unseen  int               // output bytes published while nobody watched
}

// liveBegin publishes the call event of a call on the session ctx has
// entered, when the call may change or run something (not ReadOnly), and
// returns ctx with the call's output reported to the bus besides the
// caller's own observer. nil: no events. The events are published with
// no viewer too: the session's ring keeps the recent ones for a viewer
// that comes later (events.Bus.SubscribeReplay).
func (c *Controller) liveBegin(ctx context.Context, caller Caller, capb *capability.Capability, args json.RawMessage) (context.Context, *liveCall) {
	if c.events == nil || capb.Hints.ReadOnly {
		return ctx, nil
	}
	s := session.Entered(ctx)
	if s == nil {
		return ctx, nil
	}
	lc := &liveCall{bus: c.events, tenant: caller.Tenant, base: events.Event{
		Call: c.events.CallID(), Session: s.ID, Capability: capb.Name, Path: caller.Path,
		Person: terminal.HolderFrom(ctx) != "",
	}}
	e := lc.base
	e.Type = events.TypeCall
	e.Input = liveInput(args, c.events.Redact)
	lc.bus.Publish(lc.tenant, e)
	if capb.Streams {
		prev := runcode.OutputFrom(ctx)
		ctx = runcode.WithOutput(ctx, func(stream string, p []byte) {
			if prev != nil {
				prev(stream, p)
			}
			lc.output(stream, p)
		})
	}
	return ctx, lc
}

// output publishes p, holding back a UTF-8 sequence split between writes
// until it is complete.
//
// With nobody watching, output goes only to the session's ring, which
// keeps ReplayBytes of events: past that much of a call's output the rest
// is dropped here, before any copy, so a call that writes hundreds of MiB
// with no viewer costs the server no copy of them (a viewer that comes
// later sees the call's first output and, from then on, all of it).
func (lc *liveCall) output(stream string, p []byte) {
	lc.mu.Lock()
	if !lc.bus.Watched(lc.tenant) {
		if lc.unseen >= events.ReplayBytes {
			lc.mu.Unlock()
			return
		}
		lc.unseen += len(p)
	}
	buf := append(lc.pending[stream], p...)
	cut := len(buf)
	for i := 1; i <= utf8.UTFMax && i <= len(buf); i++ {
		b := buf[len(buf)-i]
		if b < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(b) {
			if !utf8.FullRune(buf[len(buf)-i:]) {
				cut = len(buf) - i
			}
			break
		}
	}
	if lc.pending == nil {
		lc.pending = map[string][]byte{}
	}
	lc.pending[stream] = append([]byte(nil), buf[cut:]...)
	lc.mu.Unlock()
	for data := buf[:cut]; len(data) > 0; {
		n := min(len(data), liveOutputMax)
		e := lc.base
		e.Type, e.Stream, e.Data = events.TypeOutput, stream, string(data[:n])
		lc.bus.Publish(lc.tenant, e)
		data = data[n:]
	}
}

// end publishes how the call ended.
func (lc *liveCall) end(rec *Record, reply *Reply) {
	lc.mu.Lock()
	for stream, rest := range lc.pending {
		if len(rest) > 0 {
			e := lc.base
			e.Type, e.Stream, e.Data = events.TypeOutput, stream, string(rest)
			lc.bus.Publish(lc.tenant, e)
		}
	}
	lc.pending = nil
	lc.mu.Unlock()
	e := lc.base
	e.Type, e.Outcome = events.TypeEnd, rec.Outcome
	switch {
	case rec.Err != nil:
		e.Text = rec.Err.Message
	case reply != nil:
		e.Text = reply.Text
	}
	switch r := rec.Output.(type) {
	case *terminal.Result:
		if !r.Running {
			code := r.ExitCode
			e.ExitCode = &code
		}
	case *runcode.Result:
		code := r.ExitCode
		e.ExitCode = &code
		for _, a := range r.Artifacts {
			e.Artifacts = append(e.Artifacts, a.Name)
		}
	}
	e.Text = cutString(e.Text, liveTextMax)
	lc.bus.Publish(lc.tenant, e)
}

// liveInput is the part of a call's input an event shows.
func liveInput(args json.RawMessage, redact func(string) string) map[string]any {
	var all map[string]json.RawMessage
	if json.Unmarshal(args, &all) != nil {
		return nil
	}
	var out map[string]any
	budget := liveInputTotal
	for _, k := range liveInputKeys {
		raw, ok := all[k]
		if !ok {
			continue
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			continue
		}
		if out == nil {
			out = map[string]any{}
		}
		out[k] = cutValue(v, redact, &budget)
	}
	return out
}

// cutValue cuts v's strings to liveInputMax each and to what is left of
// budget together; a list past the budget ends with "… (cut)".
func cutValue(v any, redact func(string) string, budget *int) any {
	switch x := v.(type) {
	case string:
		if redact != nil {
			x = redact(x)
		}
		x = cutString(x, min(liveInputMax, max(*budget, 0)))
		*budget -= len(x)
		return x
	case []any:
		if len(x) > 64 {
			x = x[:64]
		}
		for i := range x {
			if *budget <= 0 {
				return append(x[:i], "… (cut)")
			}
			x[i] = cutValue(x[i], redact, budget)
		}
		return x
	case map[string]any:
		return nil // no nested objects (variables, secrets)
	}
	return v
}

// cutString cuts s to at most max bytes at a rune boundary, saying so.
func cutString(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "… (cut)"
}
