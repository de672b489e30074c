package runcode

import "context"

// OutputFunc is told of output as a run writes it: stream is "stdout" or
// "stderr" ("stdout" also carries merged output), and p is only valid during
// the call (copy it to keep it). It is called from the goroutine that copies
// the program's output, so it must not block: a slow consumer drops or
// buffers on its own side, never slows the program.
type OutputFunc func(stream string, p []byte)

type outputKey struct{}

// WithOutput returns a context whose runs report their output to fn as it
// arrives, besides capturing it as always. Streaming access paths (the
// WebSocket) use it; without it nothing is reported and nothing is paid.
func WithOutput(ctx context.Context, fn OutputFunc) context.Context {
	return context.WithValue(ctx, outputKey{}, fn)
}

// OutputFrom returns the observer carried by ctx, or nil.
func OutputFrom(ctx context.Context) OutputFunc {
	fn, _ := ctx.Value(outputKey{}).(OutputFunc)
	return fn
}

// Observe makes the capture report every write to fn under stream (nil: no
// reporting). It returns c so that it chains with NewCapture.
func (c *Capture) Observe(fn OutputFunc, stream string) *Capture {
	c.mu.Lock()
	c.observe, c.stream = fn, stream
	c.mu.Unlock()
	return c
}

// Observed is NewCapture(...).Observe(OutputFrom(ctx), stream): the usual
// way for a run to honour the caller's observer.
func (c *Capture) Observed(ctx context.Context, stream string) *Capture {
	if fn := OutputFrom(ctx); fn != nil {
		return c.Observe(fn, stream)
	}
	return c
}

type startedKey struct{}

// WithStarted returns a context under which a run that starts a process
// the caller may want to name (a background process) calls fn with its
// pid once it runs, before any of its output is reported: an access path
// that must name the pid first (E2B's start event) learns it there.
func WithStarted(ctx context.Context, fn func(pid int)) context.Context {
	return context.WithValue(ctx, startedKey{}, fn)
}

// Started calls the function WithStarted put in ctx, if any.
func Started(ctx context.Context, pid int) {
	if fn, ok := ctx.Value(startedKey{}).(func(pid int)); ok && fn != nil {
		fn(pid)
	}
}
