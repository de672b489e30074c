package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/quro-dev/quro/bench/internal/benchbed"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/runcode"
)

// previewServer answers every GET with 2 bytes, keeping nothing between
// requests; it writes into the FIFO ready once it listens.
const previewServer = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        self.send_response(200)
        self.send_header('Content-Length', '2')
        self.end_headers()
        self.wfile.write(b'ok')
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 8765), H)
open('ready', 'w').write('up\n')
s.serve_forever()
`

// servingSession makes a session under none (create's extra fields:
// extra) whose box runs previewServer, listening once it returns.
func servingSession(ctx context.Context, b *benchbed.Bed, extra string) (app.SessionInfo, error) {
	var s app.SessionInfo
	if err := b.Post(ctx, "create_session", []byte(`{"network":"none"`+extra+`}`), &s); err != nil {
		return s, err
	}
	run := func(code string) error {
		body, _ := json.Marshal(app.RunCodeInput{Session: s.ID, Lang: "bash", Code: code, TimeoutMS: 60000})
		var r runcode.Result
		if err := b.Post(ctx, "run_code", body, &r); err != nil {
			return err
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("%s: %+v", code, r)
		}
		return nil
	}
	if err := run("mkfifo ready"); err != nil {
		return s, err
	}
	sp, _ := json.Marshal(app.StartProcessInput{Session: s.ID, Cmd: "python3", Args: []string{"-c", previewServer}, Background: true})
	if err := b.Post(ctx, "start_process", sp, &json.RawMessage{}); err != nil {
		return s, err
	}
	return s, run("read up < ready")
}

// previewRequests times GET requests to a server in a box (network none)
// three ways, alternating: direct (a connection DialBox makes inside the
// box's namespace, as the proxy's own dial, one per request, and the
// request written on it), through the preview proxy's path form and
// through its host form (a client kept alive to the server, as a browser
// is; the proxy dials the box per request); and to the same server in a
// second session whose ports are public, direct and through its host
// form with no token.
func previewRequests(ctx context.Context, a *app.App, b *benchbed.Bed, n int) ([]*series, error) {
	s, err := servingSession(ctx, b, "")
	if err != nil {
		return nil, err
	}
	// The same server in a session whose ports are public: its host form
	// with no token.
	pub, err := servingSession(ctx, b, `,"public_previews":true`)
	if err != nil {
		return nil, err
	}

	// The preview routes, mounted as quro serve mounts them.
	access := rest.Access{Auth: a.Authenticate()}
	log := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	mux.Handle(rest.PreviewPattern, rest.Preview(access, a, log))
	ph := rest.NewPreviewHost(access, "preview.bench", a, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := ph.Match(r); ok {
			ph.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	base := "http://" + ln.Addr().String()

	viaProxy := func(host, path string, token bool) (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return 0, err
		}
		if host != "" {
			req.Host = host
		}
		if token {
			req.Header.Set("Authorization", "Bearer "+b.Token)
		}
		t := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t)
		if err != nil || resp.StatusCode != 200 || string(body) != "ok" {
			return 0, fmt.Errorf("preview %s%s: %d %q %v", host, path, resp.StatusCode, body, err)
		}
		return d, nil
	}
	directTo := func(id string) (time.Duration, error) {
		t := time.Now()
		c, err := a.Sandbox.DialBox(ctx, id, 8765)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nConnection: close\r\n\r\n"); err != nil {
			return 0, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t)
		if err != nil || string(body) != "ok" {
			return 0, fmt.Errorf("direct: %q %v", body, err)
		}
		return d, nil
	}
	dir := &series{name: "request, direct into the box (DialBox)"}
	path := &series{name: "request, preview path form"}
	host := &series{name: "request, preview host form"}
	public := &series{name: "request, public host form (no token)"}
	dirPub := &series{name: "request, direct into the public session's box"}
	pathURL := app.PreviewPath(s.ID, 8765)
	hostName := app.PreviewHostName("preview.bench", s.ID, 8765)
	pubName := app.PreviewHostName("preview.bench", pub.ID, 8765)
	kinds := []struct {
		s   *series
		ask func() (time.Duration, error)
	}{
		{dir, func() (time.Duration, error) { return directTo(s.ID) }},
		{dirPub, func() (time.Duration, error) { return directTo(pub.ID) }},
		{path, func() (time.Duration, error) { return viaProxy("", pathURL, true) }},
		{host, func() (time.Duration, error) { return viaProxy(hostName, "/", true) }},
		{public, func() (time.Duration, error) { return viaProxy(pubName, "/", false) }},
	}
	// Each round asks every kind once, starting one further each time:
	// no kind is always the first or the last.
	for i := range n + 50 {
		for k := range kinds {
			kind := kinds[(i+k)%len(kinds)]
			d, err := kind.ask()
			if err != nil {
				return nil, err
			}
			if i >= 50 { // the first 50 warm up
				kind.s.ds = append(kind.s.ds, d)
			}
		}
	}
	if !strings.HasPrefix(pathURL, "/") {
		return nil, fmt.Errorf("path %q", pathURL)
	}
	return []*series{dir, path, host, public, dirPub}, nil
}
