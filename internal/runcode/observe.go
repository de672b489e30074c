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
