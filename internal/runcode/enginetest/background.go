package enginetest

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/runcode"
)

// Background is a run going on in a goroutine (StartPrinting).
type Background struct {
	done   chan struct{}
	res    *runcode.Result
	err    error
	stderr bytes.Buffer
}

// StartPrinting starts run in a goroutine, giving it the writers for the
// run's stdout and stderr, and returns once the run has printed marker on
// stdout: the moment a test interrupts, restarts or cancels it, an event
// of the run and never a time. A run that ends before it printed marker
// fails t.
func StartPrinting(t testing.TB, marker string, run func(stdout, stderr io.Writer) (*runcode.Result, error)) *Background {
	t.Helper()
	b := &Background{done: make(chan struct{})}
	out := &markerWriter{marker: marker, seen: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.res, b.err = run(out, &b.stderr)
	}()
	select {
	case <-out.seen:
	case <-b.done:
		res := "no result"
		if b.res != nil {
			res = dump(b.res)
		}
		t.Fatalf("the run ended before it printed %q: %v; %s; stderr %q", marker, b.err, res, b.stderr.String())
	}
	return b
}

// Wait waits for the run's end: its result, what it wrote on stderr, and
// its error.
func (b *Background) Wait() (res *runcode.Result, stderr string, err error) {
	<-b.done
	return b.res, b.stderr.String(), b.err
}

// markerWriter closes seen once what was written holds marker.
type markerWriter struct {
	mu     sync.Mutex
	marker string
	buf    strings.Builder
	seen   chan struct{}
	found  bool
}

func (w *markerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.found {
		w.buf.Write(p)
		if strings.Contains(w.buf.String(), w.marker) {
			w.found = true
			close(w.seen)
		}
	}
	return len(p), nil
}
