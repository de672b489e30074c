package e2b

import (
	"bytes"
	"net/http"
	"sync"
	"testing"
)

// chunkWriter is a ResponseWriter that keeps what each flush sent.
type chunkWriter struct {
	mu      sync.Mutex
	h       http.Header
	buf     bytes.Buffer
	chunks  []string
	flushed chan struct{}
}

func (c *chunkWriter) Header() http.Header { return c.h }
func (c *chunkWriter) WriteHeader(int)     {}
func (c *chunkWriter) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(b)
}
func (c *chunkWriter) Flush() {
	c.mu.Lock()
	c.chunks = append(c.chunks, c.buf.String())
	c.buf.Reset()
	c.mu.Unlock()
	c.flushed <- struct{}{}
}

// TestExecuteLastLinesInOneChunk: once the run has ended (batch), the
// lines /execute still sends — results, the count, the end — wake no
// write of their own (nor a keepalive: close comes next) and reach the
// client in one flush at close.
func TestExecuteLastLinesInOneChunk(t *testing.T) {
	w := &chunkWriter{h: http.Header{}, flushed: make(chan struct{}, 16)}
	n := newNDJSON(w)
	<-w.flushed // the status, at once
	n.output("stdout", []byte("1\n"))
	<-w.flushed // output goes out as it comes
	n.batch()
	n.line(map[string]any{"type": "result", "text": "2"})
	n.line(map[string]any{"type": "number_of_executions", "execution_count": 1})
	n.line(map[string]any{"type": "end_of_execution"})
	if len(n.wake) != 0 {
		t.Error("a line queued after batch woke the writer")
	}
	n.close()
	last := w.chunks[len(w.chunks)-1]
	for _, typ := range []string{`"result"`, `"number_of_executions"`, `"end_of_execution"`} {
		if !bytes.Contains([]byte(last), []byte(typ)) {
			t.Errorf("the last chunk %q lacks the %s line; chunks: %q", last, typ, w.chunks)
		}
	}
}
