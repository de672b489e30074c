package app

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/store"
)

// The egress log's bounds in the store: the latest egressKeep decisions of
// each session and egressKeepTotal of all sessions together; a session's
// are deleted with it.
const egressKeepTotal = 200_000

// egressWriter persists the egress's decisions (store.AppendEgress) off the
// connections' path: add never blocks (a full queue drops the decision,
// counted and logged), one goroutine writes them in batches, and a flush,
// a forget and a close are taken in the order of the decisions before
// them. What was committed survives a killed server.
type egressWriter struct {
	st   *store.Store
	keep store.EgressKeep
	log  *slog.Logger
	lost func(n int) // counts decisions not written (nil: not counted)

	// queue holds pointers: a buffer of egressQueue items by value was
	// some 1.5 MB allocated and zeroed by every App's New, used or not.
	queue   chan *egressItem
	quit    chan struct{}
	stopped chan struct{}
	once    sync.Once
	dropped atomic.Int64
}

// egressItem is one decision to write, or a session whose rows to delete,
// or a flush to answer once what came before it is written.
type egressItem struct {
	entry  store.EgressEntry
	forget string
	flush  chan struct{}
}

const (
	egressQueue = 8192
	egressBatch = 512
)

func newEgressWriter(st *store.Store, keep store.EgressKeep, log *slog.Logger, lost func(n int)) *egressWriter {
	if lost == nil {
		lost = func(int) {}
	}
	w := &egressWriter{st: st, keep: keep, log: log, lost: lost, queue: make(chan *egressItem, egressQueue),
		quit: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// openEgressLog deletes the rows of sessions destroyed while no server
// wrote the log, and starts the App's writer.
func openEgressLog(ctx context.Context, st *store.Store, m *metrics.Metrics, log *slog.Logger) *egressWriter {
	if err := st.PruneEgress(ctx); err != nil {
		log.Warn("egress log: rows of ended sessions not pruned", "err", err)
	}
	return newEgressWriter(st, store.EgressKeep{PerSession: egressKeep, Total: egressKeepTotal}, log, m.EgressLogLost)
}

// add queues ev to be written; it never waits.
func (w *egressWriter) add(ev egress.Event) {
	if w == nil {
		return
	}
	e := store.EgressEntry{Session: ev.Box, Start: ev.Start, Dest: ev.Dest, Addr: ev.Addr, Decision: ev.Decision,
		Rule: ev.Rule, Reason: ev.Reason, BytesOut: ev.BytesOut, BytesIn: ev.BytesIn, Duration: ev.Duration}
	select {
	case <-w.quit:
		return
	default:
	}
	select {
	case w.queue <- &egressItem{entry: e}:
	default:
		w.lost(1)
		if n := w.dropped.Add(1); n&(n-1) == 0 { // the 1st, 2nd, 4th, 8th… drop
			w.log.Warn("egress log: queue full, decisions not written", "dropped", n)
		}
	}
}

// forget deletes session's rows once the decisions queued before are
// written (so none of them comes back after).
func (w *egressWriter) forget(session string) {
	if w == nil {
		return
	}
	select {
	case w.queue <- &egressItem{forget: session}:
	case <-w.quit:
	}
}

// flush waits until every decision queued before it is written.
func (w *egressWriter) flush(ctx context.Context) error {
	if w == nil {
		return nil
	}
	done := make(chan struct{})
	select {
	case w.queue <- &egressItem{flush: done}:
	case <-w.quit:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-w.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close writes what is queued and stops the writer.
func (w *egressWriter) close() {
	if w == nil {
		return
	}
	w.once.Do(func() { close(w.quit) })
	<-w.stopped
}

func (w *egressWriter) run() {
	defer close(w.stopped)
	var batch []store.EgressEntry
	write := func() {
		if len(batch) == 0 {
			return
		}
		var err error
		for range 3 {
			if err = w.st.AppendEgress(context.Background(), batch, w.keep); err == nil {
				break
			}
		}
		if err != nil {
			w.lost(len(batch))
			w.log.Error("egress log: batch not written", "entries", len(batch), "err", err)
		}
		batch = batch[:0]
	}
	take := func(it *egressItem) {
		switch {
		case it.flush != nil:
			write()
			close(it.flush)
		case it.forget != "":
			write()
			if err := w.st.ForgetEgress(context.Background(), it.forget); err != nil {
				w.log.Warn("egress log: a session's rows not deleted", "session", it.forget, "err", err)
			}
		default:
			batch = append(batch, it.entry)
		}
	}
	for {
		select {
		case it := <-w.queue:
			take(it)
			// Let a burst gather for a moment, up to a batch.
			gather := time.NewTimer(10 * time.Millisecond)
		burst:
			for len(batch) > 0 && len(batch) < egressBatch {
				select {
				case it := <-w.queue:
					take(it)
				case <-gather.C:
					break burst
				case <-w.quit:
					break burst
				}
			}
			gather.Stop()
			write()
		case <-w.quit:
			for {
				select {
				case it := <-w.queue:
					take(it)
				default:
					write()
					return
				}
			}
		}
	}
}
