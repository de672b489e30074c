package python

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
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

	ended int // places given back so far: the line moving

	queued func(run bool) // when set (tests): called as a caller begins to wait
}

// stalled is an acquire that saw no start end for its stall bound.
type stalled struct{ d time.Duration }

func (s stalled) Error() string {
	return fmt.Sprintf("no worker start ended for %s", s.d)
}

func newStartGate(n int) *startGate { return &startGate{n: max(n, 1), free: max(n, 1)} }

// acquire waits for a place (run: for a run, else a prestart) or for ctx;
// nil means the caller holds a place, to give back with release. With
// stall > 0 the wait also ends (a stalled error) when no start ended for
// stall: a line that moves is waited in however long it is (each start
// has its own bound), a stuck one is not.
func (g *startGate) acquire(ctx context.Context, run bool, stall time.Duration) error {
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
	queued, seen := g.queued, g.ended
	g.mu.Unlock()
	if queued != nil {
		queued(run)
	}
	if stall <= 0 {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return g.leave(ch, ctx.Err())
		}
	}
	t := time.NewTimer(stall)
	defer t.Stop()
	for {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return g.leave(ch, ctx.Err())
		case <-t.C:
			g.mu.Lock()
			moved := g.ended != seen
			seen = g.ended
			g.mu.Unlock()
			if !moved {
				return g.leave(ch, stalled{stall})
			}
			t.Reset(stall)
		}
	}
}

// leave takes a waiter out of the line, or passes on the place it was
// handed as it stopped waiting; it returns err.
func (g *startGate) leave(ch chan struct{}, err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-ch: // handed a place as the wait ended: it goes to the next
		g.releaseLocked()
	default:
		g.runs = slices.DeleteFunc(g.runs, func(c chan struct{}) bool { return c == ch })
		g.pre = slices.DeleteFunc(g.pre, func(c chan struct{}) bool { return c == ch })
	}
	return err
}

// release gives a place back: to the first waiting run, else the first
// waiting prestart.
func (g *startGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
}

func (g *startGate) releaseLocked() {
	g.ended++
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
