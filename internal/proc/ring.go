package proc

// RingSize is how many bytes of a process's latest output its ring keeps
// for ReadOutput.
const RingSize = 64 << 10

// keepEnded is how many ended processes of a session stay readable
// (ReadOutput) after their end.
const keepEnded = 4

// ring keeps the last RingSize bytes of a process's output, every stream
// merged in the order it came, and counts every byte ever written: an
// offset into that count is a reader's cursor.
type ring struct {
	buf   []byte // len RingSize once full
	start int    // where the oldest byte is, once full
	total int64  // bytes ever written
}

func (r *ring) write(p []byte) {
	r.total += int64(len(p))
	if len(p) >= RingSize {
		r.buf = append(r.buf[:0], p[len(p)-RingSize:]...)
		r.start = 0
		return
	}
	if room := RingSize - len(r.buf); room > 0 {
		n := min(room, len(p))
		r.buf = append(r.buf, p[:n]...)
		p = p[n:]
	}
	for len(p) > 0 {
		n := copy(r.buf[r.start:], p)
		p = p[n:]
		r.start = (r.start + n) % RingSize
	}
}

// Output is what a process printed from an offset on (ReadOutput).
type Output struct {
	Data []byte
	// From is the offset of Data's first byte; Next the offset after its
	// last (the cursor for the next read).
	From, Next int64
	// Dropped is how many bytes at or after the asked offset the ring no
	// longer held (From - since, when positive).
	Dropped int64
}

// read returns what the ring holds from offset since on.
func (r *ring) read(since int64) Output {
	oldest := r.total - int64(len(r.buf))
	out := Output{From: max(since, oldest), Next: r.total}
	if since < oldest {
		out.Dropped = oldest - since
	}
	if out.From >= r.total {
		out.From = r.total
		return out
	}
	skip := int(out.From - oldest)
	ordered := append(append([]byte(nil), r.buf[r.start:]...), r.buf[:r.start]...)
	out.Data = ordered[skip:]
	return out
}
