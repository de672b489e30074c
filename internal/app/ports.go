package app

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/sandbox"
)

// ListPortsInput is list_ports's input.
type ListPortsInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
}

// SessionRef is the session the input names.
func (in ListPortsInput) SessionRef() string { return in.Session }

// Port is a TCP port a session's code listens on.
type Port struct {
	Port int    `json:"port"`
	Addr string `json:"addr" jsonschema:"the address it is bound to in the box: 0.0.0.0 or :: for every address, 127.0.0.1 or ::1 for loopback"`
}

// Ports is list_ports's output.
type Ports struct {
	Session   string `json:"session"`
	Ports     []Port `json:"ports"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"more ports listen than the answer holds (64)"`
}

// Text is the ports in one line: "3000 (0.0.0.0), 8888 (127.0.0.1)".
func (p *Ports) Text() string {
	if len(p.Ports) == 0 {
		return "no TCP port listens in the session"
	}
	s := make([]string, len(p.Ports))
	for i, o := range p.Ports {
		s[i] = fmt.Sprintf("%d (%s)", o.Port, o.Addr)
	}
	t := strings.Join(s, ", ")
	if p.Truncated {
		t += fmt.Sprintf(" (the first %d; more listen)", sandbox.MaxPorts)
	}
	return t
}

func (a *App) registerPorts(reg *capability.Registry) {
	reg.Register(capability.New("list_ports",
		"The TCP ports (IPv4 and IPv6) the session's code listens on in its box, each with the address it is bound to, "+
			"at most 64: what get_preview_url can open. Not for a session with network host.",
		capability.ScopeRead, a.listPorts).InSession(capability.UseRead))
}

func (a *App) listPorts(ctx context.Context, in ListPortsInput) (*Ports, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if c, _ := controller.CallerFrom(ctx); c.Session != "" && c.Session != s.ID {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session may list its own session's ports only")
	}
	if s.Network == sandbox.NetworkHost {
		return nil, capability.Errorf(capability.InvalidArgument,
			"session %s has network host: its ports are the host's, which the server does not list (use none or internet)", s.Name)
	}
	// The kernel's table of the box's own namespace, kept to the
	// session's own uid: the server's sockets there (egress, DNS) are
	// root's.
	ps, truncated, err := a.Sandbox.ListenPorts(s.ID, s.UID)
	if errors.Is(err, sandbox.ErrNoBoxNamespace) {
		return nil, capability.Errorf(capability.Unavailable, "%v", err)
	}
	if err != nil {
		return nil, err
	}
	out := &Ports{Session: s.ID, Ports: make([]Port, 0, len(ps)), Truncated: truncated}
	for _, p := range ps {
		out.Ports = append(out.Ports, Port{Port: p.Port, Addr: p.Addr.String()})
	}
	return out, nil
}
