package connlimit

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// HTTP timeouts for NewServer (the defaults of HTTPOptions).
const (
	HeaderTimeout = 10 * time.Second // to send a request's headers
	IdleTimeout   = 60 * time.Second // between requests of a keep-alive connection
	BodyTimeout   = time.Minute      // to send a request's body
	WriteTimeout  = 45 * time.Minute // to take a response (the longest call, install_packages, lasts 30 min at most)
)

// HTTPOptions tune Handler and NewServer. nil means defaults.
type HTTPOptions struct {
	// Authenticated reports whether r carries valid credentials; the
	// first such request on a connection makes it trusted (Conn.Trust),
	// safe from eviction. nil: no connection is ever trusted.
	Authenticated func(r *http.Request) bool
	// Long reports the requests that may last as long as their client
	// wants — WebSocket upgrades, event streams — and get no read or
	// write deadline; they keep their connection alive themselves.
	Long func(r *http.Request) bool
	// HeaderTimeout, IdleTimeout, BodyTimeout, WriteTimeout: 0 means the
	// package's constant of that name.
	HeaderTimeout, IdleTimeout, BodyTimeout, WriteTimeout time.Duration
	// ConnContext, if set, runs after the package's own (which records the
	// *Conn for Handler).
	ConnContext func(ctx context.Context, c net.Conn) context.Context
}

func (p *HTTPOptions) withDefaults() HTTPOptions {
	var o HTTPOptions
	if p != nil {
		o = *p
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = HeaderTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = IdleTimeout
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = BodyTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = WriteTimeout
	}
	if o.Authenticated == nil {
		o.Authenticated = func(*http.Request) bool { return false }
	}
	if o.Long == nil {
		o.Long = func(*http.Request) bool { return false }
	}
	return o
}

// NewServer returns an http.Server for h with the timeouts of o, to serve
// on a *Listener:
//   - a connection must send a request's headers within HeaderTimeout, and
//     a keep-alive connection is closed after IdleTimeout without one;
//   - each request gets BodyTimeout to send its body and WriteTimeout to
//     take its response, set per request (http.ResponseController), so that
//     the Long ones — WebSockets, event streams — get none;
//   - Handler's rules apply (trust, close after a 401);
//   - the connection's state is reported to it (Conn.SetIdle), so that a
//     trusted connection idle between requests may be evicted
//     (Options.EvictIdle).
//
// The server has no ReadTimeout: it would stay on the connection while the
// handler runs, and end long calls.
func NewServer(h http.Handler, opts *HTTPOptions) *http.Server {
	o := opts.withDefaults()
	return &http.Server{
		Handler:           handler(h, o),
		ReadHeaderTimeout: o.HeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ctx = context.WithValue(ctx, connKey{}, c)
			if o.ConnContext != nil {
				ctx = o.ConnContext(ctx, c)
			}
			return ctx
		},
		ConnState: connState,
	}
}

// connState tells a *Conn when it waits for a request between two
// (Conn.SetIdle), for Options.EvictIdle.
func connState(c net.Conn, st http.ConnState) {
	lc, ok := c.(*Conn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		lc.SetIdle(true)
	case http.StateActive, http.StateHijacked:
		lc.SetIdle(false)
	}
}

type connKey struct{}

// ConnOf returns the connection of a request served by NewServer's server.
func ConnOf(r *http.Request) *Conn {
	c, _ := r.Context().Value(connKey{}).(*Conn)
	return c
}

// Handler applies the per-request rules in front of h:
//   - a connection whose request authenticates is trusted (Conn.Trust);
//   - the connection is closed after a 401, 429 or 503 answer, so a
//     client without credentials holds nothing once answered;
//   - the request's body must arrive within BodyTimeout and its response
//     be taken within WriteTimeout, unless it is Long.
func Handler(h http.Handler, opts *HTTPOptions) http.Handler {
	return handler(h, opts.withDefaults())
}

func handler(h http.Handler, o HTTPOptions) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := ConnOf(r); c != nil && !c.Trusted() && o.Authenticated(r) {
			c.Trust()
		}
		rc := http.NewResponseController(w)
		if o.Long(r) {
			rc.SetReadDeadline(time.Time{})
			rc.SetWriteDeadline(time.Time{})
		} else {
			rc.SetReadDeadline(time.Now().Add(o.BodyTimeout))
			rc.SetWriteDeadline(time.Now().Add(o.WriteTimeout))
			if r.Body != nil && r.Body != http.NoBody {
				r.Body = &bodyDeadline{ReadCloser: r.Body, rc: rc}
			}
		}
		h.ServeHTTP(&closeOnRefusal{ResponseWriter: w}, r)
	})
}

// bodyDeadline lifts the body's read deadline once the body is read: the
// server then reads the connection in the background, to notice a client
// that goes away, and a deadline there would cancel the request.
type bodyDeadline struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *bodyDeadline) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// closeOnRefusal marks the connection for closing when the answer is a
// refusal of the caller (401, 429, 503).
type closeOnRefusal struct {
	http.ResponseWriter
	wrote bool
}

func (w *closeOnRefusal) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		switch code {
		case http.StatusUnauthorized, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closeOnRefusal) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// ReadFrom passes a copy from a file on to the server's writer, as Write
// does: the server hands a file with a Content-Length to the kernel's
// copy (sendfile) only when it finds io.ReaderFrom on the writer.
func (w *closeOnRefusal) ReadFrom(src io.Reader) (int64, error) {
	w.wrote = true
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, src)
}

// Flush is http.Flusher's, for event streams.
func (w *closeOnRefusal) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController and WebSocket libraries reach the
// server's writer (Hijack, deadlines).
func (w *closeOnRefusal) Unwrap() http.ResponseWriter { return w.ResponseWriter }
