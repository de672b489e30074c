package terminal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/recent"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	qws "github.com/quro-dev/quro/internal/workspace"
)

// ManagerOptions configure a Manager; nil or zero fields take the
// defaults.
type ManagerOptions struct {
	// Env returns a session's stored variables.
	Env func(id string) map[string]string
	// OnCwd records a session's new working directory.
	OnCwd func(id, cwd string)
	// Grace before a hard interrupt (DefaultGrace).
	Grace time.Duration
	// MaxOutput and SpillLimit as in ShellOptions.
	MaxOutput  int
	SpillLimit int64
	// Scrollback bytes kept per session for log export (1 MiB).
	Scrollback int
	// IdleStop stops a shell unused this long (30 min); it restarts on use.
	IdleStop time.Duration
	// Rootfs resolves a session's rootfs name to its directory (nil:
	// sessions on a rootfs cannot have terminals).
	Rootfs func(name string) (string, error)
}

// Manager owns the live terminals of every session: its pipe shell and its
// PTY. Safe for concurrent use.
type Manager struct {
	sb   *sandbox.Sandbox
	opts ManagerOptions

	mu     sync.Mutex
	live   map[string]*live
	closed bool
	// ended are the sessions CloseSession closed: a call racing with
	// their destroy must not give them new terminals.
	ended recent.Set
	// holds are the shells a person has taken over (hold.go), by session.
	holds map[string]hold
}

type live struct {
	sess   *session.Session
	shell  *Shell
	scroll *Ring
	pty    *PTY
}

// NewManager returns a Manager whose terminals run in sb.
func NewManager(sb *sandbox.Sandbox, o *ManagerOptions) *Manager {
	var opts ManagerOptions
	if o != nil {
		opts = *o
	}
	if opts.Scrollback <= 0 {
		opts.Scrollback = 1 << 20
	}
	if opts.IdleStop <= 0 {
		opts.IdleStop = 30 * time.Minute
	}
	if opts.Env == nil {
		opts.Env = func(string) map[string]string { return nil }
	}
	return &Manager{sb: sb, opts: opts, live: map[string]*live{}, holds: map[string]hold{}}
}

func (m *Manager) get(s *session.Session) (*live, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if m.ended.Has(s.ID) {
		return nil, fmt.Errorf("%w: session %s was destroyed", ErrClosed, s.Name)
	}
	l := m.live[s.ID]
	if l == nil {
		l = &live{sess: s, scroll: NewRing(m.opts.Scrollback)}
		m.live[s.ID] = l
	}
	if l.shell != nil && l.shell.State() >= StateClosing {
		l.shell = nil // stopped as idle: a fresh one, in the stored cwd
	}
	if l.shell == nil {
		rootfs, err := m.rootfsDir(s)
		if err != nil {
			return nil, err
		}
		id := s.ID
		cwd := s.Cwd
		if !filepath.IsAbs(cwd) {
			cwd = s.Workspace()
		}
		l.shell = NewShell(ShellOptions{
			Sandbox: s.Sandbox(m.sb), Workspace: s.Workspace(), TmpDir: s.TmpDir(), OutputsDir: s.OutputsDir(),
			Network: s.Network, Rootfs: rootfs,
			Cwd:   cwd,
			Env:   func() map[string]string { return m.opts.Env(id) },
			OnCwd: func(cwd string) { m.setCwd(id, cwd) },
			Grace: m.opts.Grace, MaxOutput: m.opts.MaxOutput, SpillLimit: m.opts.SpillLimit,
			Scrollback: l.scroll,
		})
	}
	return l, nil
}

// rootfsDir is the directory of s's rootfs, "" for the host userland.
func (m *Manager) rootfsDir(s *session.Session) (string, error) {
	if s.Rootfs == "" {
		return "", nil
	}
	if m.opts.Rootfs == nil {
		return "", fmt.Errorf("%w: the session runs on rootfs %q, which this server cannot give a terminal", ErrInvalid, s.Rootfs)
	}
	return m.opts.Rootfs(s.Rootfs)
}

func (m *Manager) setCwd(id, cwd string) {
	m.mu.Lock()
	if l := m.live[id]; l != nil {
		l.sess.Cwd = cwd
	}
	m.mu.Unlock()
	if m.opts.OnCwd != nil {
		m.opts.OnCwd(id, cwd)
	}
}

// Shell returns the session's pipe shell (not started until used).
func (m *Manager) Shell(s *session.Session) (*Shell, error) {
	l, err := m.get(s)
	if err != nil {
		return nil, err
	}
	return l.shell, nil
}

// Exec runs command in the session's shell.
func (m *Manager) Exec(ctx context.Context, s *session.Session, command string, opts ExecOptions) (*Result, error) {
	if err := m.CheckHold(ctx, s); err != nil {
		return nil, err
	}
	for {
		sh, err := m.Shell(s)
		if err != nil {
			return nil, err
		}
		res, err := sh.Exec(ctx, command, opts)
		if errors.Is(err, ErrClosed) && sh.State() == StateClosed && m.open(s) {
			// Stopped as idle between the lookup and the command: the
			// next lookup gives a fresh shell.
			continue
		}
		return res, err
	}
}

// open reports whether s may have terminals: neither s nor the manager
// was closed.
func (m *Manager) open(s *session.Session) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.closed && !m.ended.Has(s.ID)
}

// State is what the manager knows of a session's terminals.
type State struct {
	Alive    bool      `json:"alive" jsonschema:"a shell or PTY process is running"`
	Busy     bool      `json:"busy" jsonschema:"the shell is running a command"`
	Cwd      string    `json:"cwd" jsonschema:"the shell's working directory"`
	LastExit int       `json:"last_exit" jsonschema:"exit status of the last command"`
	Mode     string    `json:"mode" jsonschema:"pipe, pty, pipe+pty, or none when nothing runs"`
	LastUsed time.Time `json:"last_used,omitzero"`
	Restarts int       `json:"restarts"`
}

// State reports the session's terminals; a session with nothing running
// (for instance after a server restart) reports alive=false and its stored cwd.
func (m *Manager) State(s *session.Session) State {
	m.mu.Lock()
	l := m.live[s.ID]
	m.mu.Unlock()
	st := State{Cwd: hostpath.InHome(s.Workspace(), s.Cwd), Mode: "none"}
	if st.Cwd == "" {
		st.Cwd = sandbox.HomeUser
	}
	if l == nil {
		return st
	}
	var modes []string
	if l.shell != nil {
		ss := l.shell.Status()
		st.Busy, st.Cwd, st.LastExit, st.LastUsed, st.Restarts = ss.Busy, hostpath.InHome(s.Workspace(), ss.Cwd), ss.LastExit, ss.LastUsed, ss.Restarts
		if ss.Alive {
			st.Alive = true
			modes = append(modes, "pipe")
		}
	}
	if l.pty != nil && l.pty.Alive() {
		st.Alive = true
		modes = append(modes, "pty")
	}
	if len(modes) > 0 {
		st.Mode = strings.Join(modes, "+")
	}
	return st
}

// Live counts the running pipe shells and PTYs of every session.
func (m *Manager) Live() (shells, ptys int) {
	var sh []*Shell
	var pt []*PTY
	m.mu.Lock()
	for _, l := range m.live {
		if l.shell != nil {
			sh = append(sh, l.shell)
		}
		if l.pty != nil {
			pt = append(pt, l.pty)
		}
	}
	m.mu.Unlock()
	for _, s := range sh {
		if s.Status().Alive {
			shells++
		}
	}
	for _, p := range pt {
		if p.Alive() {
			ptys++
		}
	}
	return shells, ptys
}

// CloseSession stops the session's terminals and kills every process that
// still lives in its directory.
func (m *Manager) CloseSession(s *session.Session) int {
	m.mu.Lock()
	l := m.live[s.ID]
	delete(m.live, s.ID)
	delete(m.holds, s.ID)
	m.ended.Add(s.ID)
	m.mu.Unlock()
	if l != nil {
		if l.shell != nil {
			l.shell.Close()
		}
		if l.pty != nil {
			l.pty.Close()
		}
	}
	if m.sb.SessionBoxes() {
		// Everything of the session ran in its box, which the caller
		// closed; runs outside it (a spec the box could not hold) were
		// killed with their own cgroup when they ended.
		return 0
	}
	return sandbox.KillProcessesIn(s.Dir)
}

// ReopenSession undoes CloseSession for a session that lives on (its
// move to another node failed): its next call opens it a shell again.
func (m *Manager) ReopenSession(s *session.Session) {
	m.mu.Lock()
	m.ended.Delete(s.ID)
	m.mu.Unlock()
}

// Close stops every terminal.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	all := m.live
	m.live = map[string]*live{}
	m.mu.Unlock()
	for _, l := range all {
		if l.shell != nil {
			l.shell.Close()
		}
		if l.pty != nil {
			l.pty.Close()
		}
	}
}

// Patrol runs the supervisor until ctx ends: every interval it restarts the
// default session's shell if it died, stops shells idle past IdleStop, and
// kills processes left behind by sessions that no longer exist.
func (m *Manager) Patrol(ctx context.Context, every time.Duration, p PatrolHooks) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.PatrolOnce(ctx, p)
		}
	}
}

// PatrolHooks tell the supervisor about sessions.
type PatrolHooks struct {
	// Default returns the default session when there is one (an error
	// when none: the patrol makes no session).
	Default func(ctx context.Context) (*session.Session, error)
	// Exists reports whether a session id is still known.
	Exists func(ctx context.Context, id string) bool
	// SessionsDir is $QURO_DATA/sessions.
	SessionsDir string
	// Paused reports whether a session is paused: its idle shell is kept.
	Paused func(id string) bool
}

// PatrolReport says what one patrol did.
type PatrolReport struct {
	RestartedDefault bool
	StoppedIdle      int
	KilledOrphans    int
}

// PatrolOnce runs one round of the supervisor.
func (m *Manager) PatrolOnce(ctx context.Context, p PatrolHooks) PatrolReport {
	var rep PatrolReport
	if p.Default != nil {
		if def, err := p.Default(ctx); err == nil {
			m.mu.Lock()
			l := m.live[def.ID]
			m.mu.Unlock()
			if l != nil && l.shell != nil {
				if st := l.shell.Status(); !st.Alive && !st.Busy {
					if l.shell.Start() == nil {
						rep.RestartedDefault = true
					}
				}
			}
		}
	}
	cutoff := time.Now().Add(-m.opts.IdleStop)
	m.mu.Lock()
	var shells []*Shell
	for id, l := range m.live {
		if l.shell != nil && (p.Paused == nil || !p.Paused(id)) {
			shells = append(shells, l.shell)
		}
	}
	m.mu.Unlock()
	for _, sh := range shells {
		// The check and the close are one step in the shell: a command
		// that starts first keeps it.
		if sh.CloseIfIdle(cutoff) {
			rep.StoppedIdle++
			m.mu.Lock()
			for _, l := range m.live {
				if l.shell == sh {
					l.shell = nil // a fresh one starts, in the stored cwd, on next use
				}
			}
			m.mu.Unlock()
		}
	}
	if p.SessionsDir != "" && p.Exists != nil {
		entries, _ := os.ReadDir(p.SessionsDir)
		for _, e := range entries {
			if e.IsDir() && !p.Exists(ctx, e.Name()) {
				rep.KilledOrphans += sandbox.KillProcessesIn(filepath.Join(p.SessionsDir, e.Name()))
			}
		}
	}
	return rep
}

// ExportLog writes the session's scrollback to rel (inside the workspace;
// default .quro/logs/<time>.log) with control characters escaped, so that
// reading the log cannot drive the reader's terminal. It returns the
// workspace-relative path.
func (m *Manager) ExportLog(s *session.Session, rel string) (string, error) {
	m.mu.Lock()
	l := m.live[s.ID]
	m.mu.Unlock()
	var data []byte
	dropped := 0
	if l != nil {
		data = l.scroll.Bytes()
		dropped = l.scroll.Dropped()
		if l.pty != nil {
			data = append(data, l.pty.Scrollback()...)
		}
	}
	if rel == "" {
		rel = filepath.Join(".quro", "logs", time.Now().UTC().Format("20060102-150405")+".log")
	}
	path, err := WorkspacePath(s.Workspace(), rel)
	if err != nil {
		return "", err
	}
	// Write through os.Root: a symlink swapped in after the check above
	// still cannot lead the server out of the workspace.
	root, err := os.OpenRoot(s.Workspace())
	if err != nil {
		return "", err
	}
	defer root.Close()
	relPath, _ := filepath.Rel(s.Workspace(), path)
	if err := root.MkdirAll(filepath.Dir(relPath), 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var b strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&b, "[%d earlier bytes are not kept]\n", dropped)
	}
	b.WriteString(EscapeControl(data))
	tmp := relPath + ".tmp"
	if err := root.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := root.Rename(tmp, relPath); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return relPath, nil
}

// WorkspacePath resolves rel inside workspace, refusing absolute paths and
// any path that leaves it (through .. or a symlink).
func WorkspacePath(workspace, rel string) (string, error) {
	if filepath.IsAbs(rel) {
		return "", fmt.Errorf("%w: path %q must be relative to the workspace", ErrInvalid, rel)
	}
	if err := qws.CheckLength(rel); err != nil {
		return "", fmt.Errorf("%w: %s", ErrInvalid, strings.TrimSuffix(err.Error(), ": "+qws.ErrInvalid.Error()))
	}
	clean := filepath.Clean(rel)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("%w: path %q leaves the workspace", ErrInvalid, rel)
	}
	full := filepath.Join(workspace, clean)
	// The deepest existing ancestor must resolve inside the workspace.
	probe := full
	for {
		real, err := filepath.EvalSymlinks(probe)
		if err == nil {
			root, _ := filepath.EvalSymlinks(workspace)
			if !inside(real, root) {
				return "", fmt.Errorf("%w: path %q leads out of the workspace", ErrInvalid, rel)
			}
			break
		}
		if !errors.Is(err, os.ErrNotExist) || probe == workspace {
			return "", err
		}
		probe = filepath.Dir(probe)
	}
	return full, nil
}

// EscapeControl renders terminal output as inert text: \n and \t stay,
// other control characters and bytes that are not UTF-8 become \xNN.
func EscapeControl(p []byte) string {
	var b strings.Builder
	for len(p) > 0 {
		r, size := utf8.DecodeRune(p)
		switch {
		case r == utf8.RuneError && size == 1, r < 0x20 && r != '\n' && r != '\t', r == 0x7f, r >= 0x80 && r < 0xa0:
			for _, c := range p[:size] {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.Write(p[:size])
		}
		p = p[size:]
	}
	return b.String()
}

// PTY returns the session's PTY, starting it (again) when it is not running.
func (m *Manager) PTY(s *session.Session) (*PTY, error) {
	l, err := m.get(s)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.pty != nil && l.pty.Alive() {
		return l.pty, nil
	}
	cwd := l.sess.Cwd
	rootfs, err := m.rootfsDir(l.sess)
	if err != nil {
		return nil, err
	}
	p, err := StartPTY(PTYOptions{Sandbox: m.sb, Session: l.sess, Cwd: cwd, Env: m.opts.Env(s.ID), Rootfs: rootfs})
	if err != nil {
		return nil, err
	}
	l.pty = p
	return p, nil
}

// RunningPTY returns the session's PTY if one runs.
func (m *Manager) RunningPTY(s *session.Session) (*PTY, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.live[s.ID]; l != nil && l.pty != nil && l.pty.Alive() {
		return l.pty, true
	}
	return nil, false
}

// Watched reports whether someone is attached to the session's PTY.
func (m *Manager) Watched(s *session.Session) bool {
	p, ok := m.RunningPTY(s)
	return ok && p.Viewers() > 0
}
