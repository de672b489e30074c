package app

import (
	"context"

	"github.com/quro-dev/quro/internal/capability"
)

// registerOpenTerminal declares open_terminal: starting a session's
// interactive terminal is a call like any other, audited, whoever then
// attaches to it (quro term in-process; a client that types with
// send_input and reads with read_screen).
func (a *App) registerOpenTerminal(reg *capability.Registry) {
	reg.Register(capability.New("open_terminal",
		"Start the session's interactive terminal (PTY: a login shell on a pseudo-terminal) when none runs, and return its screen. "+
			"send_input types into it and read_screen reads it; quro term attaches a person's terminal to it. Needs scope exec.",
		capability.ScopeExec, func(ctx context.Context, in SessionRef) (*Screen, error) {
			s, err := entered(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := a.Terminals.PTY(s); err != nil {
				return nil, err
			}
			return a.screen(s), nil
		}).InSession(capability.UseBusy))
}
