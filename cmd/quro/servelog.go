package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/controller"
)

// logFlags are quro serve's logging flags.
type logFlags struct {
	level  string // debug, info, warn, error
	format string // text, json
	access bool   // one line per HTTP request
}

func (f *logFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.level, "log-level", "info",
		"least level logged: debug (adds one line per call), info, warn or error")
	cmd.Flags().StringVar(&f.format, "log-format", "text", "log lines as text (key=value) or json (one object a line)")
	cmd.Flags().BoolVar(&f.access, "access-log", false,
		"log one line per HTTP request (method, path without the query, status, bytes, duration, tenant, peer) on stderr, whatever --log-level; rotation is the service manager's (journald, logrotate on a redirected stderr)")
}

// Repeated lines: each message (and level) may log logBurst lines at once
// and logRate lines a second after that; the lines over it are counted and
// summed up once every logSummaryEvery in one line per message.
const (
	logBurst        = 10
	logRate         = 1.0 // lines a second, per message
	logSummaryEvery = 10 * time.Second
	logSummaryIDs   = 100  // ids of suppressed lines kept per summary
	logMaxKeys      = 1024 // messages tracked; beyond, they share one bucket
)

// serveLoggers are the server's loggers: log for everything (rate-limited
// per message at info and above), access for the access log (nil when
// off). close writes the last summaries.
type serveLoggers struct {
	log    *slog.Logger
	access *slog.Logger
	close  func()
}

// loggers builds the loggers of f on w (stderr).
func (f *logFlags) loggers(w io.Writer) (*serveLoggers, error) {
	var level slog.Level
	switch strings.ToLower(f.level) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", f.level)
	}
	// The two handlers write whole lines to one stream: one lock for both,
	// so that their lines never interleave.
	w = &lockedWriter{w: w}
	var newHandler func(slog.Level) slog.Handler
	switch strings.ToLower(f.format) {
	case "text":
		newHandler = func(l slog.Level) slog.Handler { return slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}) }
	case "json":
		newHandler = func(l slog.Level) slog.Handler { return slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}) }
	default:
		return nil, fmt.Errorf("--log-format %q: use text or json", f.format)
	}
	q := newQuiet(newHandler(level), logBurst, logRate, logSummaryEvery)
	l := &serveLoggers{log: slog.New(q), close: q.close}
	if f.access {
		l.access = slog.New(newHandler(slog.LevelInfo))
	}
	return l, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// quiet is a slog.Handler that bounds the lines of each message: a client
// can make the server log a warning per request (a refused request, an
// internal error it provokes), and must not make it write a line per
// request. Debug lines pass untouched: whoever asks for them asked for a
// line per call. Over the bound, lines are counted, not written, and every
// period one summary line per message says how many were suppressed, with
// the "id" of each (up to logSummaryIDs; internal errors carry one, which
// the client was given) and the last "err".
type quiet struct {
	next slog.Handler
	lim  *limiter
}

type limiter struct {
	base  slog.Handler // summaries go here, unlimited
	burst float64
	rate  float64 // tokens a second
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	keys map[bucketKey]*bucket

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

type bucketKey struct {
	level slog.Level
	msg   string
}

type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int
	ids        []string
	idsDropped int
	lastErr    string
	since      time.Time
}

func newQuiet(next slog.Handler, burst int, rate float64, every time.Duration) *quiet {
	lim := &limiter{base: next, burst: float64(burst), rate: rate, every: every, now: time.Now,
		keys: map[bucketKey]*bucket{}, stop: make(chan struct{}), done: make(chan struct{})}
	go lim.run()
	return &quiet{next: next, lim: lim}
}

func (q *quiet) Enabled(ctx context.Context, l slog.Level) bool { return q.next.Enabled(ctx, l) }

func (q *quiet) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo || q.lim.allow(r) {
		return q.next.Handle(ctx, r)
	}
	return nil
}

func (q *quiet) WithAttrs(as []slog.Attr) slog.Handler {
	return &quiet{next: q.next.WithAttrs(as), lim: q.lim}
}

func (q *quiet) WithGroup(name string) slog.Handler {
	return &quiet{next: q.next.WithGroup(name), lim: q.lim}
}

// close stops the summaries and writes the last ones.
func (q *quiet) close() {
	q.lim.once.Do(func() { close(q.lim.stop) })
	<-q.lim.done
}

// allow takes a token of r's message; without one, it counts r.
func (l *limiter) allow(r slog.Record) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := bucketKey{r.Level, r.Message}
	b := l.keys[k]
	if b == nil {
		if len(l.keys) >= logMaxKeys {
			k = bucketKey{r.Level, "(other messages)"}
			b = l.keys[k]
		}
		if b == nil {
			b = &bucket{tokens: l.burst, last: now}
			l.keys[k] = b
		}
	}
	b.tokens += now.Sub(b.last).Seconds() * l.rate
	b.last = now
	if b.tokens > l.burst {
		b.tokens = l.burst
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.suppressed == 0 {
		b.since = r.Time
	}
	b.suppressed++
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "id":
			if len(b.ids) < logSummaryIDs {
				b.ids = append(b.ids, a.Value.String())
			} else {
				b.idsDropped++
			}
		case "err":
			b.lastErr = a.Value.String()
		}
		return true
	})
	return false
}

func (l *limiter) run() {
	defer close(l.done)
	t := time.NewTicker(l.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.summarize()
		case <-l.stop:
			l.summarize()
			return
		}
	}
}

// summarize writes one line per message with suppressed lines, and forgets
// the messages whose bucket is full again.
func (l *limiter) summarize() {
	type summary struct {
		k bucketKey
		b bucket
	}
	var out []summary
	now := l.now()
	l.mu.Lock()
	for k, b := range l.keys {
		if b.suppressed > 0 {
			out = append(out, summary{k, *b})
			b.suppressed, b.ids, b.idsDropped, b.lastErr = 0, nil, 0, ""
			continue
		}
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.keys, k) // as good as new
		}
	}
	l.mu.Unlock()
	for _, s := range out {
		r := slog.NewRecord(now, s.k.level, "repeated log lines suppressed", 0)
		r.AddAttrs(slog.String("line", s.k.msg), slog.Int("suppressed", s.b.suppressed),
			slog.Time("since", s.b.since))
		if len(s.b.ids) > 0 {
			r.AddAttrs(slog.String("ids", strings.Join(s.b.ids, ",")))
			if s.b.idsDropped > 0 {
				r.AddAttrs(slog.Int("ids_not_listed", s.b.idsDropped))
			}
		}
		if s.b.lastErr != "" {
			r.AddAttrs(slog.String("last_err", s.b.lastErr))
		}
		_ = l.base.Handle(context.Background(), r)
	}
}

// serve puts srv's own error lines (TLS handshakes, broken requests: a
// client can cause one per connection) on the bounded log, at warn, and
// the access log, if on, in front of its handler.
func (l *serveLoggers) serve(srv *http.Server) {
	srv.ErrorLog = slog.NewLogLogger(l.log.Handler(), slog.LevelWarn)
	srv.Handler = accessLog(l.access, srv.Handler)
}

// accessLog logs one line per request on log, after it is answered. The
// path is logged without its query (which may carry anything a client
// chose); no header is logged (tokens); the tenant is the one the request
// authenticated as, when it did (see notingTenant).
func accessLog(log *slog.Logger, h http.Handler) http.Handler {
	if log == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		note := &accessNote{}
		r = r.WithContext(context.WithValue(r.Context(), accessKey{}, note))
		aw := &accessWriter{ResponseWriter: w}
		defer func() {
			status := aw.status
			if status == 0 {
				status = http.StatusOK
			}
			path := r.URL.Path
			if len(path) > 256 {
				path = path[:256] + "…"
			}
			attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", path),
				slog.Int("status", status), slog.Int64("bytes", aw.bytes),
				slog.Duration("duration", time.Since(start)), slog.String("peer", r.RemoteAddr)}
			if t, ok := note.tenant.Load().(string); ok { // "": the local tenant
				attrs = append(attrs, slog.String("tenant", t))
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "http", attrs...)
		}()
		h.ServeHTTP(aw, r)
	})
}

type accessKey struct{}

type accessNote struct{ tenant atomic.Value }

// notingTenant tells the access log the tenant of each request that
// authenticates through auth.
func notingTenant(auth httpauth.Func) httpauth.Func {
	return func(r *http.Request) (controller.Caller, error) {
		c, err := auth(r)
		if err == nil {
			if n, ok := r.Context().Value(accessKey{}).(*accessNote); ok {
				n.tenant.Store(c.Tenant)
			}
		}
		return c, err
	}
}

type accessWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *accessWriter) WriteHeader(code int) {
	if w.status == 0 || (w.status < 200 && w.status != http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *accessWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// ReadFrom counts what the server's own ReadFrom sends: a file handed to
// the response (E2B's GET /files) keeps the kernel's copy (sendfile).
func (w *accessWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := io.Copy(w.ResponseWriter, src)
	w.bytes += n
	return n, err
}

// Flush is http.Flusher's, for event streams.
func (w *accessWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController and WebSocket libraries reach the
// server's writer (Hijack, deadlines).
func (w *accessWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
