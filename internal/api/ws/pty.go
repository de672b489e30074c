package ws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/terminal"
)

// writeTimeout bounds one frame write: a client that stops reading is
// closed by it, while the PTY has long since dropped it as a viewer.
const writeTimeout = 10 * time.Second

// sessionOutput is an output about one session, as get_session_status's
// (app.SessionInfo) is: SessionID is the session's id.
type sessionOutput interface{ SessionID() string }

// servePTY attaches a WebSocket to the session's interactive terminal.
func (s *Server) servePTY(w http.ResponseWriter, r *http.Request) {
	defer s.track()()
	caller, ok := s.admit(w, r)
	if !ok {
		return
	}
	if !caller.Scope.Covers(capability.ScopeExec) {
		rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
			"the interactive terminal needs scope %q", capability.ScopeExec))
		return
	}
	release, held := s.hold(w, caller)
	if !held {
		return
	}
	defer release()
	// The session is looked up through the controller as the caller, so
	// tenancy applies: another tenant's session is a 404 here, before the
	// upgrade.
	args, _ := json.Marshal(map[string]string{"session": r.PathValue("id")})
	reply, err := s.ctl.Call(r.Context(), caller, "get_session_status", args)
	if err != nil {
		writeCallError(w, err)
		return
	}
	so, ok := reply.Output.(sessionOutput)
	if !ok || so.SessionID() == "" {
		s.log.Error("ws: get_session_status's output names no session", "output", fmt.Sprintf("%T", reply.Output))
		rest.WriteError(w, http.StatusInternalServerError, capability.Errorf(capability.Internal,
			"get_session_status answered with no session id; the interactive terminal cannot be found"))
		return
	}
	id := so.SessionID()
	if s.opts.PTY == nil {
		rest.WriteError(w, http.StatusServiceUnavailable, capability.Errorf(capability.Unavailable, "this server has no interactive terminals"))
		return
	}
	p, err := s.opts.PTY(r.Context(), id)
	if err != nil {
		writeCallError(w, err)
		return
	}
	c, err := s.accept(w, r)
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	defer s.keepalive(r.Context(), c)()
	s.attach(r.Context(), c, p, id)
}

func (s *Server) attach(parent context.Context, c *websocket.Conn, p *terminal.PTY, id string) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	v, replay := p.AttachQueue(s.opts.ViewerQueue)
	defer p.Detach(v)

	cols, rows := p.Size()
	if sendJSON(ctx, c, &message{Type: "hello", Session: id, Cols: cols, Rows: rows}) != nil {
		return
	}
	// The scrollback first, so that a reconnect shows the terminal as it was.
	if len(replay) > 0 && c.Write(ctx, websocket.MessageBinary, replay) != nil {
		return
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel()
		s.readKeys(ctx, c, p)
	}()
	defer func() { <-readDone }()
	for {
		select {
		case b, ok := <-v.C:
			if !ok {
				if v.Dropped {
					c.Close(websocket.StatusTryAgainLater, "this connection fell behind the terminal's output and was dropped; reconnect to catch up")
					return
				}
				// The output ended because the shell did; its status
				// follows as soon as it has been waited for.
				select {
				case <-p.Done():
				case <-ctx.Done():
					c.CloseNow()
					return
				}
				if code, ok := p.ExitCode(); ok {
					sendJSON(ctx, c, &message{Type: "exit", Code: &code})
				}
				c.Close(websocket.StatusNormalClosure, "the shell exited")
				return
			}
			wctx, wcancel := context.WithTimeout(ctx, writeTimeout)
			err := c.Write(wctx, websocket.MessageBinary, b)
			wcancel()
			if err != nil {
				c.CloseNow()
				return
			}
		case <-ctx.Done():
			// The client left (or sent something the reader refused).
			c.CloseNow()
			return
		}
	}
}

// readKeys passes binary frames to the terminal and handles control
// messages, until the connection ends.
func (s *Server) readKeys(ctx context.Context, c *websocket.Conn, p *terminal.PTY) {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := p.Write(data); err != nil && !errors.Is(err, terminal.ErrClosed) {
				s.log.Debug("pty write", "err", err)
			}
			continue
		}
		var m message
		if err := json.Unmarshal(data, &m); err != nil {
			sendJSON(ctx, c, &message{Type: "error", Message: "control messages are JSON objects such as {\"type\":\"resize\",\"cols\":120,\"rows\":32}"})
			continue
		}
		switch m.Type {
		case "resize":
			if err := p.Resize(m.Cols, m.Rows); err != nil {
				sendJSON(ctx, c, &message{Type: "error", Message: err.Error()})
			}
		default:
			sendJSON(ctx, c, &message{Type: "error", Message: "unknown control message type " + quote(m.Type) + "; the client may send resize"})
		}
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
