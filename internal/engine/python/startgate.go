package python

import (
	"context"
	"slices"
	"sync"
)

// startGate is the places for worker starts: as many at once as the
// machine has CPUs (a worker's start is a box and an interpreter, CPU
// bound: a hundred at once on two cores took each about a minute, one
// after another they take a fraction of a second each). A run waiting for
// its session's worker goes before every prestart, runs among themselves
// and prestarts among themselves in the order they came.
type startGate struct {
	mu   sync.Mutex
	n    int // places
	free int
	runs []chan struct{} // waiting runs, first first; closed: handed a place
	pre  []chan struct{} // waiting prestarts

	queued func(run bool) // when set (tests): called as a caller begins to wait
}

func newStartGate(n int) *startGate { return &startGate{n: max(n, 1), free: max(n, 1)} }

// acquire waits for a place (run: for a run, else a prestart) or for ctx;
// nil means the caller holds a place, to give back with release.
func (g *startGate) acquire(ctx context.Context, run bool) error {
	g.mu.Lock()
	if g.free > 0 && len(g.runs) == 0 && (run || len(g.pre) == 0) {
		g.free--
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	if run {
		g.runs = append(g.runs, ch)
	} else {
		g.pre = append(g.pre, ch)
	}
	queued := g.queued
	g.mu.Unlock()
	if queued != nil {
		queued(run)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-ch: // handed a place as ctx ended: it goes to the next
		g.releaseLocked()
	default:
		g.runs = slices.DeleteFunc(g.runs, func(c chan struct{}) bool { return c == ch })
		g.pre = slices.DeleteFunc(g.pre, func(c chan struct{}) bool { return c == ch })
	}
	return ctx.Err()
}

// release gives a place back: to the first waiting run, else the first
// waiting prestart.
func (g *startGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
}

func (g *startGate) releaseLocked() {
	switch {
	case len(g.runs) > 0:
		close(g.runs[0])
		g.runs = g.runs[1:]
	case len(g.pre) > 0:
		close(g.pre[0])
		g.pre = g.pre[1:]
	default:
		g.free++
	}
}
