// Package benchbed is the test bed of the served benchmarks (bench/box,
// bench/density, bench/service): one real App served on a loopback listener the way `quro
// serve` serves it (cmd/quro/serve.go), with an exec token from the store
// verified on every request, REST under /v1/ and, where asked, MCP
// streamable HTTP at /mcp behind the same origin/Host check. The WebSocket
// routes and /metrics are not mounted: no benchmark uses them.
package benchbed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
)

// Tenant is the tenant of the token Serve issues ("": the local tenant).
// A tenant of its own keeps a benchmark off the process and memory
// ceilings of the local tenant, which every quro on the machine shares.
var Tenant = ""

// Bed is an App served over HTTP on 127.0.0.1.
type Bed struct {
	App    *app.App
	Token  string
	Caller controller.Caller // what the token authenticates as, for in-process calls
	URL    string            // http://127.0.0.1:port
	Client *http.Client      // keep-alive, bearer token

	srv *http.Server
}

// Serve warms a's embedded Python, issues an exec token for the local
// tenant and serves a on 127.0.0.1:0: REST, and MCP at /mcp when withMCP.
// On an error it closes a.
func Serve(ctx context.Context, a *app.App, withMCP bool) (*Bed, error) {
	b := &Bed{App: a}
	if err := b.start(ctx, withMCP, true); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// ServeCold is Serve without warming the embedded Python first: as `quro
// serve` does, the caller starts a.PreparePython in the background, and
// a first Python run waits for what is left of it. REST only.
func ServeCold(ctx context.Context, a *app.App) (*Bed, error) {
	b := &Bed{App: a}
	if err := b.start(ctx, false, false); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Bed) start(ctx context.Context, withMCP, warm bool) error {
	a := b.App
	if warm {
		if err := a.Python.Warm(ctx); err != nil {
			return err
		}
	}
	iss, err := a.CreateToken(ctx, "bench", Tenant, []string{"exec"}, "bench")
	if err != nil {
		return err
	}
	b.Token = iss.Token
	if b.Caller, err = a.VerifyToken(ctx, iss.Token); err != nil {
		return err
	}
	b.Caller.Path = "bench"

	log := slog.New(slog.DiscardHandler)
	authFn := a.Authenticate()
	access := rest.Access{Auth: authFn}
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Logger: log, Access: access}))
	if withMCP {
		mcpH := quromcp.Handler(a.Controller, authFn, &quromcp.Options{Logger: log})
		mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if e := access.Check(r); e != nil { // serve.go's guard
				rest.WriteError(w, http.StatusForbidden, e)
				return
			}
			mcpH.ServeHTTP(w, r)
		}))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	b.URL = "http://" + ln.Addr().String()
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }() // http.ErrServerClosed, at Close
	b.Client = &http.Client{Transport: &bearer{token: b.Token, rt: &http.Transport{
		MaxIdleConns: 64, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute,
	}}}
	return nil
}

// Close ends the server and the App (which closes every box).
func (b *Bed) Close() {
	if b.srv != nil {
		b.srv.Close()
	}
	b.App.Close()
}

// bearer adds the token to every request, as an agent's HTTP client does.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (t *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.rt.RoundTrip(r)
}

// Post is POST /v1/{capability} with body as JSON, read whole as a client
// does; the answer is decoded into out when out is not nil. A status other
// than 200 is an error carrying the body.
func (b *Bed) Post(ctx context.Context, capability string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+"/v1/"+capability, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.Client.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", capability, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// CPUTime is the user+system CPU time this process has used.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Micro is d in microseconds.
func Micro(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// Loop warms f up with 20 calls, then times each call of the benchmark's
// loop and reports the median as p50-µs.
func Loop(b *testing.B, f func() error) {
	for range 20 {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(ds)
	b.ReportMetric(Micro(ds[len(ds)/2]), "p50-µs")
}

// MustJSON is v as JSON; v is the benchmark's own value, so an error is a bug.
func MustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

// RunBody is run_code's body: code in lang ("" is Python) in session.
func RunBody(session, lang, code string) []byte {
	return MustJSON(app.RunCodeInput{Session: session, Lang: lang, Code: code})
}

// Run is run_code with a prepared body; the run must exit 0 with stdout want.
func (b *Bed) Run(ctx context.Context, body []byte, want string) error {
	var r runcode.Result
	if err := b.Post(ctx, "run_code", body, &r); err != nil {
		return err
	}
	if r.ExitCode != 0 || r.Error != "" || r.Stdout != want {
		return fmt.Errorf("run_code: exit %d, error %q, stdout %q (want %q), stderr %q", r.ExitCode, r.Error, r.Stdout, want, r.Stderr)
	}
	return nil
}

// CreateSession is create_session over REST; it returns the session's id.
func (b *Bed) CreateSession(ctx context.Context) (string, error) {
	var s app.SessionInfo
	if err := b.Post(ctx, "create_session", []byte(`{}`), &s); err != nil {
		return "", err
	}
	return s.ID, nil
}

// DestroySession is destroy_session over REST.
func (b *Bed) DestroySession(ctx context.Context, id string) error {
	return b.Post(ctx, "destroy_session", RefBody(id), nil)
}

// RefBody is the body of a call that names only session.
func RefBody(session string) []byte { return MustJSON(app.SessionRef{Session: session}) }

// Dur is d for a table: µs below a millisecond, ms below a second, else s.
func Dur(d time.Duration) string {
	switch {
	case d < time.Millisecond && d > -time.Millisecond:
		return fmt.Sprintf("%.0f µs", Micro(d))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", Micro(d)/1e3)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
