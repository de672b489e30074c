package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/coder/websocket"
	"github.com/creack/pty"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/terminal"
)

// detachKey ends quro term (Ctrl-]), leaving the shell running when it
// is a server's.
const detachKey = 0x1d

func newTermCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "term [SESSION]",
		Short: "Open an interactive terminal (PTY) in a session; Ctrl-] detaches",
		Long: `Open an interactive shell on a pseudo-terminal in the session's sandbox and
attach your terminal to it (raw mode; the size follows your window).

On a server (the one running on the data directory, or --server/QURO_URL)
it attaches to the session's terminal over WebSocket: Ctrl-] detaches and
leaves the shell running, and quro term SESSION attaches again, showing the
terminal as it was. Without a server the terminal runs in-process and
Ctrl-] ends it.

When the shell exits, quro term exits with its status.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in, ok := g.stdin.(*os.File)
			if !ok || !term.IsTerminal(int(in.Fd())) {
				return errors.New("quro term needs a terminal on standard input")
			}
			t, err := g.target()
			if err != nil {
				return err
			}
			var ts termSession
			var name string
			if t.url == "" {
				b, err := g.localBackend(cmd)
				if err != nil {
					return err
				}
				defer b.close()
				// Opening the terminal is the open_terminal capability
				// (audited, the session looked up as the caller), then
				// this process attaches to the PTY it started, as the
				// WebSocket route does on a server.
				var scr app.Screen
				if err := b.output(cmd.Context(), "open_terminal", app.SessionRef{Session: first(args)}, &scr); err != nil {
					return err
				}
				p, err := b.app.OpenPTY(cmd.Context(), scr.Session)
				if err != nil {
					return err
				}
				lt := newLocalTerm(p)
				defer lt.p.Detach(lt.v)
				ts, name = lt, sessionName(cmd, b, scr.Session)
			} else {
				c := newTargetCaller(t)
				rt, err := dialTerm(cmd.Context(), c, first(args))
				if err != nil {
					return err
				}
				defer rt.close()
				ts, name = rt, rt.name
			}
			return runTerm(cmd.Context(), in, cmd.OutOrStdout(), cmd.ErrOrStderr(), ts, name, t.url != "")
		},
	}
	g.serverFlags(cmd, false)
	// In-process: open_terminal (and get_session_status for the name);
	// on a server: get_session_status, which is also how the server's
	// WebSocket route authorizes the attach.
	return annotate(cmd, "open_terminal", "get_session_status")
}

// sessionName is the name of session id for the banner (the id when the
// status cannot be read).
func sessionName(cmd *cobra.Command, b *backend, id string) string {
	var s app.SessionInfo
	if err := b.output(cmd.Context(), "get_session_status", app.SessionRef{Session: id}, &s); err != nil || s.Name == "" {
		return id
	}
	return s.Name
}

// termSession is an attached terminal, in-process or on a server.
type termSession interface {
	// Output is the terminal's output; it is closed when the shell ended
	// or the connection did.
	Output() <-chan []byte
	Write(p []byte)
	Resize(cols, rows int)
	// End is, after Output closed, the shell's exit status, or why the
	// terminal was lost.
	End() (code int, err error)
}

// runTerm attaches the local terminal in to ts until the shell ends or
// the user detaches.
func runTerm(ctx context.Context, in *os.File, out, errw io.Writer, ts termSession, name string, remote bool) error {
	if size, err := pty.GetsizeFull(in); err == nil {
		ts.Resize(int(size.Cols), int(size.Rows))
	}
	old, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return err
	}
	defer func() {
		if err := term.Restore(int(in.Fd()), old); err != nil {
			fmt.Fprintf(errw, "quro: the terminal could not be restored (%v); the command reset restores it\n", err)
		}
	}()
	fmt.Fprintf(errw, "[quro: session %s; Ctrl-] detaches]\r\n", name)

	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	keys := make(chan []byte)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := in.Read(buf)
			if err != nil {
				close(keys)
				return
			}
			keys <- append([]byte(nil), buf[:n]...)
		}
	}()
	detached := func() error {
		if remote {
			fmt.Fprintf(errw, "\r\n[quro: detached; the shell keeps running: quro term %s attaches again]\r\n", name)
		} else {
			fmt.Fprint(errw, "\r\n[quro: detached; the in-process terminal ends with this command]\r\n")
		}
		return nil
	}
	output := ts.Output()
	for {
		select {
		case b, ok := <-output:
			if !ok {
				code, err := ts.End()
				if err != nil {
					fmt.Fprintf(errw, "\r\n[quro: %v]\r\n", err)
					return &exitError{1}
				}
				fmt.Fprintf(errw, "\r\n[quro: the shell exited with status %d]\r\n", code)
				if code != 0 {
					return &exitError{min(max(code, 1), 255)}
				}
				return nil
			}
			out.Write(b)
		case k, ok := <-keys:
			if !ok {
				return detached()
			}
			if i := bytes.IndexByte(k, detachKey); i >= 0 {
				if i > 0 {
					ts.Write(k[:i])
				}
				return detached()
			}
			ts.Write(k)
		case <-winch:
			if size, err := pty.GetsizeFull(in); err == nil {
				ts.Resize(int(size.Cols), int(size.Rows))
			}
		case <-ctx.Done():
			return detached()
		}
	}
}

// localTerm is a PTY of an App opened in this process.
type localTerm struct {
	p   *terminal.PTY
	v   *terminal.Viewer
	out chan []byte
}

func newLocalTerm(p *terminal.PTY) *localTerm {
	v, replay := p.Attach()
	t := &localTerm{p: p, v: v, out: make(chan []byte)}
	go func() {
		defer close(t.out)
		if len(replay) > 0 {
			t.out <- replay
		}
		for b := range v.C {
			t.out <- b
		}
	}()
	return t
}

func (t *localTerm) Output() <-chan []byte { return t.out }
func (t *localTerm) Write(b []byte)        { t.p.Write(b) }
func (t *localTerm) Resize(cols, rows int) {
	_ = t.p.Resize(cols, rows) // a size it refuses (over 1000x1000) keeps the current one
}
func (t *localTerm) End() (int, error) {
	if t.v.Dropped {
		return 0, errors.New("this terminal fell behind the shell's output and was dropped")
	}
	<-t.p.Done()
	code, _ := t.p.ExitCode()
	return code, nil
}

// remoteTerm is a session's terminal on a server, over the WebSocket
// route GET /v1/sessions/{id}/pty (protocol quro.v1, docs/architecture.md).
type remoteTerm struct {
	c      *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	name   string
	out    chan []byte
	code   *int  // from {"type":"exit"}
	err    error // why the connection ended, when not a normal close
}

// termMessage is a text frame of quro.v1.
type termMessage struct {
	Type    string `json:"type"`
	Session string `json:"session,omitempty"`
	Cols    int    `json:"cols,omitempty"`
	Rows    int    `json:"rows,omitempty"`
	Code    *int   `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// dialTerm resolves the session (the default one when ref is empty)
// through the server, then opens its terminal.
func dialTerm(ctx context.Context, c *httpCaller, ref string) (*remoteTerm, error) {
	args, _ := json.Marshal(app.SessionRef{Session: ref})
	raw, err := c.do(ctx, http.MethodPost, "/v1/get_session_status", args, "application/json")
	if err != nil {
		return nil, err
	}
	var s app.SessionInfo
	if err := json.Unmarshal(raw, &s); err != nil || s.ID == "" {
		return nil, fmt.Errorf("the server %s answered get_session_status without a session id", c.name)
	}
	hdr := http.Header{}
	if c.t.token.value != "" {
		hdr.Set("Authorization", "Bearer "+c.t.token.value)
	}
	u := c.base + "/v1/sessions/" + url.PathEscape(s.ID) + "/pty"
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient:   c.client,
		HTTPHeader:   hdr,
		Subprotocols: []string{"quro.v1"},
	})
	if err != nil {
		cancel()
		if resp != nil && resp.Body != nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			var e struct {
				Error *struct{ Code, Message string } `json:"error"`
			}
			if json.Unmarshal(b, &e) == nil && e.Error != nil {
				return nil, fmt.Errorf("%s: %s", e.Error.Code, e.Error.Message)
			}
		}
		return nil, fmt.Errorf("opening the terminal of session %s on %s: %w", s.Name, c.name, err)
	}
	// The scrollback arrives as one frame.
	conn.SetReadLimit(64 << 20)
	t := &remoteTerm{c: conn, ctx: ctx, cancel: cancel, name: s.Name, out: make(chan []byte)}
	go t.read()
	return t, nil
}

func (t *remoteTerm) read() {
	defer close(t.out)
	for {
		typ, b, err := t.c.Read(t.ctx)
		if err != nil {
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure:
			case websocket.StatusTryAgainLater:
				var ce websocket.CloseError
				errors.As(err, &ce)
				t.err = fmt.Errorf("the server dropped this terminal: %s; run quro term %s again", ce.Reason, t.name)
			default:
				if t.ctx.Err() == nil {
					t.err = fmt.Errorf("the connection to the terminal was lost: %v", err)
				}
			}
			return
		}
		if typ == websocket.MessageBinary {
			select {
			case t.out <- b:
			case <-t.ctx.Done():
				return
			}
			continue
		}
		var m termMessage
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case "exit":
			t.code = m.Code
		case "error":
			// A refused resize: shown, the terminal goes on.
			select {
			case t.out <- []byte("\r\n[quro: the server says: " + m.Message + "]\r\n"):
			case <-t.ctx.Done():
				return
			}
		}
	}
}

func (t *remoteTerm) Output() <-chan []byte { return t.out }

func (t *remoteTerm) Write(b []byte) { t.c.Write(t.ctx, websocket.MessageBinary, b) }

func (t *remoteTerm) Resize(cols, rows int) {
	b, _ := json.Marshal(termMessage{Type: "resize", Cols: cols, Rows: rows})
	t.c.Write(t.ctx, websocket.MessageText, b)
}

func (t *remoteTerm) End() (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	if t.code == nil {
		return 0, errors.New("the server closed the terminal without an exit status")
	}
	return *t.code, nil
}

// close detaches: a normal close leaves the shell running on the server.
func (t *remoteTerm) close() {
	t.c.Close(websocket.StatusNormalClosure, "detached")
	t.cancel()
}
