package ws

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/progress"
	"github.com/quro-dev/quro/internal/runcode"
)

// argsTimeout is how long the server waits for the first message.
const argsTimeout = 30 * time.Second

// serveStream runs a capability with its output streamed: the client sends
// the input as the first text message; the server sends output messages as
// output arrives (and progress messages, {"type":"progress","message":...},
// while a slow first step such as preparing the embedded Python goes on),
// then the result (or the error) and closes. The run is
// canceled when the client closes the socket or sends {"type":"cancel"}.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	defer s.track()()
	caller, ok := s.admit(w, r)
	if !ok {
		return
	}
	name := r.PathValue("capability")
	capb, ok := s.ctl.Registry().Get(name)
	if !ok || !capb.Streams {
		msg := "this server has no capability that streams its output"
		if names := s.ctl.Registry().Streaming(); len(names) > 0 {
			msg = "stream one of " + strings.Join(names, ", ")
		}
		rest.WriteError(w, http.StatusNotFound, capability.Errorf(capability.NotFound, "%q cannot be streamed; %s", name, msg))
		return
	}
	if !caller.Scope.Covers(capb.Scope) {
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied, "%s needs scope %q", name, capb.Scope))
		return
	}
	release, ok := s.hold(w, caller)
	if !ok {
		return
	}
	defer release()
	c, err := s.accept(w, r)
	if err != nil {
		return
	}
	defer c.CloseNow()
	defer s.keepalive(r.Context(), c)()
	s.stream(r.Context(), c, caller, name)
}

func (s *Server) stream(parent context.Context, c *websocket.Conn, caller controller.Caller, name string) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	actx, acancel := context.WithTimeout(ctx, argsTimeout)
	typ, args, err := c.Read(actx)
	acancel()
	if err != nil {
		return
	}
	if typ != websocket.MessageText {
		c.Close(websocket.StatusUnsupportedData, "send the arguments of "+name+" as one JSON text message first")
		return
	}

	q := &outQueue{limit: s.opts.StreamBuffer, ready: make(chan struct{}, 1)}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	runCtx = runcode.WithOutput(runCtx, q.add)
	runCtx = progress.With(runCtx, q.setProgress)

	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancelRun() // the client closed or went away: stop the run
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m message
			if json.Unmarshal(data, &m) == nil && m.Type == "cancel" {
				return
			}
		}
	}()

	var reply *controller.Reply
	var callErr error
	callDone := make(chan struct{})
	go func() {
		defer close(callDone)
		reply, callErr = s.ctl.Call(runCtx, caller, name, args)
	}()

	out := &sender{c: c, ctx: ctx}
	for done := false; !done; {
		select {
		case <-q.ready:
		case <-callDone:
			done = true
		}
		// Wait for the run to end even when the client has gone, so that
		// the handler returns only after the run's processes are dead.
		out.flush(q, false)
	}
	q.close()
	out.flush(q, true)
	if callErr != nil {
		out.send(&message{Type: "error", Error: controller.Classify(callErr)})
	} else {
		out.send(&message{Type: "result", Output: reply.Output, Text: &reply.Text})
	}
	if out.err == nil {
		c.Close(websocket.StatusNormalClosure, "done")
	}
	c.CloseNow()
	<-readDone
}

// sender writes messages until the first error, then drops the rest.
type sender struct {
	c     *websocket.Conn
	ctx   context.Context
	err   error
	carry map[string][]byte // an incomplete UTF-8 sequence at a chunk's end
}

func (s *sender) send(m *message) {
	if s.err != nil {
		return
	}
	wctx, cancel := context.WithTimeout(s.ctx, writeTimeout)
	defer cancel()
	s.err = sendJSON(wctx, s.c, m)
}

// flush sends what q holds; at the end it also sends the incomplete
// UTF-8 kept back from a chunk's end.
func (s *sender) flush(q *outQueue, end bool) {
	if msg := q.takeProgress(); msg != "" {
		s.send(&message{Type: "progress", Message: msg})
	}
	chunks, dropped := q.take()
	if s.carry == nil {
		s.carry = map[string][]byte{}
	}
	for _, ch := range chunks {
		data := append(s.carry[ch.stream], ch.data...)
		keep := partialEnd(data)
		s.carry[ch.stream] = append([]byte(nil), data[len(data)-keep:]...)
		if text := data[:len(data)-keep]; len(text) > 0 {
			s.send(&message{Type: "output", Stream: ch.stream, Data: strings.ToValidUTF8(string(text), "\uFFFD")})
		}
	}
	if dropped > 0 {
		s.send(&message{Type: "dropped", Bytes: dropped,
			Message: "the connection fell behind the output; the result has the output as the capability keeps it"})
	}
	if end {
		for _, stream := range []string{"stdout", "stderr"} {
			if rest := s.carry[stream]; len(rest) > 0 {
				s.send(&message{Type: "output", Stream: stream, Data: strings.ToValidUTF8(string(rest), "\uFFFD")})
			}
		}
	}
}

// partialEnd is the length of an incomplete UTF-8 sequence at the end of b.
func partialEnd(b []byte) int {
	for back := 1; back < utf8.UTFMax && back <= len(b); back++ {
		if i := len(b) - back; utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return back
			}
			return 0
		}
	}
	return 0
}

type chunk struct {
	stream string
	data   []byte
}

// outQueue takes output from the run (runcode.OutputFunc) without ever
// blocking it: past limit bytes it counts what it drops instead.
type outQueue struct {
	mu      sync.Mutex
	items   []chunk
	size    int
	limit   int
	dropped int64
	closed  bool
	ready   chan struct{}
	// progress is the latest of what the call reported (the first run's
	// preparation of the embedded Python), not yet sent.
	progress string
}

func (q *outQueue) setProgress(msg string) {
	q.mu.Lock()
	q.progress = msg
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *outQueue) takeProgress() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	msg := q.progress
	q.progress = ""
	return msg
}

func (q *outQueue) add(stream string, p []byte) {
	q.mu.Lock()
	switch {
	case q.closed:
		// Output after the call returned (a terminal command left running
		// after a prompt) belongs to no stream any more.
		q.mu.Unlock()
		return
	case q.size+len(p) > q.limit:
		q.dropped += int64(len(p))
	case len(q.items) > 0 && q.items[len(q.items)-1].stream == stream:
		last := &q.items[len(q.items)-1]
		last.data = append(last.data, p...)
		q.size += len(p)
	default:
		q.items = append(q.items, chunk{stream, append([]byte(nil), p...)})
		q.size += len(p)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *outQueue) take() ([]chunk, int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	items, dropped := q.items, q.dropped
	q.items, q.size, q.dropped = nil, 0, 0
	return items, dropped
}

func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}
