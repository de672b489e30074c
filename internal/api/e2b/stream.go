package e2b

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/controller"
)

// What envd's services (process.Process in envd_process.go,
// filesystem.Filesystem in envd_fs.go) read alike from a request.

// headerKeepalive names the seconds without output after which a stream
// gets a keepalive event (the SDKs send 50; envd's default is 90).
const headerKeepalive = "Keepalive-Ping-Interval"

// The bounds of a stream's keepalive interval, in seconds.
const (
	defaultKeepaliveSeconds = 90
	maxKeepaliveSeconds     = 3600
)

// keepaliveInterval is how long an envd stream stays silent before it
// sends a keepalive: the request's Keepalive-Ping-Interval in whole
// seconds, 1 to 3600 (a larger value is an hour: seconds that overflow a
// time.Duration would turn it negative and fire the timer for ever), else
// (absent, not a positive number) envd's default, 90 s.
func keepaliveInterval(h http.Header) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(h.Get(headerKeepalive)), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || n <= 0 {
		n = defaultKeepaliveSeconds
	}
	return time.Duration(min(n, maxKeepaliveSeconds)) * keepaliveUnit
}

// keepaliveUnit is a second of Keepalive-Ping-Interval (the tests shorten
// it to see keepalives at once).
var keepaliveUnit = time.Second

// maxQuotedUser bounds how much of a refused user name a message repeats.
const maxQuotedUser = 64

// userRefusal is why an envd request naming user u (its Basic auth user,
// or /files' username parameter) is refused, "" when it is not: a Quro
// sandbox has one user, "user", that runs every process and owns every
// file; root or another is refused rather than silently served as it.
// For root it says why there is none (docs/security.md, "No root in a
// box") and what to use instead. The name is only quoted, never read as a
// format.
func (s *Server) userRefusal(u string) string {
	if u == "" || u == "user" {
		return ""
	}
	if u == "root" {
		return `user "root": a Quro sandbox has no root: every process runs as its one unprivileged user, "user" ` +
			"(the box's uid 0 would be the host's root), and the system directories are read-only to it. " +
			"Drop the user option; to install software run `apt-get install -y PKG` as user (it asks the server: install_packages, " +
			"which needs a key with scope install), `pip install PKG` (into the sandbox's Python) or `npm install PKG` in /home/user; " +
			"sudo in the sandbox answers the same (Quro " + s.version() + ")"
	}
	if len(u) > maxQuotedUser {
		u = u[:maxQuotedUser] + "…"
	}
	return "user " + strconv.Quote(u) + `: a Quro sandbox has one user, "user" (the session's own, which runs every process and owns every file); ` +
		"Quro " + s.version() + " runs nothing as root or another user: drop the user option"
}

// checkUser refuses a Connect request of envd that names another user
// than the sandbox's own: root, which every box has, is permission_denied
// (it is there, and never given); any other name is unauthenticated, as
// envd answers a user it cannot look up (the SDKs' AuthenticationError).
func (s *Server) checkUser(h http.Header) error {
	u := user(&http.Request{Header: h})
	if msg := s.userRefusal(u); msg != "" {
		if u == "root" {
			return rpcErrorf(connect.CodePermissionDenied, msg)
		}
		return rpcErrorf(connect.CodeUnauthenticated, msg)
	}
	return nil
}

// streamHold counts each envd streaming call (Start, Connect, StreamInput,
// WatchDir) against its token's streams (Options.Streams) while it runs,
// and refuses the one past the cap with resource_exhausted, before the
// call does anything.
type streamHold struct{ s *Server }

func (streamHold) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (streamHold) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (h streamHold) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		release, e := h.s.opts.Streams.Acquire(callerOf(ctx))
		if e != nil {
			err := connect.NewError(connect.CodeResourceExhausted, errors.New(e.Message))
			err.Meta().Set("Retry-After", streamcap.RetryAfter)
			return err
		}
		defer release()
		return next(ctx, conn)
	}
}

// holdHTTP counts a long request that is not a Connect call (/files,
// /execute; streamHold counts those) against caller's streams; past the
// cap it answers 429 in the plane's error shape (the interpreter's plain
// text, envd's JSON) and reports the refusal.
func (s *Server) holdHTTP(w http.ResponseWriter, caller controller.Caller, t target) (release func(), refused bool) {
	if strings.HasPrefix(t.path, "/process.") || strings.HasPrefix(t.path, "/filesystem.") {
		return func() {}, false
	}
	release, e := s.opts.Streams.Acquire(caller)
	if e == nil {
		return release, false
	}
	w.Header().Set("Retry-After", streamcap.RetryAfter)
	if t.port == InterpPort {
		writeText(w, http.StatusTooManyRequests, e.Message)
	} else {
		writeJSONError(w, http.StatusTooManyRequests, e.Message)
	}
	return nil, true
}

// idleBounded bounds the silences of a long request by
// Options.StreamIdle: each read of its body and each write of its
// response that does not finish within it fails, which ends the call. The
// deadlines last only while a read or write waits (a stream may be
// silent between keepalives for longer), and the read deadline is lifted
// at the body's end: the HTTP server then reads in the background to see
// the client go.
func (s *Server) idleBounded(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request) {
	rc := http.NewResponseController(w)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &idleBody{ReadCloser: r.Body, rc: rc, idle: s.opts.StreamIdle}
	}
	return &idleWriter{ResponseWriter: w, rc: rc, idle: s.opts.StreamIdle}, r
}

// idleBody is a request body whose every read must end within idle.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done bool
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// idleWriter is a response whose every write and flush must be taken by
// the client within idle.
type idleWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

func (w *idleWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	defer w.rc.SetWriteDeadline(time.Time{})
	return w.ResponseWriter.Write(b)
}

// FlushError flushes what was written, within idle; http.ResponseController
// calls it, and so sees the failure (/execute ends on one).
func (w *idleWriter) FlushError() error {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	defer w.rc.SetWriteDeadline(time.Time{})
	return w.rc.Flush()
}

// Flush is http.Flusher's, for connect-go's streams.
func (w *idleWriter) Flush() { _ = w.FlushError() }

// ReadFrom copies src to the response sendChunk bytes at a time, each
// piece within idle, through the server's own ReadFrom: a file
// (sendFile's *io.LimitedReader of an *os.File) then goes by the
// kernel's copy (sendfile) instead of through a buffer.
func (w *idleWriter) ReadFrom(src io.Reader) (n int64, err error) {
	rf, ok := w.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{w}, src) // Write's deadlines
	}
	lr, ok := src.(*io.LimitedReader)
	if !ok {
		lr = &io.LimitedReader{R: src, N: math.MaxInt64}
	}
	defer w.rc.SetWriteDeadline(time.Time{})
	for lr.N > 0 {
		piece := &io.LimitedReader{R: lr.R, N: min(lr.N, sendChunk)}
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
		m, err := rf.ReadFrom(piece)
		n, lr.N = n+m, lr.N-m
		if err != nil || piece.N > 0 { // failed, or src ended
			return n, err
		}
	}
	return n, nil
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
