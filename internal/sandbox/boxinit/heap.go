package boxinit

import "runtime"

// collectAfter is how many bytes of requests a long-lived Go process of
// the box (the box init, a spawner) reads between two collections of its
// garbage. Each spawn leaves some behind, about ten times its request
// (the request decoded into strings, the policy decoded and keyed, the
// copy handed on, the reply): ~70 KiB for a 6.6 KB request. Go's own
// pacing collects nothing below a 4 MiB heap, so a box whose session had
// run a few dozen commands held ~4.9 MiB of anonymous memory in its init
// and ~4.8 MiB in its spawner, against ~1 MiB each after the first spawn.
// Counted in request bytes rather than read from the runtime's
// statistics: runtime.ReadMemStats flushes the allocation caches, and a
// read after every request cost ~250 KiB of its own.
const collectAfter = 32 << 10

// heapBound collects the garbage of a box's long-lived Go process once
// it has read collectAfter bytes of requests since the last collection:
// its heap then stays at a few hundred KiB past what is live, and a box
// that spawned a few processes (an idle session, one that ran Python
// once) never pays for a collection (the first cycle's mark and work
// buffers are ~0.4 MiB). after is called by the process's one request
// loop, after each request has been answered.
type heapBound struct {
	read int // request bytes since the last collection
}

func (h *heapBound) after(n int) {
	h.read += n
	if h.read < collectAfter {
		return
	}
	h.read = 0
	runtime.GC()
}
