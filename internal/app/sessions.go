package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
)

// TerminalExecInput is terminal_exec's input.
type TerminalExecInput struct {
	Command   string `json:"command" jsonschema:"shell command line(s) to run in the session's persistent shell"`
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds (default 30000); then SIGINT, and 1.2 s later the shell is recreated"`
	Split     bool   `json:"split,omitempty" jsonschema:"return stderr separately instead of merged into output"`
}

// SessionRef names a session.
type SessionRef struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
}

// SendInputInput is send_input's input.
type SendInputInput struct {
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Data      string `json:"data" jsonschema:"bytes to type: an answer with its newline (\"yes\\n\"); \"\\u0003\" interrupts"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"how long to wait for the command to finish or ask again (default 30000)"`
}

// CreateSessionInput is create_session's input.
type CreateSessionInput struct {
	Name      string            `json:"name,omitempty" jsonschema:"a name (letters, digits, . _ -); generated when omitted"`
	Rootfs    string            `json:"rootfs,omitempty" jsonschema:"run on this installed rootfs instead of the host userland"`
	Network   string            `json:"network,omitempty" jsonschema:"network policy: none (loopback only, the default unless the operator chose another), internet (public addresses through the server's egress), or host (the host's network, if the operator allows it); full is a deprecated name of internet"`
	AllowOut  []string          `json:"allow_out,omitempty" jsonschema:"with network internet: only these destinations (pypi.org, *.pythonhosted.org, github.com:443, 203.0.113.0/24)"`
	DenyOut   []string          `json:"deny_out,omitempty" jsonschema:"with network internet: never these (same forms; deny wins)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"the session's first environment variables (as set_session_env sets them)"`
	Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"labels to find the session by (list_sessions filters on them): at most 64 pairs, keys up to 128 bytes, values up to 1024"`
	TimeoutS  int64             `json:"timeout_s,omitempty" jsonschema:"lifetime in seconds from now: then the server destroys the session (or pauses it, on_timeout); 0 or omitted: no lifetime"`
	OnTimeout string            `json:"on_timeout,omitempty" jsonschema:"what happens when the lifetime ends: destroy (default) or pause"`
	Secrets   []SecretInput     `json:"secrets,omitempty" jsonschema:"secrets the session's code never sees (as set_session_secret sets them)"`
	// PublicPreviews makes every port of the session public (E2B's
	// allowPublicTraffic).
	PublicPreviews bool `json:"public_previews,omitempty" jsonschema:"every port of the session answers anyone on its preview host name (PORT-ID.DOMAIN) with no token, until get_preview_url's public false for a port or the session's end (the operator must allow it: quro serve --preview-public)"`
}

// SecretInput is one of create_session's secrets.
type SecretInput struct {
	Name  string   `json:"name" jsonschema:"the variable that holds the placeholder"`
	Value string   `json:"value" jsonschema:"the secret"`
	Hosts []string `json:"hosts" jsonschema:"where the value is sent in place of the placeholder: domains or *. wildcards"`
}

// SetTimeoutInput is set_session_timeout's input.
type SetTimeoutInput struct {
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutS  int64  `json:"timeout_s" jsonschema:"the session's lifetime in seconds from now (shorter or longer than before); 0 removes the lifetime"`
	OnTimeout string `json:"on_timeout,omitempty" jsonschema:"what happens when it ends: destroy or pause; omitted keeps the session's current choice (destroy by default)"`
}

// ListSessionsInput is list_sessions' input.
type ListSessionsInput struct {
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only the sessions whose metadata has every one of these pairs"`
	State    []string          `json:"state,omitempty" jsonschema:"only sessions in one of these states: running, paused"`
	Tenant   string            `json:"tenant,omitempty" jsonschema:"for the operator (an admin of the local tenant) only: another tenant's sessions, or every tenant's with \"*\"; each then says its tenant"`
}

// Session states (SessionInfo.State).
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// MaxSessionTimeout bounds a session's lifetime.
const MaxSessionTimeout = 366 * 24 * time.Hour

// lifetime is the end of a lifetime of timeoutS seconds from now (zero
// for 0), checked.
func lifetime(timeoutS int64) (time.Time, error) {
	switch {
	case timeoutS < 0:
		return time.Time{}, capability.Errorf(capability.InvalidArgument, "timeout_s is %d: give a lifetime in seconds (0: none)", timeoutS)
	case timeoutS == 0:
		return time.Time{}, nil
	case timeoutS > int64(MaxSessionTimeout/time.Second):
		return time.Time{}, capability.Errorf(capability.InvalidArgument, "timeout_s is %d: at most %d (366 days); 0 means no lifetime", timeoutS, int64(MaxSessionTimeout/time.Second))
	}
	// Milliseconds: what the store keeps, so that every answer agrees.
	return time.Now().Add(time.Duration(timeoutS) * time.Second).Truncate(time.Millisecond), nil
}

// createOptions checks in's settings, before anything is made.
func createOptions(in CreateSessionInput) (session.CreateOptions, error) {
	o := session.CreateOptions{Network: in.Network, Rootfs: in.Rootfs, Env: in.Env, Metadata: in.Metadata, OnExpiry: in.OnTimeout}
	changes := make(map[string]*string, len(in.Env))
	for k, v := range in.Env {
		changes[k] = &v
	}
	if err := checkEnvChanges(changes); err != nil {
		return o, err
	}
	if err := session.CheckMetadata(in.Metadata); err != nil {
		return o, err
	}
	switch in.OnTimeout {
	case "", session.ExpiryDestroy, session.ExpiryPause:
	default:
		return o, capability.Errorf(capability.InvalidArgument, "on_timeout %q: use destroy or pause", in.OnTimeout)
	}
	var err error
	o.ExpiresAt, err = lifetime(in.TimeoutS)
	return o, err
}

// SetEnvInput is set_session_env's input.
type SetEnvInput struct {
	Session string             `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Env     map[string]*string `json:"env" jsonschema:"variables to set; a null value unsets"`
}

// ExportLogInput is export_session_log's input.
type ExportLogInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path    string `json:"path,omitempty" jsonschema:"workspace-relative file to write; default .quro/logs/<time>.log"`
}

// SessionInfo describes a session.
type SessionInfo struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Default bool   `json:"default"`
	// Tenant is the session's owner, in the operator's listings across
	// tenants only ("" is the local tenant).
	Tenant     *string   `json:"tenant,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	Network    string    `json:"network"`
	Rootfs     string    `json:"rootfs,omitempty"`
	// Workspace is the workspace's host path, for the server's own use;
	// a caller reads Home.
	Workspace string `json:"-"`
	// Home is the workspace as every run of the session sees it.
	Home string `json:"workspace" jsonschema:"the session's workspace, /home/user: the working directory of its runs"`
	// State is running or paused (pause_session, or a lifetime that
	// ended with on_timeout pause).
	SessionState string            `json:"state"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	// ExpiresAt ends the session's lifetime (absent: none); OnTimeout is
	// what happens then.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	OnTimeout string     `json:"on_timeout,omitempty"`
	terminal.State
	// Resources are what the session's box uses now and its limits; nil
	// when nothing of the session runs.
	Resources *SessionResources `json:"resources,omitempty"`
	// NetworkRules hold an internet session to what they allow.
	NetworkRules *session.NetRules `json:"network_rules,omitempty"`
	// Secrets are the session's secrets: names, hosts and placeholders,
	// never a value.
	Secrets []SecretInfo `json:"secrets,omitempty"`
	// Note is what the caller should know of how its request was read
	// (a deprecated network name).
	Note string `json:"note,omitempty"`
}

// Text is one line about the session.
func (s *SessionInfo) Text() string {
	def := ""
	if s.Default {
		def = " (default)"
	}
	line := fmt.Sprintf("%s %s%s: %s alive=%v busy=%v mode=%s cwd=%s last_exit=%d network=%s",
		s.ID, s.Name, def, s.SessionState, s.Alive, s.Busy, s.Mode, s.Cwd, s.LastExit, s.Network)
	if s.Tenant != nil {
		line += fmt.Sprintf(" tenant=%q", *s.Tenant)
	}
	if r := s.NetworkRules; r != nil {
		if len(r.Allow) > 0 {
			line += " allow_out=" + strings.Join(r.Allow, ",")
		}
		if len(r.Deny) > 0 {
			line += " deny_out=" + strings.Join(r.Deny, ",")
		}
	}
	for _, sec := range s.Secrets {
		line += " secret=" + sec.Name + "->" + strings.Join(sec.Hosts, ",")
	}
	if s.ExpiresAt != nil {
		line += fmt.Sprintf(" expires=%s (then %s)", s.ExpiresAt.UTC().Format(time.RFC3339), s.OnTimeout)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Metadata)) {
		line += fmt.Sprintf(" %s=%q", k, s.Metadata[k])
	}
	if s.Note != "" {
		line += "\nnote: " + s.Note
	}
	return line
}

// SessionID is the session's id (the WebSocket terminal route finds the
// session through get_session_status, as its caller).
func (s *SessionInfo) SessionID() string { return s.ID }

// SessionList is list_sessions' output.
type SessionList struct {
	Sessions []*SessionInfo `json:"sessions"`
}

// Text lists one session per line.
func (l *SessionList) Text() string {
	var b strings.Builder
	for _, s := range l.Sessions {
		b.WriteString(s.Text() + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// EnvOutput is the session's variables.
type EnvOutput struct {
	Session string            `json:"session"`
	Env     map[string]string `json:"env"`
}

// Text lists K=V lines.
func (e *EnvOutput) Text() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		fmt.Fprintf(&b, "%s=%s\n", k, e.Env[k])
	}
	if b.Len() == 0 {
		return "(no session variables)"
	}
	return strings.TrimRight(b.String(), "\n")
}

// Done is the output of capabilities that only act.
type Done struct {
	Message string `json:"message"`
}

// Text is the message.
func (d *Done) Text() string { return d.Message }

// Screen is read_screen's output.
type Screen struct {
	Session string `json:"session"`
	Cols    int    `json:"cols"`
	Rows    int    `json:"rows"`
	Text_   string `json:"screen" jsonschema:"the visible screen, one line per row"`
	Open    bool   `json:"open" jsonschema:"an interactive terminal runs; false: none is open and the screen is empty"`
}

// Text is the screen.
func (s *Screen) Text() string {
	if !s.Open {
		return "(no interactive terminal is open in this session, so its screen is empty; terminal_exec runs commands without one)"
	}
	return s.Text_
}

func (a *App) registerSessions(reg *capability.Registry) {
	reg.Register(capability.New("terminal_exec",
		"Run a command line in the session's persistent shell (bash) and get {output, exit_code, cwd}. "+
			"The shell keeps its directory, variables and functions between calls, like a terminal. Exit code and cwd come from the shell itself, never from the output. "+
			"Calls on one session run in turn, in the order sent. "+
			"A command that waits for input returns early with waiting_for_input=true: answer with send_input. "+
			"On timeout the command gets SIGINT; if it is still running 1.2 s later the shell is killed and recreated in the same directory (interrupt_stage says which). "+
			"Output (stdout and stderr merged in order) is cut to head and tail when long; output_file keeps it whole.",
		capability.ScopeExec, a.terminalExec).Streaming().InSession(capability.UseBusy))
	reg.Register(capability.New("send_input",
		"Type data into the session: it answers a command that waits for input (then waits for that command like terminal_exec), "+
			"or, with no command running, goes to the session's interactive terminal (PTY). \"\\u0003\" interrupts the running command.",
		capability.ScopeExec, a.sendInput).InSession(capability.UseBusy))
	reg.Register(capability.New("create_session",
		"Create a session: a fresh workspace directory with its own shell, Python state and variables. Returns its id. "+
			"Optionally with its first environment variables, metadata labels (to find it by in list_sessions) and a lifetime "+
			"(timeout_s: the server destroys it, or pauses it with on_timeout pause, when the time is up; set_session_timeout changes it).",
		capability.ScopeExec, a.createSession))
	reg.Register(capability.New("destroy_session",
		"Destroy one of your sessions: kill every process it started and delete its workspace. This cannot be undone.",
		capability.ScopeExec, a.destroySessionCap).InSession(capability.UseRead))
	reg.Register(capability.New("get_session_status",
		"A session's status: state (running/paused), alive, busy, cwd, last_exit, mode (pipe/pty), created, last_used, network, metadata, expires_at (the end of its lifetime, if it has one) and its box's resources.",
		capability.ScopeRead, a.getSessionStatus).InSession(capability.UseRead))
	reg.Register(capability.New("list_sessions",
		"List your sessions (only your tenant's), oldest first, each with its status: id, name, default or not, state (running/paused), network policy, rootfs, metadata, "+
			"end of lifetime, shell alive or busy, mode, working directory and last exit code. "+
			"Filter by metadata (every given pair must match) and by state.",
		capability.ScopeRead, a.listSessions))
	reg.Register(capability.New("set_session_timeout",
		"Set a session's lifetime: timeout_s seconds from now (shorter or longer than before; 0 removes it). When it ends the server destroys the session, "+
			"or pauses it with on_timeout pause (a paused session resumes when used). Code in a session cannot change its own lifetime.",
		capability.ScopeExec, a.setSessionTimeout).InSession(capability.UseRead))
	reg.Register(capability.New("set_default_session",
		"Make a session the default: the one used when a call names none.",
		capability.ScopeExec, a.setDefaultSession).InSession(capability.UseRead))
	reg.Register(capability.New("set_session_env",
		"Set (or, with null, unset) environment variables of a session; they apply from the next command on, in the shell and in run_code. "+
			"Names are identifiers (letters, digits, _); those the dynamic loader, libc or a shell obey at start-up "+
			"(LD_*, MALLOC_*, GLIBC_TUNABLES, GCONV_PATH, LOCPATH, NLSPATH, HOSTALIASES, RES_OPTIONS, LOCALDOMAIN, BASH_ENV, ENV, SHELLOPTS…) "+
			"and TMPDIR (set by the server) are refused.",
		capability.ScopeExec, a.setSessionEnv).InSession(capability.UseHold))
	reg.Register(capability.New("get_session_env",
		"The environment variables set on a session with set_session_env.",
		capability.ScopeRead, a.getSessionEnv).InSession(capability.UseRead))
	reg.Register(capability.New("export_session_log",
		"Write the session's terminal scrollback to a file in its workspace, with control characters escaped; returns the file's path.",
		capability.ScopeExec, a.exportSessionLog).InSession(capability.UseHold))
	reg.Register(capability.New("reset_python",
		"Forget a session's Python state (variables, imports) by giving it a fresh interpreter; files in the workspace stay.",
		capability.ScopeExec, a.resetPythonCap).InSession(capability.UseHold))
	reg.Register(capability.New("read_screen",
		"The text on the session's interactive terminal (PTY) screen, as a person would see it. A caller with exec scope starts the terminal "+
			"if none runs; read scope starts nothing (with no terminal open, the screen is empty and open is false).",
		capability.ScopeRead, a.readScreen).InSession(capability.UseHold))
}

func (a *App) createSession(ctx context.Context, in CreateSessionInput) (*SessionInfo, error) {
	if in.Network == "" && len(in.AllowOut)+len(in.DenyOut) > 0 {
		in.Network = sandbox.NetworkInternet // rules are the egress's
	}
	network, note, err := a.networkPolicy(ctx, session.TenantFrom(ctx), in.Network)
	if err != nil {
		return nil, err
	}
	if in.PublicPreviews {
		if err := a.checkPublic(ctx); err != nil {
			return nil, err
		}
		if network == sandbox.NetworkHost {
			return nil, capability.Errorf(capability.InvalidArgument,
				"network host: the session's ports are the host's, which the server does not proxy (public_previews needs none or internet)")
		}
	}
	rules, err := netRules(network, in.AllowOut, in.DenyOut)
	if err != nil {
		return nil, err
	}
	in.Network = network
	o, err := createOptions(in)
	if err != nil {
		return nil, err
	}
	o.NetRules = rules
	secrets, err := checkCreateSecrets(in.Secrets)
	if err != nil {
		return nil, err
	}
	info := func(s *session.Session) *SessionInfo {
		i := a.sessionInfo(ctx, s)
		i.Note = note
		return i
	}
	if in.Rootfs != "" {
		if err := a.checkRootfsReady(in.Rootfs); err != nil {
			return nil, err
		}
	}
	// A tenant at its memory or process ceiling is refused now, with the
	// ceiling named, rather than given a session whose box would stall.
	if err := a.admitSession(ctx); err != nil {
		return nil, err
	}
	// A spare session of the same template, with its box and
	// Python worker ready, if there is one (spare.go); spares have no
	// rules, and their processes started without secrets.
	var s *session.Session
	if rules == nil && len(secrets) == 0 {
		if s, err = a.spares.claim(ctx, in, o); err != nil {
			return nil, err
		}
	}
	if s != nil {
		if in.PublicPreviews {
			a.setPublic(s.ID, 0, true)
		}
		a.lifetimeChanged(s.ExpiresAt)
		return info(s), nil
	}
	s, err = a.Sessions.CreateWith(ctx, in.Name, o)
	if err != nil {
		return nil, err
	}
	for _, sec := range secrets {
		if err := a.secrets.set(ctx, s.ID, sec.Name, sec.Value, sec.Hosts); err != nil {
			// All or nothing: no session is left without the secrets asked for.
			if derr := a.destroySession(context.WithoutCancel(ctx), s); derr != nil {
				a.Log.Warn("a session whose secrets failed was not destroyed", "session", s.ID, "err", derr)
			}
			return nil, err
		}
	}
	if in.PublicPreviews {
		a.setPublic(s.ID, 0, true)
	}
	a.lifetimeChanged(s.ExpiresAt)
	if a.prestart {
		a.Python.Prestart(s)
		a.PythonRootfs.Prestart(s)
	}
	return info(s), nil
}

func (a *App) destroySessionCap(ctx context.Context, in SessionRef) (*Done, error) {
	if in.Session == "" {
		return nil, capability.Errorf(capability.InvalidArgument, "name the session to destroy")
	}
	// Exec scope may destroy what it could create: its tenant's
	// sessions (Get finds no other). Code in a session can neither
	// create nor destroy one, not even its own.
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session cannot destroy sessions")
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.destroySession(ctx, s); err != nil {
		return nil, err
	}
	return &Done{Message: fmt.Sprintf("session %s (%s) destroyed", s.Name, s.ID)}, nil
}

func (a *App) getSessionStatus(ctx context.Context, in SessionRef) (*SessionInfo, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	return a.sessionInfo(ctx, s), nil
}

func (a *App) listSessions(ctx context.Context, in ListSessionsInput) (*SessionList, error) {
	for _, st := range in.State {
		if st != StateRunning && st != StatePaused {
			return nil, capability.Errorf(capability.InvalidArgument, "state %q: use running or paused", st)
		}
	}
	var (
		list  []*session.Session
		err   error
		cross bool // the operator's view of other tenants: each says its tenant
	)
	c, _ := controller.CallerFrom(ctx)
	switch {
	case in.Tenant == "" || in.Tenant == c.Tenant && !operator(c):
		list, err = a.Sessions.List(ctx)
	case !operator(c):
		return nil, capability.Errorf(capability.PermissionDenied,
			"listing another tenant's sessions is for the operator (an admin of the local tenant); leave tenant empty for your own")
	case in.Tenant == "*":
		cross = true
		list, err = a.Sessions.ListEvery(ctx)
	default:
		if !session.ValidTenant(in.Tenant) {
			return nil, capability.Errorf(capability.InvalidArgument, "tenant %q is not a tenant name", in.Tenant)
		}
		cross = true
		list, err = a.Sessions.List(session.WithTenant(ctx, in.Tenant))
	}
	if err != nil {
		return nil, err
	}
	out := &SessionList{Sessions: []*SessionInfo{}}
	for _, s := range list {
		if !metadataMatches(s.Metadata, in.Metadata) {
			continue
		}
		info := a.sessionInfo(session.WithTenant(ctx, s.Tenant), s)
		if cross {
			info.Tenant = &s.Tenant
		}
		if len(in.State) > 0 && !slices.Contains(in.State, info.SessionState) {
			continue
		}
		out.Sessions = append(out.Sessions, info)
	}
	return out, nil
}

func (a *App) setSessionTimeout(ctx context.Context, in SetTimeoutInput) (*SessionInfo, error) {
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return nil, capability.Errorf(capability.PermissionDenied, "code in a session cannot change a session's lifetime")
	}
	switch in.OnTimeout {
	case "", session.ExpiryDestroy, session.ExpiryPause:
	default:
		return nil, capability.Errorf(capability.InvalidArgument, "on_timeout %q: use destroy or pause", in.OnTimeout)
	}
	end, err := lifetime(in.TimeoutS)
	if err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	// Its destroy under way (a lifetime that ended, a kill): a new
	// lifetime would be reported set on a session about to go.
	if a.lives.Destroying(s.ID) {
		return nil, capability.Errorf(capability.NotFound, "session %s is being destroyed", s.Name)
	}
	if err := a.Sessions.SetLifetime(ctx, s, end, in.OnTimeout); err != nil {
		return nil, err
	}
	a.lifetimeChanged(end)
	return a.sessionInfo(ctx, s), nil
}

func (a *App) setDefaultSession(ctx context.Context, in SessionRef) (*SessionInfo, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.Sessions.SetDefault(ctx, s); err != nil {
		return nil, err
	}
	return a.sessionInfo(ctx, s), nil
}

func (a *App) setSessionEnv(ctx context.Context, in SetEnvInput) (*EnvOutput, error) {
	if err := checkEnvChanges(in.Env); err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	env, err := a.Sessions.UpdateEnv(ctx, s, in.Env)
	if err != nil {
		return nil, err
	}
	return &EnvOutput{Session: s.ID, Env: env}, nil
}

func (a *App) getSessionEnv(ctx context.Context, in SessionRef) (*EnvOutput, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	env, err := a.Sessions.Env(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	return &EnvOutput{Session: s.ID, Env: env}, nil
}

func (a *App) exportSessionLog(ctx context.Context, in ExportLogInput) (*Done, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	// A path outside the workspace, or one that cannot be
	// written, is a terminal.ErrInvalid: the caller's to fix.
	rel, err := a.Terminals.ExportLog(s, in.Path)
	if err != nil {
		return nil, err
	}
	return &Done{Message: rel}, nil
}

func (a *App) resetPythonCap(ctx context.Context, in SessionRef) (*Done, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.resetPython(ctx, s); err != nil {
		return nil, err
	}
	return &Done{Message: "the Python state of session " + s.Name + " was reset"}, nil
}

func (a *App) readScreen(ctx context.Context, in SessionRef) (*Screen, error) {
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if _, running := a.Terminals.RunningPTY(s); !running {
		if c, ok := controller.CallerFrom(ctx); !ok || c.Scope.Covers(capability.ScopeExec) {
			if _, err := a.Terminals.PTY(s); err != nil {
				return nil, err
			}
		}
	}
	return a.screen(s), nil
}

// checkEnvChanges refuses, before anything is stored, a variable the
// sandbox would not let a session set (sandbox.CheckEnvName). Unsetting
// one (null) is allowed, so a variable stored before a name was refused
// can be removed.
func checkEnvChanges(changes map[string]*string) error {
	for _, k := range slices.Sorted(maps.Keys(changes)) {
		err := sandbox.CheckEnvName(k)
		if err != nil && (changes[k] != nil || !sandbox.ValidEnvName(k)) {
			return capability.Errorf(capability.InvalidArgument, "%v; nothing was changed", err)
		}
	}
	return nil
}

// metadataMatches reports whether md has every pair of want.
func metadataMatches(md, want map[string]string) bool {
	for k, v := range want {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (a *App) sessionInfo(ctx context.Context, s *session.Session) *SessionInfo {
	info := &SessionInfo{
		ID: s.ID, Name: s.Name, Default: a.Sessions.IsDefault(ctx, s), CreatedAt: s.CreatedAt, LastUsedAt: s.LastUsedAt,
		Network: s.Network, NetworkRules: s.NetRules, Rootfs: s.Rootfs, Workspace: s.Workspace(), Home: sandbox.HomeUser, State: a.Terminals.State(s),
		Resources: a.resources(s), Metadata: s.Metadata, Secrets: a.secrets.infos(s.ID),
	}
	info.SessionState = StateRunning
	if bx := a.Sandbox.Box(s.ID); s.Paused || bx != nil && bx.Paused() {
		info.SessionState = StatePaused
	}
	if !s.ExpiresAt.IsZero() {
		t := s.ExpiresAt.UTC()
		info.ExpiresAt = &t
		info.OnTimeout = session.ExpiryDestroy
		if s.OnExpiry == session.ExpiryPause {
			info.OnTimeout = session.ExpiryPause
		}
	}
	return info
}

// destroySession ends s for good through its Life (session.Life.Destroy):
// the calls in it are canceled and waited for, everything made for it is
// released, and its row, files and uid go.
func (a *App) destroySession(ctx context.Context, s *session.Session) error {
	_, err := a.lives.Destroy(ctx, s)
	return err
}

func (a *App) terminalExec(ctx context.Context, in TerminalExecInput) (*terminal.Result, error) {
	timeout, err := runcode.MillisTimeout(in.TimeoutMS, 0, a.Runner.Options().MaxTimeout)
	if err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	return a.Terminals.Exec(ctx, s, in.Command, terminal.ExecOptions{
		Timeout: timeout, Split: in.Split,
	})
}

func (a *App) sendInput(ctx context.Context, in SendInputInput) (*terminal.Result, error) {
	if in.Data == "" {
		return nil, capability.Errorf(capability.InvalidArgument, "data is empty")
	}
	timeout, err := runcode.MillisTimeout(in.TimeoutMS, 0, a.Runner.Options().MaxTimeout)
	if err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.Terminals.CheckHold(ctx, s); err != nil {
		return nil, err
	}
	// Like any call that runs something: a paused box is resumed (the
	// command answering needs to run), and a destroy waits for this call.
	sh, err := a.Terminals.Shell(s)
	if err != nil {
		return nil, err
	}
	err = sh.SendInput(in.Data)
	if errors.Is(err, terminal.ErrNotRunning) {
		if p, ok := a.Terminals.RunningPTY(s); ok {
			if _, err := p.Write([]byte(in.Data)); err != nil {
				return nil, err
			}
			return &terminal.Result{Output: "(sent to the interactive terminal; read_screen shows it)", ExitCode: -1, Running: true, Cwd: hostpath.InHome(s.Workspace(), s.Cwd)}, nil
		}
		return nil, capability.Errorf(capability.InvalidArgument,
			"nothing in session %s is waiting for input: no command is running and no interactive terminal is open", s.Name)
	}
	if err != nil {
		return nil, err
	}
	return sh.Wait(ctx, timeout)
}
