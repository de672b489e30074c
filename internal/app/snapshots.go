package app

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
	"github.com/quro-dev/quro/internal/workspace"
)

// Snapshots: snapshot_session copies a session's workspace (workspace.CopyTree) and
// settings to $QURO_DATA/snapshots/<id>/{workspace,meta.json}, recorded in
// the store for its tenant; fork_session makes new sessions from one, all
// or nothing. Where the bytes are accounted: a snapshot's files are on the
// host filesystem of the data directory, outside every session's disk
// image; each snapshot is at most the tenant's per-session disk quota (the
// copy stops past it), and a tenant holds at most Limits.Snapshots of them
// and Limits.SnapshotBytes bytes together (checked in the transactions
// that record them). A fork writes into the new session's image, so its
// files count against that session's disk quota: one that does not fit
// fails (ENOSPC) and the fork is undone.

// Defaults of the snapshot ceilings (Limits.Snapshots, Limits.SnapshotBytes)
// and the most sessions one fork makes.
const (
	DefaultSnapshotsPerTenant = 32
	DefaultSnapshotBytes      = 8 << 30
	MaxForkCount              = 16
)

const (
	snapshotIncluded    = "the workspace's files, directories and symbolic links (as links), the session's environment variables, working directory, network policy and rootfs"
	snapshotNotIncluded = "running processes, Python variables and imports, shell variables and functions not set with set_session_env, terminal screens, the session's tmp directory, and FIFOs, sockets and devices in the workspace"
)

// SnapshotInput is snapshot_session's input.
type SnapshotInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Name    string `json:"name,omitempty" jsonschema:"a name for the snapshot (letters, digits, . _ -); generated when omitted"`
}

// SnapshotRef names a snapshot.
type SnapshotRef struct {
	Snapshot string `json:"snapshot" jsonschema:"snapshot id or name (list_snapshots shows yours)"`
}

// ForkInput is fork_session's input.
type ForkInput struct {
	Snapshot   string `json:"snapshot,omitempty" jsonschema:"snapshot id or name to fork; give this or session"`
	Session    string `json:"session,omitempty" jsonschema:"instead of snapshot: a session to snapshot now and fork (the snapshot is deleted after)"`
	Count      int    `json:"count,omitempty" jsonschema:"how many sessions to make, 1 to 16 (default 1)"`
	NamePrefix string `json:"name_prefix,omitempty" jsonschema:"new sessions are named <prefix>-1, <prefix>-2…; generated names when omitted"`
}

// SnapshotInfo describes a snapshot.
type SnapshotInfo struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Session      string    `json:"session" jsonschema:"id of the session it was taken of"`
	SessionName  string    `json:"session_name"`
	CreatedAt    time.Time `json:"created_at"`
	SizeBytes    int64     `json:"size_bytes" jsonschema:"bytes of its files"`
	Files        int       `json:"files"`
	Complete     bool      `json:"complete" jsonschema:"false: being taken, or left incomplete by a server that stopped (delete it)"`
	Network      string    `json:"network"`
	Rootfs       string    `json:"rootfs,omitempty"`
	Cwd          string    `json:"cwd,omitempty" jsonschema:"working directory, relative to the workspace when inside it"`
	EnvNames     []string  `json:"env_names,omitempty" jsonschema:"names of the session variables it carries"`
	Dirs         int       `json:"dirs,omitempty"`
	Symlinks     int       `json:"symlinks,omitempty" jsonschema:"symbolic links, copied as links (never followed)"`
	Hardlinks    int       `json:"hardlinks,omitempty" jsonschema:"extra names of files linked more than once, kept as hard links"`
	Skipped      []string  `json:"skipped,omitempty" jsonschema:"entries not copied, with why (FIFOs, sockets, devices, entries that changed while copied)"`
	SkippedCount int       `json:"skipped_count,omitempty"`
	Included     string    `json:"included,omitempty" jsonschema:"what a snapshot holds"`
	NotIncluded  string    `json:"not_included,omitempty" jsonschema:"what a snapshot does not hold"`
}

// Text is a few lines about the snapshot.
func (s *SnapshotInfo) Text() string {
	var b strings.Builder
	state := ""
	if !s.Complete {
		state = " INCOMPLETE (being taken, or interrupted: delete it)"
	}
	fmt.Fprintf(&b, "snapshot %s (%s) of session %s: %d files, %s, network=%s%s", s.Name, s.ID, s.SessionName, s.Files, quota.Human(s.SizeBytes), s.Network, state)
	if s.Rootfs != "" {
		fmt.Fprintf(&b, " rootfs=%s", s.Rootfs)
	}
	if len(s.Skipped) > 0 {
		fmt.Fprintf(&b, "\nskipped %d: %s", s.SkippedCount, strings.Join(s.Skipped, ", "))
	}
	if s.Included != "" {
		fmt.Fprintf(&b, "\nincluded: %s\nNOT included: %s", s.Included, s.NotIncluded)
	}
	return b.String()
}

// SnapshotList is list_snapshots' output.
type SnapshotList struct {
	Snapshots []*SnapshotInfo `json:"snapshots"`
}

// Text lists one snapshot per line.
func (l *SnapshotList) Text() string {
	if len(l.Snapshots) == 0 {
		return "(no snapshots)"
	}
	var b strings.Builder
	for _, s := range l.Snapshots {
		b.WriteString(s.Text() + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// ForkCopy is one session a fork made.
type ForkCopy struct {
	Index   int    `json:"index"`
	Session string `json:"session" jsonschema:"the new session's id"`
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
}

// ForkResult is fork_session's output.
type ForkResult struct {
	Snapshot string     `json:"snapshot" jsonschema:"id of the snapshot forked"`
	Copies   []ForkCopy `json:"copies"`
	Note     string     `json:"note"`
}

// Text lists the new sessions.
func (r *ForkResult) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d session(s) made from snapshot %s:\n", len(r.Copies), r.Snapshot)
	for _, c := range r.Copies {
		fmt.Fprintf(&b, "  %d. %s %s\n", c.Index, c.Session, c.Name)
	}
	b.WriteString(r.Note)
	return b.String()
}

var snapNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })
var snapIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// snapLocks keeps a snapshot from being deleted while a fork reads it (in
// this process). A snapshot's entry goes with the snapshot
// (deleteSnapshot): a fork still waiting on the old lock finds the row
// gone when it has it, and one that makes a new lock finds it gone too.
var snapLocks sync.Map // dataDir + "/" + id → *sync.RWMutex

func (a *App) snapLock(id string) *sync.RWMutex {
	l, _ := snapLocks.LoadOrStore(a.snapLockKey(id), &sync.RWMutex{})
	return l.(*sync.RWMutex)
}

func (a *App) snapLockKey(id string) string { return a.DataDir + "/" + id }

func (a *App) snapshotsDir() string { return filepath.Join(a.DataDir, "snapshots") }

func (a *App) registerSnapshots(reg *capability.Registry) {
	reg.Register(capability.New("snapshot_session",
		"Snapshot a session: copy its workspace and settings so that fork_session can make new sessions from it. "+
			"Included: "+snapshotIncluded+". NOT included: "+snapshotNotIncluded+"; a fork starts fresh processes. "+
			"Symbolic links are copied as links and never followed. The copy is not atomic: files the session's code changes meanwhile may be caught half-way; pause_session first for a consistent copy (a snapshot does not wake a paused session). "+
			fmt.Sprintf("A snapshot is at most your per-session disk quota; you hold at most %d snapshots (delete_snapshot frees one). ", orDefault(a.limits.Snapshots, DefaultSnapshotsPerTenant))+
			"Returns the snapshot's id, size, file count and what was skipped.",
		capability.ScopeExec, a.snapshotSession).InSession(capability.UseHold))
	reg.Register(capability.New("fork_session",
		fmt.Sprintf("Make count (1 to %d) new sessions from a snapshot (or from a session, snapshotted now): each gets a copy of the workspace and the same environment variables, working directory, network policy and rootfs. ", MaxForkCount)+
			"Nothing runs in them yet: processes, Python variables and shell state are not carried over. "+
			"All or nothing: if any copy fails (session limit, disk quota), every session made is destroyed and the error says which copy failed and why. "+
			"Returns each new session's id and name.",
		capability.ScopeExec, a.forkSession).InSession(capability.UseHold))
	reg.Register(capability.New("list_snapshots",
		"List your snapshots (only your tenant's), oldest first: id, name, the session it was taken of, size, file count, network policy and rootfs.",
		capability.ScopeRead, func(ctx context.Context, _ Empty) (*SnapshotList, error) {
			if err := notInSession(ctx); err != nil {
				return nil, err
			}
			rows, err := a.Store.Snapshots(ctx, session.TenantFrom(ctx))
			if err != nil {
				return nil, err
			}
			out := &SnapshotList{Snapshots: []*SnapshotInfo{}}
			for _, r := range rows {
				out.Snapshots = append(out.Snapshots, snapshotInfo(r, nil))
			}
			return out, nil
		}))
	reg.Register(capability.New("delete_snapshot",
		"Delete one of your snapshots and its files. Sessions forked from it are not affected.",
		capability.ScopeExec, func(ctx context.Context, in SnapshotRef) (*Done, error) {
			if err := notInSession(ctx); err != nil {
				return nil, err
			}
			snap, err := a.findSnapshot(ctx, in.Snapshot)
			if err != nil {
				return nil, err
			}
			if err := a.deleteSnapshot(ctx, snap); err != nil {
				return nil, err
			}
			return &Done{Message: fmt.Sprintf("snapshot %s (%s) deleted", snap.Name, snap.ID)}, nil
		}))
}

// notInSession refuses code calling back from a session: snapshots are
// the agent's tool, and a session's code must not spend its tenant's
// snapshots or see them.
func notInSession(ctx context.Context) error {
	if c, ok := controller.CallerFrom(ctx); ok && c.Session != "" {
		return capability.Errorf(capability.PermissionDenied, "code in a session cannot take, list, fork or delete snapshots")
	}
	return nil
}

func snapshotInfo(r *store.Snapshot, st *workspace.CopyStats) *SnapshotInfo {
	info := &SnapshotInfo{
		ID: r.ID, Name: r.Name, Session: r.SourceID, SessionName: r.SourceName, CreatedAt: r.CreatedAt,
		SizeBytes: r.Size, Files: r.Files, Complete: r.Complete, Network: r.Network, Rootfs: r.Rootfs, Cwd: r.Cwd,
	}
	for k := range r.Env {
		info.EnvNames = append(info.EnvNames, k)
	}
	if st != nil {
		info.Dirs, info.Symlinks, info.Hardlinks = st.Dirs, st.Symlinks, st.Hardlinks
		info.Skipped, info.SkippedCount = st.Skipped, st.SkippedCount
		info.Included, info.NotIncluded = snapshotIncluded, snapshotNotIncluded
	}
	return info
}

// findSnapshot finds ctx's tenant's snapshot by id or name. Another
// tenant's is reported exactly as a missing one.
func (a *App) findSnapshot(ctx context.Context, ref string) (*store.Snapshot, error) {
	if ref == "" {
		return nil, capability.Errorf(capability.InvalidArgument, "name the snapshot (list_snapshots shows yours)")
	}
	tenant := session.TenantFrom(ctx)
	var snap *store.Snapshot
	var err error
	if snapIDRE.MatchString(ref) {
		snap, err = a.Store.SnapshotByID(ctx, ref)
		if err == nil && snap.Tenant != tenant {
			snap, err = nil, store.ErrNotFound
		}
	}
	if snap == nil {
		snap, err = a.Store.SnapshotByName(ctx, tenant, ref)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, capability.Errorf(capability.NotFound, "snapshot %q not found (list_snapshots shows yours)", ref)
	}
	return snap, err
}

func (a *App) deleteSnapshot(ctx context.Context, snap *store.Snapshot) error {
	l := a.snapLock(snap.ID)
	l.Lock()
	defer l.Unlock()
	if err := a.Store.DeleteSnapshot(ctx, snap.Tenant, snap.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return capability.Errorf(capability.NotFound, "snapshot %q not found (list_snapshots shows yours)", snap.Name)
		}
		return err
	}
	snapLocks.Delete(a.snapLockKey(snap.ID))
	return removeTree(filepath.Join(a.snapshotsDir(), snap.ID))
}

// removeTree removes dir, whose directories may have been copied without
// write or search permission (a 0500 directory of the session's): they
// are opened up first when the server is not root.
func removeTree(dir string) error {
	if err := os.RemoveAll(dir); err == nil || os.Geteuid() == 0 {
		return err
	}
	// Best effort, both: the RemoveAll after it says what could not go.
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

func (a *App) snapshotSession(ctx context.Context, in SnapshotInput) (*SnapshotInfo, error) {
	if err := notInSession(ctx); err != nil {
		return nil, err
	}
	s, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	snap, st, err := a.takeSnapshot(ctx, s, in.Name)
	if err != nil {
		return nil, err
	}
	return snapshotInfo(snap, st), nil
}

// takeSnapshot copies s's workspace and settings into a new snapshot.
func (a *App) takeSnapshot(ctx context.Context, s *session.Session, name string) (*store.Snapshot, *workspace.CopyStats, error) {
	id, err := newSnapshotID()
	if err != nil {
		return nil, nil, err
	}
	if name == "" {
		base := s.Name
		if len(base) > 50 {
			base = base[:50]
		}
		name = base + "-" + id[:8]
	}
	if !snapNameRE().MatchString(name) || snapIDRE.MatchString(name) {
		return nil, nil, capability.Errorf(capability.InvalidArgument,
			"snapshot name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (and not 32 hex digits, which is an id)", name)
	}
	// The call holds s (snapshot_session and fork_session are declared
	// InSession(UseHold)): a destroy of s waits for the copy (or cancels
	// it) before it removes the session's disk, so the copy never reads a
	// half-deleted workspace nor mounts a disk being removed.
	// The session's image may have been unmounted by another process
	// that stopped: the workspace is read beneath it, never the empty
	// directory under the mount point.
	if err := a.tenants.disks.Remount(s.Dir); err != nil {
		return nil, nil, fmt.Errorf("session %s: mount its disk: %w", s.Name, err)
	}
	if err := a.Sessions.Touch(ctx, s); err != nil {
		return nil, nil, err
	}
	tenant := s.Tenant
	maxN := orDefault(a.limits.Snapshots, DefaultSnapshotsPerTenant)
	maxBytes := int64(orDefault(int(a.limits.SnapshotBytes), DefaultSnapshotBytes))
	_, used, err := a.Store.SnapshotUsage(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	// The copy stops at the smaller of the per-session disk quota and
	// what the tenant's snapshot bytes leave.
	lim, err := a.tenants.Limits(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	budget := lim.Disk
	if budget < 0 {
		budget = 0
	}
	if maxBytes > 0 {
		left := maxBytes - used
		if left <= 0 {
			return nil, nil, snapshotBytesError(used, maxBytes)
		}
		if budget == 0 || left < budget {
			budget = left
		}
	}
	env := s.Env
	if env == nil {
		env = map[string]string{}
	}
	row := &store.Snapshot{
		ID: id, Tenant: tenant, Name: name, SourceID: s.ID, SourceName: s.Name, CreatedAt: time.Now(),
		Env: env, Cwd: relCwd(s.Workspace(), s.Cwd), Network: s.Network, Rootfs: s.Rootfs,
	}
	if err := a.Store.CreateSnapshot(ctx, row, maxN); err != nil {
		var ce *store.SnapshotCapError
		switch {
		case errors.As(err, &ce):
			e := capability.Errorf(capability.ResourceExhausted, "you hold %d snapshots, the most allowed: delete one you no longer need (list_snapshots, delete_snapshot)", ce.Count)
			return nil, nil, e
		case errors.Is(err, store.ErrExists):
			return nil, nil, capability.Errorf(capability.AlreadyExists, "you already have a snapshot named %q: pick another name or delete it", name)
		}
		return nil, nil, err
	}
	dir := filepath.Join(a.snapshotsDir(), id)
	fail := func(err error) (*store.Snapshot, *workspace.CopyStats, error) {
		// Clean-up of a snapshot that failed: err is the one to report.
		_ = removeTree(dir)
		_ = a.Store.DeleteSnapshot(context.WithoutCancel(ctx), tenant, id)
		return nil, nil, err
	}
	if err := os.MkdirAll(a.snapshotsDir(), 0o700); err != nil {
		return fail(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fail(err)
	}
	ws := filepath.Join(dir, "workspace")
	if err := os.Mkdir(ws, 0o700); err != nil {
		return fail(err)
	}
	// Owned by the server (uid -1): nobody else reaches into the 0700
	// snapshot directory, and no mode bit it keeps is set-uid or set-gid.
	st, err := workspace.CopyTree(ctx, s.Workspace(), ws, workspace.CopyOptions{Budget: budget, UID: -1, BeforeOpen: a.copyHook})
	if errors.Is(err, workspace.ErrBudget) {
		limit := "your per-session disk quota"
		if maxBytes > 0 && budget == maxBytes-used {
			limit = fmt.Sprintf("what your snapshots may still hold (%s of %s)", quota.Human(budget), quota.Human(maxBytes))
		}
		return fail(capability.Errorf(capability.ResourceExhausted, "session %s's workspace is larger than %s (%s): remove files you do not need, or delete snapshots", s.Name, limit, quota.Human(budget)))
	}
	if err != nil {
		return fail(copyError("snapshot of session "+s.Name, err))
	}
	meta, _ := json.MarshalIndent(map[string]any{
		"id": id, "tenant": tenant, "name": name, "session": s.ID, "session_name": s.Name, "created_at": row.CreatedAt,
		"env": env, "cwd": row.Cwd, "network": s.Network, "rootfs": s.Rootfs,
		"size": st.Bytes, "files": st.Files, "skipped": st.Skipped,
	}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), meta, 0o600); err != nil {
		return fail(err)
	}
	if err := a.Store.FinishSnapshot(ctx, id, st.Bytes, st.Files, maxBytes); err != nil {
		var ce *store.SnapshotCapError
		if errors.As(err, &ce) {
			return fail(snapshotBytesError(ce.Bytes, maxBytes))
		}
		return fail(err)
	}
	row.Size, row.Files, row.Complete = st.Bytes, st.Files, true
	return row, st, nil
}

func snapshotBytesError(used, maxBytes int64) error {
	return capability.Errorf(capability.ResourceExhausted, "your snapshots hold %s of at most %s: delete one you no longer need (list_snapshots, delete_snapshot)",
		quota.Human(used), quota.Human(maxBytes))
}

// copyError says what failed in a copy in terms a caller can act on.
func copyError(what string, err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return capability.Errorf(capability.ResourceExhausted, "%s: the disk is full (%v)", what, err)
	case errors.Is(err, workspace.ErrTooDeep), errors.Is(err, workspace.ErrTooMany):
		return capability.Errorf(capability.InvalidArgument, "%s: %v", what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// relCwd is cwd relative to the workspace ws when inside it ("." for ws
// itself), else cwd as it is. The workspace is ws or /home/user.
func relCwd(ws, cwd string) string {
	if cwd == "" {
		return ""
	}
	rel, err := filepath.Rel(ws, hostpath.FromHome(ws, cwd))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return cwd
	}
	return rel
}

func newSnapshotID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", b[:]), nil
}

func (a *App) forkSession(ctx context.Context, in ForkInput) (*ForkResult, error) {
	if err := notInSession(ctx); err != nil {
		return nil, err
	}
	if in.Count == 0 {
		in.Count = 1
	}
	if in.Count < 1 || in.Count > MaxForkCount {
		return nil, capability.Errorf(capability.InvalidArgument, "count %d: make 1 to %d sessions per fork", in.Count, MaxForkCount)
	}
	if (in.Snapshot == "") == (in.Session == "") {
		return nil, capability.Errorf(capability.InvalidArgument, "give a snapshot to fork (list_snapshots), or a session to snapshot and fork, not both")
	}
	var snap *store.Snapshot
	if in.Session != "" {
		s, err := entered(ctx)
		if err != nil {
			return nil, err
		}
		snap, _, err = a.takeSnapshot(ctx, s, "")
		if err != nil {
			return nil, err
		}
		defer func() { _ = a.deleteSnapshot(context.WithoutCancel(ctx), snap) }() // a throwaway snapshot: the fork's result is the answer
	} else {
		var err error
		if snap, err = a.findSnapshot(ctx, in.Snapshot); err != nil {
			return nil, err
		}
	}
	if !snap.Complete {
		return nil, capability.Errorf(capability.InvalidArgument, "snapshot %s is incomplete (being taken, or interrupted): wait for it, or delete it and take another", snap.Name)
	}
	if snap.Rootfs != "" {
		if err := a.checkRootfsReady(snap.Rootfs); err != nil {
			return nil, err
		}
	}
	l := a.snapLock(snap.ID)
	l.RLock()
	defer l.RUnlock()
	// Deleted between the lookup and the lock?
	if _, err := a.Store.SnapshotByID(ctx, snap.ID); err != nil {
		return nil, capability.Errorf(capability.NotFound, "snapshot %q not found (list_snapshots shows yours)", snap.Name)
	}
	src := filepath.Join(a.snapshotsDir(), snap.ID, "workspace")
	out := &ForkResult{Snapshot: snap.ID, Copies: []ForkCopy{}}
	var made []*session.Session
	undo := func(i int, err error) (*ForkResult, error) {
		cctx := context.WithoutCancel(ctx)
		var undone []string
		for _, s := range made {
			if derr := a.destroySession(cctx, s); derr != nil {
				a.Log.Warn("fork: cannot destroy a copy", "session", s.ID, "err", derr)
			}
			undone = append(undone, s.Name)
		}
		ce := controller.Classify(err)
		msg := fmt.Sprintf("fork of snapshot %s: copy %d of %d failed: %s; ", snap.Name, i, in.Count, ce.Message)
		if len(undone) > 0 {
			msg += fmt.Sprintf("the %d session(s) already made (%s) were destroyed, so nothing was kept", len(undone), strings.Join(undone, ", "))
		} else {
			msg += "no session was made"
		}
		e := capability.Errorf(ce.Code, "%s", msg)
		e.RetryAfter = ce.RetryAfter
		return nil, e
	}
	// The snapshot's network, as the operator allows it now.
	network, _, err := a.networkPolicy(ctx, snap.Tenant, snap.Network)
	if err != nil {
		return nil, err
	}
	for i := 1; i <= in.Count; i++ {
		name := ""
		if in.NamePrefix != "" {
			name = fmt.Sprintf("%s-%d", in.NamePrefix, i)
		}
		// Each copy needs the room of a session under the tenant's
		// memory and process ceilings, as create_session does.
		err := a.admitSession(ctx)
		var s *session.Session
		if err == nil {
			s, err = a.Sessions.CreateWith(ctx, name, session.CreateOptions{Network: network, Rootfs: snap.Rootfs})
		}
		if err != nil {
			return undo(i, err)
		}
		made = append(made, s)
		if err := a.restore(ctx, snap, src, s); err != nil {
			return undo(i, err)
		}
		out.Copies = append(out.Copies, ForkCopy{Index: i, Session: s.ID, Name: s.Name, OK: true})
	}
	out.Note = "each session has a copy of the snapshot's workspace, variables, working directory, network policy and rootfs; no process from the snapshot runs in them"
	return out, nil
}

// restore gives the new session s the snapshot's files and settings.
func (a *App) restore(ctx context.Context, snap *store.Snapshot, src string, s *session.Session) error {
	if len(snap.Env) > 0 {
		changes := map[string]*string{}
		for k, v := range snap.Env {
			changes[k] = &v
		}
		if _, err := a.Sessions.UpdateEnv(ctx, s, changes); err != nil {
			return err
		}
	}
	if snap.Cwd != "" {
		cwd := snap.Cwd
		if !filepath.IsAbs(cwd) {
			cwd = filepath.Join(s.Workspace(), cwd)
		}
		if err := a.Sessions.SetCwd(ctx, s.ID, cwd); err != nil {
			return err
		}
	}
	uid := -1
	if os.Geteuid() == 0 {
		uid = s.UID
	}
	// The new session's workspace is on its own disk image: the copy
	// counts against its quota, and one that does not fit fails ENOSPC.
	_, err := workspace.CopyTree(ctx, src, s.Workspace(), workspace.CopyOptions{UID: uid, Strict: true})
	if err != nil {
		return copyError("copy the workspace into session "+s.Name, err)
	}
	return nil
}
