package controller

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
)

// Transfer gathers the calls of one streamed transfer (the REST routes
// that move a file in chunks: a download is a stat_file and read_file
// calls, an upload write_file appends and a move_file), so that the
// observers (the audit log, the metrics) are told of the transfer once,
// with its size, instead of once per chunk. Each call still runs through
// the controller as its caller, checked and entered as any call.
type Transfer struct {
	start time.Time

	mu      sync.Mutex
	calls   int
	session string
	err     *capability.Error // the first call's error, if any
}

type transferKey struct{}

// WithTransfer returns ctx whose calls are gathered into the returned
// Transfer; EndTransfer reports it.
func WithTransfer(ctx context.Context) (context.Context, *Transfer) {
	t := &Transfer{start: time.Now()}
	return context.WithValue(ctx, transferKey{}, t), t
}

func transferFrom(ctx context.Context) *Transfer {
	t, _ := ctx.Value(transferKey{}).(*Transfer)
	return t
}

func (t *Transfer) add(r *Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls++
	if t.session == "" {
		t.session = r.Session
	}
	if t.err == nil && r.Err != nil {
		t.err = r.Err
	}
}

// EndTransfer tells the observers of transfer t as one call of
// capability name (the one the route stands for: read_file for a
// download, write_file for an upload) by caller, whose arguments are in
// with the bytes moved and the calls made; err is how the transfer
// failed (nil: it did not), else the first failed call's error counts.
func (c *Controller) EndTransfer(ctx context.Context, t *Transfer, caller Caller, name string, in map[string]any, bytes int64, err error) {
	t.mu.Lock()
	rec := &Record{Start: t.start, Caller: caller, Capability: name, Outcome: "ok", Duration: time.Since(t.start), Session: t.session}
	calls, first := t.calls, t.err
	t.mu.Unlock()
	args := map[string]any{}
	for k, v := range in {
		args[k] = v
	}
	args["bytes"], args["calls"] = bytes, calls
	rec.Args, _ = json.Marshal(args) // plain values: no error
	var ce *capability.Error
	switch {
	case err != nil && errors.As(err, &ce):
		rec.Err = ce
	case err != nil:
		rec.Err = capability.Errorf(capability.Canceled, "the transfer was cut: %v", err)
	default:
		rec.Err = first
	}
	if rec.Err != nil {
		rec.Outcome = string(rec.Err.Code)
	}
	for _, fn := range c.observers {
		fn(ctx, rec)
	}
}
