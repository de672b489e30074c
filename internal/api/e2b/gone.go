package e2b

import (
	"context"
	"time"
)

// waitGone waits until the request's sandbox no longer exists, at most
// goneWait. A destroy ends the session's calls first, then its box: E2B's
// client sees a killed sandbox as a dropped connection and then probes
// its /health, so a stream the kill ended is reset only once the sandbox
// is gone and the probe finds it so (the process and the interpreter
// streams).
func (s *Server) waitGone(ctx context.Context) {
	deadline := time.NewTimer(goneWait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := s.opts.Sandbox(ctx, sandboxOf(ctx)); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// goneWait bounds waitGone: a destroy waits up to 10 s for the calls it
// ended before it ends the box and deletes the session.
const goneWait = 30 * time.Second
