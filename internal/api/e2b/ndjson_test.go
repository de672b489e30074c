package e2b

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
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
// write of their own (nor a keepalive: close comes next) and are written
// together at close, unflushed: the handler's return sends them with the
// response's end (TestExecuteEndsInOneWrite).
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
	if len(w.chunks) != 2 {
		t.Errorf("close flushed: chunks %q", w.chunks)
	}
	last := w.buf.String()
	for _, typ := range []string{`"result"`, `"number_of_executions"`, `"end_of_execution"`} {
		if !bytes.Contains([]byte(last), []byte(typ)) {
			t.Errorf("the lines written at close %q lack the %s line; chunks: %q", last, typ, w.chunks)
		}
	}
}

// recConn records each write a server makes to its connection.
type recConn struct {
	net.Conn
	mu     *sync.Mutex
	writes *[]string
}

func (c recConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	*c.writes = append(*c.writes, string(b))
	c.mu.Unlock()
	return c.Conn.Write(b)
}

type recListener struct {
	net.Listener
	mu     sync.Mutex
	writes []string
}

func (l *recListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return recConn{c, &l.mu, &l.writes}, nil
}

// TestExecuteEndsInOneWrite: over a real net/http server, the run's last
// lines and the chunked response's end leave in one write to the
// connection, so the client has the whole end in one read rather than
// waiting for a second segment.
func TestExecuteEndsInOneWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &recListener{Listener: ln}
	headers := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := newNDJSON(w)
		<-headers // the client has the status: the run goes on
		n.output("stdout", []byte("1\n"))
		n.batch()
		n.line(map[string]any{"type": "number_of_executions", "execution_count": 1})
		n.line(map[string]any{"type": "end_of_execution"})
		n.close()
	})}
	go srv.Serve(rl)
	defer srv.Close()
	resp, err := http.Post("http://"+ln.Addr().String()+"/execute", "application/json", nil)
	close(headers)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Contains(body, []byte("end_of_execution")) {
		t.Fatalf("body %q, %v", body, err)
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	last := rl.writes[len(rl.writes)-1]
	if !strings.Contains(last, "end_of_execution") || !strings.HasSuffix(last, "0\r\n\r\n") {
		t.Fatalf("the last write %q does not hold both the last line and the response's end; writes: %q", last, rl.writes)
	}
}
