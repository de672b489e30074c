package app

import (
	"context"

	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// OpenPTY returns the interactive terminal (PTY) of session id, starting
// it when none runs. It checks nothing about the caller: an access path
// authorizes through the controller first — the WebSocket calls
// get_session_status as the caller and passes the id it returned.
func (a *App) OpenPTY(ctx context.Context, id string) (*terminal.PTY, error) {
	s, err := a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil {
		return nil, err
	}
	return a.Terminals.PTY(s)
}

// TakeShell gives session id's shell to a person under hold key key (the
// web UI's Take over, GET /v1/events): until HandBackShell, only calls
// made under key (terminal.WithHolder) run commands or type input in it.
// Like OpenPTY it checks nothing about the caller: the WebSocket has
// found the session through the controller as the caller.
func (a *App) TakeShell(ctx context.Context, id, key string) error {
	s, err := a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil {
		return err
	}
	return a.Terminals.Take(s, key)
}

// HandBackShell ends the hold key has on session id's shell.
func (a *App) HandBackShell(ctx context.Context, id, key string) {
	if s, err := a.Sessions.ByIDAnyTenant(ctx, id); err == nil {
		a.Terminals.HandBack(s, key)
	}
}

// screen is read_screen's answer: the running PTY's screen, or an empty
// screen of the default size when none runs. A read starts nothing.
func (a *App) screen(s *session.Session) *Screen {
	p, ok := a.Terminals.RunningPTY(s)
	if !ok {
		return &Screen{Session: s.ID, Cols: terminal.DefaultCols, Rows: terminal.DefaultRows}
	}
	cols, rows := p.Size()
	return &Screen{Session: s.ID, Cols: cols, Rows: rows, Text_: p.Screen(), Open: true}
}
