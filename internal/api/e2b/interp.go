package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/runcode"
)

// The code interpreter (port 49999), as E2B's server in the
// code-interpreter template answers it (template/server/main.py):
// POST /execute streams NDJSON, /contexts manages code contexts, /health.
// A context is a Quro code context of the sandbox's session
// (create_code_context…); a run is run_code with rich results.

// executeKeepalive is how long /execute stays silent before it sends a
// keepalive line (E2B's server: 5 s). A variable for the tests.
var executeKeepalive = 5 * time.Second

// maxExecuteBody bounds /execute's JSON (the code is at most run_code's
// 4 MiB, escaped).
const maxExecuteBody = 16 << 20

// maxPendingOutput bounds the output /execute holds for a client that
// reads slower than the code writes; past it output is dropped (and the
// stream says so once) rather than the run slowed.
const maxPendingOutput = 32 << 20

// interpRoutes serves the code interpreter: /execute, /contexts, /health.
// Every call that changes something takes a JSON body or none (jsonCall).
func (s *Server) interpRoutes(m *http.ServeMux) {
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, "OK")
	})
	m.HandleFunc("POST /execute", jsonCall(s.execute))
	m.HandleFunc("POST /contexts", jsonCall(s.createContext))
	m.HandleFunc("GET /contexts", s.listContexts)
	m.HandleFunc("DELETE /contexts/{id}", jsonCall(s.removeContext))
	m.HandleFunc("POST /contexts/{id}/restart", jsonCall(s.restartContext))
}

// writeText answers an error as E2B's interpreter does: plain text (the
// SDK shows a 404's body as NotFoundError's message).
func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// writeCallError answers a failed capability call in that form.
func writeCallError(w http.ResponseWriter, err error) {
	ce := asCapError(err)
	if ce.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(ce.RetryAfter))
	}
	writeText(w, statusOf(err), ce.Message)
}

// writeContextError answers a failed create_code_context: a refused
// language or directory names Quro's version, as every feature Quro does
// not have does on this API (E2B's R and Java kernels).
func (s *Server) writeContextError(w http.ResponseWriter, err error) {
	if asCapError(err).Code == capability.InvalidArgument {
		writeText(w, http.StatusBadRequest, "Quro "+s.version()+"'s code interpreter: "+asCapError(err).Message)
		return
	}
	writeCallError(w, err)
}

type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute runs code in a context and streams what happens as NDJSON.
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxExecuteBody))
	if err := dec.Decode(&req); err != nil {
		writeText(w, http.StatusBadRequest, "the body must be JSON {code, context_id?, language?, env_vars?}: "+err.Error())
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeText(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	in := app.RunCodeInput{
		Session: sandboxOf(r.Context()), Code: req.Code, Rich: true, Env: req.EnvVars,
		// No server-side limit in E2B: the client's timeout ends the run by
		// going away. Quro's is the longest run_code allows (10 min by
		// default).
		TimeoutMS: -1,
	}
	switch {
	case req.Language != "":
		// The session's default context of the language, made on first
		// use, as E2B's server does; the app reads the language (E2B's
		// spellings and Quro's) and refuses one it has no contexts for,
		// before the stream starts.
		c, err := invoke[*app.CodeContext](r.Context(), s, "create_code_context", app.CodeContextInput{
			Session: sandboxOf(r.Context()), Language: req.Language, Default: true,
		})
		if err != nil {
			s.writeContextError(w, err)
			return
		}
		in.Context = c.ID
	case req.ContextID == "":
		in.Context = "default" // python's
	default:
		in.Context = req.ContextID
		// Known before the stream starts: E2B answers 404 for it.
		list, err := invoke[*app.CodeContextList](r.Context(), s, "list_code_contexts", app.SessionRef{Session: sandboxOf(r.Context())})
		if err != nil {
			writeCallError(w, err)
			return
		}
		found := false
		for _, c := range list.Contexts {
			found = found || c.ID == req.ContextID
		}
		if !found {
			writeText(w, http.StatusNotFound, "Context "+req.ContextID+" not found")
			return
		}
	}
	// The status and headers go out now: the SDK's request timeout runs
	// until it has them, however long the code is silent.
	out := newNDJSON(w)
	ctx := runcode.WithOutput(r.Context(), out.output)
	res, err := invoke[*runcode.Result](ctx, s, "run_code", in)
	// The run ended: what is left (its results, its count, the end) goes
	// out in one write with the response's end, not a flush a line.
	out.batch()
	restarted := err == nil && res.Exception != nil && res.Exception.Name == runcode.RestartedException().Name
	stopped := err != nil && asCapError(err).Code == capability.Canceled || err == nil && res.Interrupted && !res.TimedOut && !restarted
	if stopped && r.Context().Err() == nil {
		// Stopped, and not by this client: the sandbox was killed (its
		// calls are canceled) or the server is closing. E2B's client sees
		// its connection reset, then asks /health (502 now) and says
		// "the sandbox was killed"; a stream that ended normally would
		// look like a run that finished. The reset waits (bounded) until
		// the sandbox is gone: the kill ends its calls before its box,
		// and a probe in between would find it alive.
		s.waitGone(r.Context())
		out.abort()
		panic(http.ErrAbortHandler)
	}
	out.flushCarry()
	if err != nil {
		out.line(map[string]any{"type": "error", "name": "QuroError", "value": messageOf(err), "traceback": messageOf(err)})
	} else {
		// E2B's client shows no notes: one saying the context's state
		// is gone (its interpreter was released after it idled) goes
		// on stderr, so that it is never lost silently.
		for _, n := range res.Notes {
			if strings.HasPrefix(n, runcode.NoteRestarted) {
				out.text("stderr", []byte("[quro] "+n+"\n"))
			}
		}
		for _, rr := range res.Results {
			out.line(resultLine(rr))
		}
		switch {
		case res.Exception != nil:
			out.line(map[string]any{"type": "error", "name": res.Exception.Name, "value": res.Exception.Value, "traceback": res.Exception.Traceback})
		case res.Error != "":
			name := "ExecutionError"
			if res.TimedOut {
				name = "TimeoutError"
			}
			out.line(map[string]any{"type": "error", "name": name, "value": res.Error, "traceback": res.Error})
		}
		if res.ExecutionCount > 0 {
			out.line(map[string]any{"type": "number_of_executions", "execution_count": res.ExecutionCount})
		}
	}
	out.line(map[string]any{"type": "end_of_execution"})
	out.close()
}

// resultFields maps a result's media types to E2B's result fields.
var resultFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultLine is a result as E2B's server sends it (api/models/result.py):
// text/plain without its surrounding quotes, the known media types in
// their fields, the others in extra.
func resultLine(rr runcode.RichResult) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": rr.Main}
	extra := map[string]any{}
	for mime, v := range rr.Data {
		f, ok := resultFields[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if f == "text" {
			if t, ok := v.(string); ok && len(t) >= 2 &&
				(t[0] == '\'' && t[len(t)-1] == '\'' || t[0] == '"' && t[len(t)-1] == '"') {
				v = t[1 : len(t)-1]
			}
		}
		line[f] = v
	}
	line["extra"] = extra
	return line
}

// ndjson streams /execute's lines: one JSON object per line, never a
// blank one, in the order they are made, from a goroutine of its own so
// that the run never waits for the client; a keepalive after each
// executeKeepalive of silence.
type ndjson struct {
	w http.ResponseWriter

	mu      sync.Mutex
	queue   [][]byte
	pending int
	dropped bool
	closed  bool
	batched bool              // lines wait for close (batch)
	carry   map[string][]byte // a stream's incomplete UTF-8 sequence
	wake    chan struct{}
	done    chan struct{}
}

// newNDJSON starts the stream: the 200 status goes out at once.
func newNDJSON(w http.ResponseWriter) *ndjson {
	n := &ndjson{w: w, carry: map[string][]byte{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	n.wake <- struct{}{}
	go n.write()
	return n
}

// output is the run's runcode.OutputFunc: a stdout or stderr line with
// the text as it came (a chunk, not a line), whole UTF-8 sequences only.
func (n *ndjson) output(stream string, p []byte) {
	n.mu.Lock()
	b := append(n.carry[stream], p...)
	cut := len(b)
	// Keep an incomplete sequence at the end for the next chunk.
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				cut = i
			}
			break
		}
	}
	n.carry[stream] = append([]byte(nil), b[cut:]...)
	n.mu.Unlock()
	if cut > 0 {
		n.text(stream, b[:cut])
	}
}

// flushCarry sends what is left of incomplete sequences.
func (n *ndjson) flushCarry() {
	for _, stream := range []string{"stdout", "stderr"} {
		n.mu.Lock()
		b := n.carry[stream]
		n.carry[stream] = nil
		n.mu.Unlock()
		if len(b) > 0 {
			n.text(stream, b)
		}
	}
}

func (n *ndjson) text(stream string, b []byte) {
	n.line(map[string]any{"type": stream, "text": string(b), "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
}

// line queues v as a line.
func (n *ndjson) line(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"type": "error", "name": "QuroError", "value": "encoding a line: " + err.Error()})
	}
	b = append(b, '\n')
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	typ, _ := v.(map[string]any)["type"].(string)
	if n.pending+len(b) > maxPendingOutput && (typ == "stdout" || typ == "stderr") {
		if !n.dropped {
			n.dropped = true
			msg, _ := json.Marshal(map[string]any{"type": "stderr", "text": fmt.Sprintf("\n[the client read slower than the code wrote: output past %d MiB held was dropped]\n", maxPendingOutput>>20),
				"timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
			n.queue = append(n.queue, append(msg, '\n'))
		}
		return
	}
	n.queue = append(n.queue, b)
	n.pending += len(b)
	if n.batched {
		return // close wakes the writer
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// batch holds the lines queued from now on until close, which writes them
// together: the run's last lines reach the client in one chunk.
func (n *ndjson) batch() {
	n.mu.Lock()
	n.batched = true
	n.mu.Unlock()
}

// close ends the stream after the lines queued; it returns when they
// are written (or the client is gone), unflushed: the handler's return
// sends them with the stream's end.
func (n *ndjson) close() {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		select {
		case n.wake <- struct{}{}:
		default:
		}
	}
	n.mu.Unlock()
	<-n.done
}

// abort ends the stream without writing what is queued.
func (n *ndjson) abort() {
	n.mu.Lock()
	n.closed = true
	n.queue = nil
	select {
	case n.wake <- struct{}{}:
	default:
	}
	n.mu.Unlock()
	<-n.done
}

func (n *ndjson) write() {
	defer close(n.done)
	rc := http.NewResponseController(n.w)
	t := time.NewTimer(executeKeepalive)
	defer t.Stop()
	header := false
	broken := false
	keepalive := []byte(`{"type":"keepalive"}` + "\n")
	for {
		select {
		case <-n.wake:
		case <-t.C:
			n.mu.Lock()
			if len(n.queue) == 0 && !n.closed && !n.batched {
				n.queue = append(n.queue, keepalive)
				n.pending += len(keepalive)
			}
			n.mu.Unlock()
		}
		n.mu.Lock()
		if n.batched && !n.closed && header {
			// The run ended: its last lines wait for close.
			n.mu.Unlock()
			t.Reset(executeKeepalive)
			continue
		}
		q := n.queue
		n.queue = nil
		closed := n.closed
		n.mu.Unlock()
		if !broken && (len(q) > 0 || !header) {
			if !header {
				header = true
				n.w.Header().Set("Content-Type", "application/x-ndjson")
				n.w.Header().Set("Cache-Control", "no-store")
				n.w.WriteHeader(http.StatusOK)
			}
			for _, b := range q {
				if _, err := n.w.Write(b); err != nil {
					broken = true // the client went away: its run is interrupted
					break
				}
			}
			// The last lines are not flushed here: the handler returns
			// once close has them written, and net/http sends them with
			// the stream's end in one write, so that the client reads
			// the run's end and the response's in one chunk, not two.
			if !broken && !closed {
				if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
					broken = true
				}
			}
		}
		n.mu.Lock()
		for _, b := range q {
			n.pending -= len(b)
		}
		n.mu.Unlock()
		if closed {
			n.mu.Lock()
			rest := len(n.queue)
			n.mu.Unlock()
			if rest == 0 {
				return
			}
			continue
		}
		if len(q) > 0 {
			// Silence is counted from the last line.
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(executeKeepalive)
		}
	}
}

// contextBody is E2B's Context (the code interpreter's
// api/models/context.py).
type contextBody struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

type createContextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req createContextRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeText(w, http.StatusBadRequest, "the body must be JSON {language?, cwd?}: "+err.Error())
		return
	}
	c, err := invoke[*app.CodeContext](r.Context(), s, "create_code_context", app.CodeContextInput{
		Session: sandboxOf(r.Context()), Language: req.Language, Cwd: req.Cwd,
	})
	if err != nil {
		s.writeContextError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, contextJSON(c))
}

func contextJSON(c *app.CodeContext) contextBody {
	return contextBody{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	list, err := invoke[*app.CodeContextList](r.Context(), s, "list_code_contexts", app.SessionRef{Session: sandboxOf(r.Context())})
	if err != nil {
		writeCallError(w, err)
		return
	}
	out := make([]contextBody, 0, len(list.Contexts))
	for i := range list.Contexts {
		out = append(out, contextJSON(&list.Contexts[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	_, err := invoke[*app.CodeContextRemoved](r.Context(), s, "remove_code_context", contextRef(r))
	contextDone(w, r, err)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	_, err := invoke[*app.CodeContext](r.Context(), s, "restart_code_context", contextRef(r))
	contextDone(w, r, err)
}

// contextRef is the code context of the request's path.
func contextRef(r *http.Request) app.CodeContextRef {
	return app.CodeContextRef{Session: sandboxOf(r.Context()), ID: r.PathValue("id")}
}

// contextDone answers a remove or restart of a context.
func contextDone(w http.ResponseWriter, r *http.Request, err error) {
	id := r.PathValue("id")
	if err != nil {
		if asCapError(err).Code == capability.NotFound {
			writeText(w, http.StatusNotFound, "Context "+id+" not found")
			return
		}
		writeCallError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}
