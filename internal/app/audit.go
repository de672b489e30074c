package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/audit"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/session"
)

// AuditInput is get_audit_log's input.
type AuditInput struct {
	Limit      int    `json:"limit,omitempty" jsonschema:"how many of the latest entries (default 50, at most 1000)"`
	Capability string `json:"capability,omitempty" jsonschema:"only calls of this capability"`
	Since      string `json:"since,omitempty" jsonschema:"only calls at or after this time: RFC 3339 (2026-01-02T15:04:05Z) or a duration back from now (90s, 15m, 2h)"`
	Outcome    string `json:"outcome,omitempty" jsonschema:"only calls with this outcome: ok, failed (anything but ok), or one outcome (timeout, canceled, an error code such as not_found)"`
	Session    string `json:"session,omitempty" jsonschema:"only calls on this session, one of yours (id or name)"`
	Background bool   `json:"include_background,omitempty" jsonschema:"also the background reads a client made by itself (a web page refreshing what it shows); left out by default"`
}

// AuditLog is get_audit_log's output.
type AuditLog struct {
	Entries []audit.Entry `json:"entries" jsonschema:"oldest first"`
}

// Text lists the entries one per line.
func (l *AuditLog) Text() string {
	if len(l.Entries) == 0 {
		return "no audit entries match"
	}
	var b strings.Builder
	for _, e := range l.Entries {
		fmt.Fprintf(&b, "#%d %s %s %s %s %.1fms", e.Seq, e.Time.Format(time.RFC3339), e.Path, e.Capability, e.Outcome, e.DurationMS)
		if e.Args != "" {
			b.WriteString(" " + e.Args)
		}
		if e.Message != "" {
			b.WriteString(" — " + e.Message)
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func (a *App) registerAudit(reg *capability.Registry) {
	reg.Register(capability.New("get_audit_log",
		"Read the audit log of your tenant: every capability call through any access path (REST, MCP, WebSocket, CLI), "+
			"latest entries last, with time, access path, token id, capability, a summary of the arguments (code and commands as their first line; "+
			"environment variables by name; file contents, environment values and secrets only as their size), "+
			"outcome (ok; timeout or canceled for a run that was stopped; or an error code) and duration. "+
			"Filters: limit (default 50, at most 1000), capability, since (RFC 3339 time or a duration such as 15m), outcome (ok, failed or one outcome), session. "+
			"Each entry names the session the call acted on. Reads a client made by itself (a web page's refreshes) are marked background and left out unless include_background.",
		capability.ScopeRead, func(ctx context.Context, in AuditInput) (*AuditLog, error) {
			q := audit.Query{Tenant: session.TenantFrom(ctx), Capability: in.Capability, Limit: in.Limit, Outcome: in.Outcome, Background: in.Background}
			if len(in.Outcome) > 64 {
				return nil, capability.Errorf(capability.InvalidArgument, "outcome is %d bytes: give ok, failed or one outcome", len(in.Outcome))
			}
			if in.Session != "" {
				// One of the caller's live sessions, by id or name (another
				// tenant's is not found, as everywhere).
				s, err := a.Sessions.Get(ctx, in.Session)
				if err != nil {
					return nil, err
				}
				q.Session = s.ID
			}
			if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
				// Code in a session sees only its own calls back.
				q.TokenID = c.TokenID
			}
			if in.Limit < 0 || in.Limit > audit.MaxLimit {
				return nil, capability.Errorf(capability.InvalidArgument, "limit must be between 1 and %d", audit.MaxLimit)
			}
			if in.Since != "" {
				t, err := parseSince(in.Since, time.Now())
				if err != nil {
					return nil, err
				}
				q.Since = t
			}
			entries, err := a.auditLog.Entries(ctx, q)
			if err != nil {
				return nil, err
			}
			if entries == nil {
				entries = []audit.Entry{}
			}
			return &AuditLog{Entries: entries}, nil
		}))
}

// StoppedBy implements controller.Stopper: a python_run whose process
// tree was killed by its timeout or a cancel is audited as such, not ok.
func (r *PythonRunResult) StoppedBy() string {
	switch {
	case r.TimedOut:
		return controller.OutcomeTimeout
	case strings.HasPrefix(r.Note, "canceled"):
		return controller.OutcomeCanceled
	}
	return ""
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, capability.Errorf(capability.InvalidArgument,
		"since %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration (15m, 2h)", s)
}

// Audit capabilities of the operator's actions that are no capability
// call: a cluster node's drain (the operator's entry) and each session it
// moves or fails to move (an entry in the session's tenant's log).
const (
	AuditNodeDrain   = "node_drain"
	AuditSessionMove = "session_move"
)

// AuditAction records r, an action outside the capability registry
// (AuditNodeDrain, AuditSessionMove), in the audit log as a call's entry
// is recorded. Its arguments name nodes and sessions, never a host path.
func (a *App) AuditAction(ctx context.Context, r *controller.Record) {
	a.auditLog.Observe(ctx, r)
}
