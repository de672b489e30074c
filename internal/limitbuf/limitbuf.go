// Package limitbuf is a buffer that keeps the first bytes written to it,
// for the output of a program the server reads (apt's simulation, a
// compiler's version line) without letting that program make it grow.
package limitbuf

import (
	"bytes"
	"sync"
)

// Buffer keeps the first Max bytes written to it and notes that more came.
// Writes always succeed (the writer is never stopped by a full buffer). It
// is safe for concurrent use, so that one Buffer can be a process's stdout
// and stderr at once.
type Buffer struct {
	Max int

	mu   sync.Mutex
	b    bytes.Buffer
	over bool
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.Max - l.b.Len(); len(p) > room {
		l.over = true
		l.b.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return l.b.Write(p)
}

// Bytes returns what was kept (not to be modified while writes go on).
func (l *Buffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Bytes()
}

// String returns what was kept.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Over reports whether more than Max bytes were written.
func (l *Buffer) Over() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.over
}
