package terminal

import "sync"

// Ring keeps the last Size bytes written to it. Safe for concurrent use.
type Ring struct {
	mu   sync.Mutex
	buf  []byte
	pos  int // bytes ever written
	size int
}

// NewRing returns a ring of size bytes. Its memory grows with what is
// written, up to size: an idle terminal holds only what it printed.
func NewRing(size int) *Ring { return &Ring{size: size} }

// Write never fails.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if len(r.buf) < r.size {
		// Not yet full (nothing fell out: pos == len(buf)).
		need := r.pos + len(p)
		if need > r.size {
			need = r.size
		}
		if need > cap(r.buf) {
			// Doubling, never past size.
			nb := make([]byte, len(r.buf), min(r.size, max(2*cap(r.buf), need, 4096)))
			copy(nb, r.buf)
			r.buf = nb
		}
		if r.pos+len(p) <= r.size {
			r.buf = append(r.buf, p...)
			r.pos += len(p)
			return n, nil
		}
		r.buf = r.buf[:r.size]
	}
	if len(p) > r.size {
		r.pos += len(p) - r.size
		p = p[len(p)-r.size:]
	}
	for len(p) > 0 {
		i := r.pos % r.size
		k := copy(r.buf[i:], p)
		p = p[k:]
		r.pos += k
	}
	return n, nil
}

// Bytes returns the kept bytes, oldest first.
func (r *Ring) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pos < r.size {
		return append([]byte(nil), r.buf[:r.pos]...)
	}
	i := r.pos % r.size
	return append(append([]byte(nil), r.buf[i:]...), r.buf[:i]...)
}

// Dropped is how many bytes fell out of the ring.
func (r *Ring) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(0, r.pos-r.size)
}
