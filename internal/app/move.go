package app

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/egress"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/workspace"
)

// A session's move between the nodes of a cluster (quro node drain,
// internal/cluster's Drainer): the Mover is this node's side of it. The
// move stream is one JSON line of the session's settings, then its
// workspace as a tar (workspace.WriteArchive); the node it goes to
// checks both as hostile (Import).

// MoveNote is the line the next call of a moved session starts with;
// MoveFailedNote that of a session whose move failed after its
// processes were stopped (it stays on its node, files untouched).
const (
	MoveNote       = "note: this session was moved to another node of the cluster; its files and settings are here, but its processes (shells, Python variables, running commands) were stopped by the move"
	MoveFailedNote = "note: a move of this session to another node of the cluster failed; it stays where it was with its files and settings untouched, but its processes (shells, Python variables, running commands) were stopped for the move"
)

// maxMoveSettings bounds the settings line of a move stream: a session's
// variables and metadata, and its secrets (MaxSecretsPerSession of
// MaxSecretValue bytes each, in base64, about 700 KiB at most).
const maxMoveSettings = 2 << 20

// moveSettings are a session's settings as a move carries them.
type moveSettings struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Tenant     string            `json:"tenant"`
	CreatedAt  time.Time         `json:"created_at"`
	LastUsedAt time.Time         `json:"last_used_at"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"` // relative to /home/user
	Network    string            `json:"network"`
	NetRules   *session.NetRules `json:"network_rules,omitempty"`
	Rootfs     string            `json:"rootfs,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	ExpiresAt  time.Time         `json:"expires_at,omitzero"`
	OnExpiry   string            `json:"on_expiry,omitempty"`
	// Secrets are the session's secrets with their values: in the move
	// stream only (never in the record, a log or an error), sealed again
	// with the receiving node's key. Each keeps its placeholder, which
	// the session's files may hold.
	Secrets []movedSecret `json:"secrets,omitempty"`
	// Public is which of its preview ports answer anyone.
	Public *movedPublic `json:"public_previews,omitempty"`
}

// movedSecret is one secret of a moved session.
type movedSecret struct {
	Name        string   `json:"name"`
	Value       []byte   `json:"value"` // base64 in the stream: no escaping grows it past maxMoveSettings
	Hosts       []string `json:"hosts"`
	Placeholder string   `json:"placeholder"`
}

// movedPublic is a moved session's public preview ports (publicSet).
type movedPublic struct {
	All    bool  `json:"all,omitempty"`
	Open   []int `json:"open,omitempty"`
	Closed []int `json:"closed,omitempty"`
}

// Mover is a's side of sessions' moves (cluster.Local).
type Mover struct{ a *App }

// Mover returns a's side of the cluster's session moves.
func (a *App) Mover() *Mover { return &Mover{a: a} }

// movedNotes are the sessions whose processes a move stopped (moved
// here, or left here by a move that failed) and whose next call has not
// yet been told so (Note), with what to tell it.
type movedNotes struct {
	mu  sync.Mutex
	ids map[string]string
	// public holds, from its Quiesce to its Release or Unquiesce, the
	// public ports of a session being moved: its quiesce ends them here
	// (they go with the session, publicPorts).
	public map[string]*movedPublic
}

// keepPublic holds session id's public ports (publicOf) for its move.
func (a *App) keepPublic(id string) {
	p := a.publicOf(id)
	a.moved.mu.Lock()
	defer a.moved.mu.Unlock()
	if a.moved.public == nil {
		a.moved.public = map[string]*movedPublic{}
	}
	a.moved.public[id] = p
}

// keptPublic is what keepPublic held of session id; with drop, no
// longer held.
func (a *App) keptPublic(id string, drop bool) *movedPublic {
	a.moved.mu.Lock()
	defer a.moved.mu.Unlock()
	p := a.moved.public[id]
	if drop {
		delete(a.moved.public, id)
	}
	return p
}

// applyPublic makes the ports p names public for session id.
func (a *App) applyPublic(id string, p *movedPublic) {
	if p == nil {
		return
	}
	if p.All {
		a.setPublic(id, 0, true)
	}
	for _, port := range p.Open {
		a.setPublic(id, port, true)
	}
	for _, port := range p.Closed {
		a.setPublic(id, port, false)
	}
}

// moveNote is the controller's Note: MoveNote or MoveFailedNote once for
// a session whose processes a move stopped.
func (a *App) moveNote(id string) string {
	a.moved.mu.Lock()
	defer a.moved.mu.Unlock()
	n := a.moved.ids[id]
	delete(a.moved.ids, id)
	return n
}

// setMoveNote makes note the next call's of session id.
func (a *App) setMoveNote(id, note string) {
	a.moved.mu.Lock()
	defer a.moved.mu.Unlock()
	if a.moved.ids == nil {
		a.moved.ids = map[string]string{}
	}
	a.moved.ids[id] = note
}

func (m *Mover) session(ctx context.Context, id string) (*session.Session, error) {
	s, err := m.a.Sessions.ByIDAnyTenant(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.Tenant == session.SpareTenant {
		return nil, capability.Errorf(capability.NotFound, "session %s is a spare", id)
	}
	return s, nil
}

// Quiesce stops session id for its move (session.Life.Quiesce).
func (m *Mover) Quiesce(ctx context.Context, id string) error {
	s, err := m.session(ctx, id)
	if err != nil {
		return err
	}
	m.a.keepPublic(s.ID)
	if late := m.a.lives.Quiesce(s); late > 0 {
		m.a.lives.Unquiesce(s)
		m.a.applyPublic(s.ID, m.a.keptPublic(s.ID, true))
		m.a.setMoveNote(s.ID, MoveFailedNote) // its box ended all the same
		return fmt.Errorf("session %s: %d calls still ran after the grace; it stays here", s.Name, late)
	}
	return nil
}

// Unquiesce makes session id usable here again after its move failed:
// its next call says that its processes were stopped (MoveFailedNote).
func (m *Mover) Unquiesce(id string) {
	if s, err := m.session(context.Background(), id); err == nil {
		m.a.lives.Unquiesce(s)
		m.a.applyPublic(s.ID, m.a.keptPublic(s.ID, true)) // its ports answer as before
		m.a.setMoveNote(s.ID, MoveFailedNote)
	}
}

// Release lets this node's copy of session id go after its move: the
// one teardown of a destroy (session.Life.Moved).
func (m *Mover) Release(ctx context.Context, id string) error {
	m.a.keptPublic(id, true)
	s, err := m.a.Sessions.ByIDAnyTenant(ctx, id)
	if errors.Is(err, session.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !m.a.lives.Moving(id) {
		m.a.lives.Quiesce(s) // a copy left by a crash: nothing may run in it as it goes
	}
	return m.a.lives.Moved(ctx, s)
}

// Export writes session id's move stream to w.
func (m *Mover) Export(ctx context.Context, id string, w io.Writer) error {
	s, err := m.session(ctx, id)
	if err != nil {
		return err
	}
	if err := m.a.tenants.disks.Remount(s.Dir); err != nil {
		return fmt.Errorf("session %s: mount its disk: %w", s.Name, err)
	}
	ms := moveSettings{ID: s.ID, Name: s.Name, Tenant: s.Tenant, CreatedAt: s.CreatedAt, LastUsedAt: s.LastUsedAt,
		Env: s.Env, Cwd: relCwd(s.Workspace(), s.Cwd), Network: s.Network, NetRules: s.NetRules, Rootfs: s.Rootfs,
		Metadata: s.Metadata, ExpiresAt: s.ExpiresAt, OnExpiry: s.OnExpiry, Public: m.a.keptPublic(s.ID, false)}
	// Read from the store, not the cache: a secret that cannot be opened
	// fails the move (the session stays here with it) rather than being
	// left behind.
	secs, err := m.a.secrets.load(ctx, s.ID)
	if err != nil {
		return fmt.Errorf("session %s: its secrets: %w", s.Name, err)
	}
	for _, sec := range secs {
		ps := movedSecret{Name: sec.Name, Value: []byte(sec.Value), Placeholder: sec.Placeholder, Hosts: []string{}}
		for _, r := range sec.Hosts {
			ps.Hosts = append(ps.Hosts, r.String())
		}
		ms.Secrets = append(ms.Secrets, ps)
	}
	b, err := json.Marshal(ms)
	if err != nil {
		return err
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return err
	}
	_, err = workspace.WriteArchive(ctx, w, s.Workspace())
	return err
}

// Import adopts session id of tenant, named name (as its record in the
// cluster says), from the move stream r sent by another node:
// its settings checked as a create checks them (session.Manager.Adopt),
// its workspace extracted as hostile (workspace.Extract) within the
// tenant's per-session disk quota, then given to the session's uid. A
// copy of id left here by an earlier move that did not end is replaced
// (the caller checked that the record names the sender). It returns the
// name it got here (its own, or suffixed when another session holds it)
// and the files and bytes made.
func (m *Mover) Import(ctx context.Context, id, tenant, name string, r io.Reader) (got string, files int, size int64, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	line, err := readLine(br, maxMoveSettings)
	if err != nil {
		return "", 0, 0, capability.Errorf(capability.InvalidArgument, "the move's settings line: %v", err)
	}
	var ms moveSettings
	if err := json.Unmarshal(line, &ms); err != nil {
		return "", 0, 0, capability.Errorf(capability.InvalidArgument, "the move's settings: %v", err)
	}
	if ms.ID != id {
		return "", 0, 0, capability.Errorf(capability.InvalidArgument, "the move's settings are of session %q, not %q", ms.ID, id)
	}
	if ms.Tenant != tenant || name != "" && ms.Name != name {
		return "", 0, 0, capability.Errorf(capability.PermissionDenied, "the move's settings name tenant %q and session name %q; the session's record says %q and %q", ms.Tenant, ms.Name, tenant, name)
	}
	if err := m.a.checkMoved(ctx, &ms); err != nil {
		return "", 0, 0, err
	}
	if old, err := m.a.Sessions.ByIDAnyTenant(ctx, id); err == nil {
		// An earlier move's copy: the sender still owns the session.
		if _, err := m.a.lives.Destroy(ctx, old); err != nil {
			return "", 0, 0, err
		}
		m.a.Sessions.WaitReleases() // its directory is gone before the new one is made
	}
	// Every ceiling a create is admitted against, whatever the sender's
	// probe was told (Admit: advice, given before the sender paused the
	// session); the workspace's size is counted as it is extracted.
	if err := m.a.admitMoved(ctx, ms.Tenant, -1); err != nil {
		return "", 0, 0, err
	}
	lim, err := m.a.tenants.Limits(ctx, ms.Tenant)
	if err != nil {
		return "", 0, 0, err
	}
	budget := max(lim.Disk, 0)
	var st *workspace.CopyStats
	ad := &session.Adopted{ID: ms.ID, Name: ms.Name, Tenant: ms.Tenant, CreatedAt: ms.CreatedAt, LastUsedAt: ms.LastUsedAt,
		Env: ms.Env, Network: ms.Network, NetRules: ms.NetRules, Rootfs: ms.Rootfs, Metadata: ms.Metadata,
		ExpiresAt: ms.ExpiresAt, OnExpiry: ms.OnExpiry}
	s, err := m.a.Sessions.Adopt(ctx, ad, func(s *session.Session) error {
		// A working directory inside the workspace is kept; any other
		// (a path only the sender's box knew) is dropped: the shell
		// starts in /home/user.
		if ms.Cwd != "" && filepath.IsLocal(ms.Cwd) {
			ad.Cwd = filepath.Join(s.Workspace(), ms.Cwd)
		}
		var err error
		st, err = workspace.Extract(ctx, br, s.Workspace(), workspace.ExtractOptions{Budget: budget})
		switch {
		case errors.Is(err, workspace.ErrBudget):
			return capability.Errorf(capability.ResourceExhausted, "the moved workspace is larger than the session's disk quota (%s): %v", quota.Human(budget), err)
		case errors.Is(err, workspace.ErrUnsafeArchive), errors.Is(err, workspace.ErrTooMany), errors.Is(err, workspace.ErrTooDeep):
			return capability.Errorf(capability.InvalidArgument, "the moved workspace: %v", err)
		}
		return err
	})
	if err != nil {
		return "", 0, 0, err
	}
	if os.Geteuid() == 0 {
		// The files are the session's, as a fork's are (its uid is
		// the store's, given when Adopt stored the row).
		if err := chownTree(s.Workspace(), s.UID); err != nil {
			_, _ = m.a.lives.Destroy(context.WithoutCancel(ctx), s) // clean-up of an import that failed: its error is the one to report
			return "", 0, 0, fmt.Errorf("session %s: give its files to its uid: %w", s.Name, err)
		}
	}
	for _, sec := range ms.Secrets {
		if err := m.a.secrets.setAs(ctx, s.ID, sec.Name, string(sec.Value), sec.Hosts, sec.Placeholder); err != nil {
			// All or nothing, as a create with secrets: the sender keeps it.
			_, _ = m.a.lives.Destroy(context.WithoutCancel(ctx), s)
			return "", 0, 0, fmt.Errorf("session %s: store secret %s: %w", s.Name, sec.Name, err)
		}
	}
	if m.a.network.PreviewPublic {
		// Public only where this node's operator allows it too
		// (checkPublic); else its ports are private here.
		m.a.applyPublic(s.ID, ms.Public)
	}
	m.a.setMoveNote(s.ID, MoveNote)
	return s.Name, st.Files, st.Bytes, nil
}

// Admit reports whether this node would take a moved session of tenant
// whose workspace holds size bytes (admitMoved): the sender asks before
// it pauses the session, so a refusal costs its user no pause. Advice
// only: Import admits the session again.
func (m *Mover) Admit(ctx context.Context, tenant string, size int64) error {
	return m.a.admitMoved(ctx, tenant, size)
}

// admitMoved admits a moved session of tenant, whose workspace holds
// size bytes (< 0: not known yet, counted as it is extracted), against
// every ceiling a create is admitted against: the tenant's and the
// server's session ceilings (session.Manager.Admit), the tenant's memory
// and process ceilings (admitSessionOf), a place for its session disk
// (diskRoom); and its files against the tenant's disk quota per session.
// Each refusal for room is resource_exhausted (HTTP 429), naming the
// ceiling.
func (a *App) admitMoved(ctx context.Context, tenant string, size int64) error {
	if !session.ValidTenant(tenant) || tenant == session.SpareTenant {
		return capability.Errorf(capability.InvalidArgument, "a moved session's tenant %q is not a tenant's name", tenant)
	}
	if err := a.Sessions.Admit(ctx, tenant); err != nil {
		return err
	}
	if err := a.admitSessionOf(ctx, tenant); err != nil {
		return err
	}
	lim, err := a.tenants.Limits(ctx, tenant)
	if err != nil {
		return err
	}
	if err := a.tenants.diskRoom(tenant, lim.Disk); err != nil {
		return err
	}
	if lim.Disk > 0 && size > lim.Disk {
		return capability.Errorf(capability.ResourceExhausted, "the session's files (%s) are larger than the disk quota here of the sessions of %s (%s)",
			quota.Human(size), sandbox.DisplayTenant(tenant), quota.Human(lim.Disk))
	}
	return nil
}

// Size is how many bytes the regular files of session id's workspace
// hold (what a move's Extract counts against the receiver's quota), for
// the receiver's admission probe.
func (m *Mover) Size(ctx context.Context, id string) (int64, error) {
	s, err := m.session(ctx, id)
	if err != nil {
		return 0, err
	}
	if err := m.a.tenants.disks.Remount(s.Dir); err != nil {
		return 0, fmt.Errorf("session %s: mount its disk: %w", s.Name, err)
	}
	// The box still runs (the size is asked before the pause): a file or
	// directory its code removes mid-walk is skipped, not a failure. It is
	// counted as the move's stream carries it and the receiver charges it.
	n, err := workspace.ArchiveSize(ctx, s.Workspace())
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		err = pe.Err // its path is the host's
	}
	if err != nil {
		return 0, fmt.Errorf("session %s: the size of its files: %w", s.Name, err)
	}
	return n, nil
}

// checkMoved checks the settings of a move stream as a create checks
// its input (createSession), before anything is made: the network policy
// within this node's and the tenant's ceilings, the egress rules,
// the variables' names, the metadata, the lifetime and its end action,
// the rootfs's name. The stream is hostile even when its signature is
// good (a node's key may be stolen; a node of another version may
// write what this one would not take). What passes is written back in
// the form a create stores (ms.Network, ms.NetRules). session.Adopt
// checks the same again, as the last word.
func (a *App) checkMoved(ctx context.Context, ms *moveSettings) error {
	refuse := func(err error) error {
		ce := controller.Classify(err)
		return capability.Errorf(ce.Code, "the move's settings: %s", ce.Message)
	}
	asked := ms.Network
	if asked == "" {
		asked = sandbox.NetworkNone // a stored session always names its policy: none is the least
	}
	network, _, err := a.networkPolicy(ctx, ms.Tenant, asked)
	if err != nil {
		return refuse(err)
	}
	var rules *session.NetRules
	if ms.NetRules != nil {
		if rules, err = netRules(network, ms.NetRules.Allow, ms.NetRules.Deny); err != nil {
			return refuse(err)
		}
	}
	ms.Network, ms.NetRules = network, rules
	in := CreateSessionInput{Network: network, Env: ms.Env, Metadata: ms.Metadata, OnTimeout: ms.OnExpiry}
	if _, err := createOptions(in); err != nil {
		return refuse(err)
	}
	if !ms.ExpiresAt.IsZero() && ms.ExpiresAt.After(time.Now().Add(MaxSessionTimeout)) {
		return capability.Errorf(capability.InvalidArgument, "the move's settings: the lifetime ends %s, more than %d days from now",
			ms.ExpiresAt.UTC().Format(time.RFC3339), int(MaxSessionTimeout/(24*time.Hour)))
	}
	if err := checkMovedSecrets(ms.Secrets); err != nil {
		return err
	}
	if p := ms.Public; p != nil {
		for _, port := range slices.Concat(p.Open, p.Closed) {
			if port < 1 || port > 65535 {
				return capability.Errorf(capability.InvalidArgument, "the move's settings: public preview port %d is not a TCP port", port)
			}
		}
	}
	// The rootfs's name only: one not installed on this node is
	// installed on the session's next use, as after a restart.
	if ms.Rootfs != "" {
		if err := rootfs.CheckName(ms.Rootfs); err != nil {
			return capability.Errorf(capability.InvalidArgument, "the move's settings: %v", err)
		}
	}
	return nil
}

// checkMovedSecrets checks a move stream's secrets as a create checks its
// own (checkCreateSecrets: names, values, hosts, how many), and each
// placeholder's form (what the egress looks for: PlaceholderPrefix and
// 32 hex digits, each once); its hosts are written back in the form
// they are stored. No error names a value.
func checkMovedSecrets(secs []movedSecret) error {
	in := make([]SecretInput, 0, len(secs))
	seen := map[string]bool{}
	for _, sec := range secs {
		hexPart, ok := strings.CutPrefix(sec.Placeholder, egress.PlaceholderPrefix)
		if _, err := hex.DecodeString(hexPart); !ok || err != nil || len(hexPart) != 32 || strings.ToLower(hexPart) != hexPart || seen[sec.Placeholder] {
			return capability.Errorf(capability.InvalidArgument, "the move's settings: secret %q's placeholder is not %s and 32 lowercase hex digits, once", sec.Name, egress.PlaceholderPrefix)
		}
		seen[sec.Placeholder] = true
		in = append(in, SecretInput{Name: sec.Name, Value: string(sec.Value), Hosts: sec.Hosts})
	}
	checked, err := checkCreateSecrets(in)
	if err != nil {
		ce := controller.Classify(err)
		return capability.Errorf(ce.Code, "the move's settings: %s", ce.Message)
	}
	for i := range secs {
		secs[i].Hosts = checked[i].Hosts
	}
	return nil
}

// chownTree gives the tree under dir, which this server made and no
// process of a session has seen yet, to uid (links themselves, never
// followed).
func chownTree(dir string, uid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// readLine reads one line of at most limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var out []byte
	for {
		frag, err := br.ReadSlice('\n')
		out = append(out, frag...)
		if len(out) > limit {
			return nil, fmt.Errorf("longer than %d bytes", limit)
		}
		if err == nil {
			return out[:len(out)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}
