// Package session holds Quro's sessions: a named, persistent place where
// code runs. A Session belongs to one tenant and has its own unique uid
// (leased from the store, never reused while its files may exist), a
// workspace and tmp directory, environment variables, a network policy, an
// optional rootfs and a working directory that survives restarts.
//
// Sessions live as rows in the store and as directories under
// $QURO_DATA/sessions/<id>/ (on the session's disk image; see
// internal/quota). A context carries the calling tenant (WithTenant) and,
// for code calling back from inside a session, the one session it may see
// (WithOnly): Get, List and Default never return another tenant's session.
// The Manager keeps a default session per tenant, used whenever a caller
// names none, and tells the App through BoxHooks when a session is created
// or deleted so that its box, disk and processes follow. What runs in a
// session (its box, shells, Python worker) is not held here but by the
// sandbox, terminal and engine packages, keyed by the session's id.
//
// Lookups by id or name, the default session and IsDefault are served by
// the store from memory on a warm server (no SQLite); a session created,
// destroyed or changed by any quro process sharing the data directory is
// seen by the next lookup (see store's cache.go).
//
// A Manager is safe for concurrent use.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/store"
)

// DefaultName is the name of the default session.
const DefaultName = "default"

const defaultKey = "default_session"

var (
	// ErrNotFound means no session has that id or name.
	ErrNotFound = errors.New("session not found")
	// ErrExists means the name is taken.
	ErrExists = errors.New("session name already taken")
	// ErrBadName means the name is not allowed.
	ErrBadName = errors.New("bad session name")
	// ErrLimit means the tenant has as many sessions as it may.
	ErrLimit = errors.New("session limit reached")
	// ErrConfined means a caller confined to one session may not make others.
	ErrConfined = errors.New("confined to its own session")
	// ErrBadMetadata means metadata out of bounds (see CheckMetadata).
	ErrBadMetadata = errors.New("bad session metadata")
	// ErrBadLifetime means a lifetime or its end action is not allowed.
	ErrBadLifetime = errors.New("bad session lifetime")
)

type onlyKey struct{}

// WithOnly confines the calls under ctx to session id: it is the default
// session, the only one found and listed, and no session can be created.
// Code calling back from inside a session gets such a context.
func WithOnly(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, onlyKey{}, id)
}

func onlyFrom(ctx context.Context) string {
	id, _ := ctx.Value(onlyKey{}).(string)
	return id
}

type tenantKey struct{}

// WithTenant returns ctx for calls on behalf of tenant. Every lookup by
// name or id, every list and count, and every new session of a Manager is
// confined to the tenant of its ctx; a context without one is the local
// tenant "". Another tenant's session is simply not found.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant of ctx ("" for the local tenant).
func TenantFrom(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// ValidTenant reports whether name may be a tenant name: the local tenant
// "" or what a session name may be.
func ValidTenant(name string) bool { return name == "" || nameRE.MatchString(name) }

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	idRE      = regexp.MustCompile(`^[0-9a-f]{32}$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Session is one session. Its fields are a snapshot; the Manager owns the
// live state.
type Session struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	CreatedAt  time.Time         `json:"created_at"`
	LastUsedAt time.Time         `json:"last_used_at"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"` // the shell's last working directory
	Network    string            `json:"network"`       // network policy: "none", "internet" or "host"
	// NetRules hold an "internet" session to what they allow (nil: the
	// public internet); the egress decides by them.
	NetRules *NetRules `json:"network_rules,omitempty"`
	Rootfs   string    `json:"rootfs,omitempty"` // rootfs name, "" for the host userland
	Tenant   string    `json:"-"`                // owner; "" for the local tenant
	Dir      string    `json:"-"`                // $QURO_DATA/sessions/<id>
	// UID is the session's own host uid, allocated by the store: no
	// other session has it, and it is not given to another session until
	// every process and file of this one is gone. Runs of the session go
	// under it when the server is root (sandbox.Spec.UID).
	UID int `json:"-"`
	// Metadata are the caller's labels (nil: none), see CheckMetadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// ExpiresAt ends the session's lifetime (zero: none): the server then
	// destroys it, or pauses it when OnExpiry is ExpiryPause.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	OnExpiry  string    `json:"on_expiry,omitempty"`
	// Paused: the session was paused (SetPaused) and not resumed or used
	// since. Its box, if it has one, is frozen; a restart ends the box
	// but not this.
	Paused bool `json:"paused,omitempty"`

	m *Manager
}

// Binds are the host paths bound into every box of the session
// (sandbox.Spec.Binds): its workspace again at sandbox.HomeUser
// (read-write), and its own in-session socket, which the Manager's
// BoxHooks create on first use (none without a hook).
func (s *Session) Binds() []sandbox.Bind {
	if s == nil {
		return nil
	}
	var home []sandbox.Bind
	if filepath.IsAbs(s.Dir) {
		home = []sandbox.Bind{{Src: s.Workspace(), Dst: sandbox.HomeUser, Writable: true}}
	}
	if s.m == nil {
		return home
	}
	h := s.m.hooks
	if h == nil || h.Binds == nil {
		return home
	}
	return append(home, h.Binds(s)...)
}

// Spec is the start of every run of the session: the one builder of a
// sandbox.Spec that runs in its box. It is spawned in the session's box
// (Session), under its uid (UID) with its binds, in its workspace (Dir
// and HOME; TMPDIR its tmp), with its variables and network policy. The
// caller adds what the run is (Stdout, Rootfs, TTY...); a run of the
// session outside its box is a choice it names (sandbox.Spec.Outside).
func (s *Session) Spec(args ...string) *sandbox.Spec {
	return &sandbox.Spec{
		Args: args, Dir: s.Workspace(), Home: s.Workspace(), TmpDir: s.TmpDir(),
		Env: s.Env, Network: s.Network,
		UID: s.UID, Session: s.ID, Binds: s.Binds(),
	}
}

// Sandbox is sb for code that builds its Specs without the session at
// hand (a session's shell, its Python worker): every run it starts is
// spawned in the session's box, under its uid, with its binds
// (sandbox.Sandbox.ForSession), as Spec's are.
func (s *Session) Sandbox(sb *sandbox.Sandbox) *sandbox.Sandbox {
	return sb.ForSession(s.ID, s.UID, s.Binds())
}

// Workspace is the session's working directory: the only host directory its
// code may write.
func (s *Session) Workspace() string { return filepath.Join(s.Dir, "workspace") }

// TmpDir is the session's private temporary directory.
func (s *Session) TmpDir() string { return filepath.Join(s.Dir, "tmp") }

// OutputsDir is where full outputs that were cut in results are kept. It is
// inside the workspace so that the session's own code (and the file API) can
// read them.
func (s *Session) OutputsDir() string { return filepath.Join(s.Workspace(), OutputsRel) }

// OutputsRel is OutputsDir relative to the workspace.
const OutputsRel = ".quro/outputs"

// Manager creates, finds and lists sessions.
type Manager struct {
	store *store.Store
	root  string // $QURO_DATA/sessions

	// MaxPerTenant caps the sessions one tenant may have (0: no cap). Set
	// it before the Manager is used.
	MaxPerTenant int
	// MaxFor, when set, gives a tenant's cap instead of MaxPerTenant.
	MaxFor func(tenant string) int
	// MaxTotal caps the sessions of all tenants together (spares, which
	// are nobody's yet, not counted; 0: no cap). Set it before the
	// Manager is used.
	MaxTotal int
	// LimitHint, when set, says how the operator raises the ceiling of
	// scope ("tenant" or "server"), for LimitError's message.
	LimitHint func(scope string) string
	// Disk, when set, gives each session directory a filesystem of its
	// own (a disk quota): Prepare makes and mounts it at the directory
	// before its subdirectories are made, Release unmounts and deletes it
	// before the directory is removed.
	Disk struct {
		Prepare func(tenant, dir string) error
		Release func(dir string) error
	}

	hooks *BoxHooks // fixed at Open

	reapMu   sync.Mutex
	lastReap time.Time

	// The releases of destroyed sessions still under way (Forget's): the
	// ids whose directories are not yet removed, so that a uid reap
	// leaves them alone; how many have not ended (their reap included);
	// and a channel closed (and replaced) each time either changes.
	relMu     sync.Mutex
	releasing map[string]bool
	pending   int
	released  chan struct{}
}

// BoxHooks tie a session's boxes to services outside the package: the
// in-session socket.
type BoxHooks struct {
	// Binds returns the binds of the session's boxes (see Session.Binds).
	Binds func(*Session) []sandbox.Bind
	// Destroyed is told when the session's row is gone, before its
	// directory is removed and its uid released.
	Destroyed func(*Session)
}

// Open returns a Manager over st with session directories under dataDir,
// whose boxes are tied to the services outside the package by hooks (nil:
// none; fixed for the Manager's life: a box made before hooks were set
// would lack their binds), creating the default session on the data
// directory's first start. A default that is gone since (destroyed, or
// moved to another node of a cluster by a drain) is made again when a
// call asks for it (Default), not at every start: a cluster node
// restarted after its drain holds no session until one is asked of it.
func Open(ctx context.Context, st *store.Store, dataDir string, hooks *BoxHooks) (*Manager, error) {
	m := &Manager{store: st, root: filepath.Join(dataDir, "sessions"), hooks: hooks}
	if err := os.MkdirAll(m.root, 0o700); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	if err := m.settleUIDs(ctx); err != nil {
		return nil, fmt.Errorf("session uids: %w", err)
	}
	if _, err := st.Setting(ctx, defaultKey); errors.Is(err, store.ErrNotFound) {
		if _, err := m.Default(ctx); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	return m, nil
}

// defaultSetting is the settings key naming the default session of the
// tenant of ctx.
func defaultSetting(ctx context.Context) string {
	if t := TenantFrom(ctx); t != "" {
		return defaultKey + ":" + t
	}
	return defaultKey
}

// Default returns the default session of ctx's tenant, creating it on
// first use.
func (m *Manager) Default(ctx context.Context) (*Session, error) {
	if only := onlyFrom(ctx); only != "" {
		return m.byID(ctx, only)
	}
	key := defaultSetting(ctx)
	if id, err := m.store.Setting(ctx, key); err == nil {
		s, err := m.byID(ctx, id)
		if err == nil || !errors.Is(err, ErrNotFound) {
			return s, err
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	s, err := m.create(ctx, DefaultName, CreateOptions{}, false)
	if errors.Is(err, ErrExists) { // another process made it first
		s, err = m.byName(ctx, DefaultName)
	}
	if err != nil {
		return nil, err
	}
	if err := m.store.SetSetting(ctx, key, s.ID); err != nil {
		return nil, err
	}
	return s, nil
}

// DefaultIfAny returns the default session of ctx's tenant when it
// exists, ErrNotFound when none was made or it is gone (destroyed, or
// moved to another node of a cluster): for a caller that must not make
// one, such as the supervisor's patrol, which runs on a node whose
// default a drain has just moved away.
func (m *Manager) DefaultIfAny(ctx context.Context) (*Session, error) {
	if only := onlyFrom(ctx); only != "" {
		return m.byID(ctx, only)
	}
	id, err := m.store.Setting(ctx, defaultSetting(ctx))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no default session", ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return m.byID(ctx, id)
}

// Get finds a session by id or name; "" means the default session.
func (m *Manager) Get(ctx context.Context, ref string) (*Session, error) {
	if ref == "" {
		return m.Default(ctx)
	}
	if only := onlyFrom(ctx); only != "" {
		s, err := m.byID(ctx, only)
		if err != nil || ref == s.ID || ref == s.Name {
			return s, err
		}
		return nil, fmt.Errorf("%w: %q (code in a session reaches only its own session)", ErrNotFound, ref)
	}
	if idRE.MatchString(ref) {
		s, err := m.byID(ctx, ref)
		if !errors.Is(err, ErrNotFound) {
			return s, err
		}
	}
	s, err := m.byName(ctx, ref)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: %q (list sessions to see the names)", ErrNotFound, ref)
	}
	return s, err
}

// NetRules are a session's egress rules (internal/egress.ParseRule checks
// them): only what Allow names when it names anything; Deny wins.
type NetRules struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// encodeRules is r as the store keeps it ("" for none).
func encodeRules(r *NetRules) string {
	if r == nil || len(r.Allow) == 0 && len(r.Deny) == 0 {
		return ""
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// decodeRules is the inverse of encodeRules; unreadable rules allow
// nothing (an empty allow list would allow everything: a single rule no
// name matches stands in).
func decodeRules(s string) *NetRules {
	if s == "" {
		return nil
	}
	var r NetRules
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return &NetRules{Allow: []string{"unreadable.invalid"}}
	}
	return &r
}

// SetNetwork changes the session's network policy and rules (the caller
// checks them, and what the operator allows).
func (m *Manager) SetNetwork(ctx context.Context, s *Session, network string, rules *NetRules) error {
	if !slices.Contains(Networks, network) {
		return fmt.Errorf("%w: network policy %q; use one of %v", ErrBadName, network, Networks)
	}
	if err := m.wrap(m.store.SetSessionNetwork(ctx, s.ID, network, encodeRules(rules)), s.ID); err != nil {
		return err
	}
	s.Network, s.NetRules = network, rules
	return nil
}

// CreateOptions are the optional settings of a new session.
type CreateOptions struct {
	Network string // "none" (default), "internet" or "host" (the caller checks what the operator allows)
	// NetRules hold an "internet" session to what they allow (nil: none).
	NetRules *NetRules
	Rootfs   string // a rootfs name; "" for the host userland
	// Env are its first variables (names as UpdateEnv checks them).
	Env map[string]string
	// Metadata are its labels (CheckMetadata).
	Metadata map[string]string
	// ExpiresAt ends its lifetime (zero: none); OnExpiry says what then.
	ExpiresAt time.Time
	OnExpiry  string
}

// What the server does with a session whose lifetime ended.
const (
	ExpiryDestroy = "destroy" // stored as ""
	ExpiryPause   = "pause"
)

// The bounds of a session's metadata.
const (
	MaxMetadataPairs = 64
	MaxMetadataKey   = 128  // bytes
	MaxMetadataValue = 1024 // bytes
)

// CheckMetadata refuses metadata a session may not have: more than
// MaxMetadataPairs pairs, an empty key, a key or value longer than its
// bound, or one that is not valid UTF-8 or holds a control character.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataPairs {
		return fmt.Errorf("%w: %d pairs, at most %d", ErrBadMetadata, len(md), MaxMetadataPairs)
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		v := md[k]
		switch {
		case k == "":
			return fmt.Errorf("%w: a key is empty", ErrBadMetadata)
		case len(k) > MaxMetadataKey:
			return fmt.Errorf("%w: key %.32q… is %d bytes, at most %d", ErrBadMetadata, k, len(k), MaxMetadataKey)
		case len(v) > MaxMetadataValue:
			return fmt.Errorf("%w: the value of %q is %d bytes, at most %d", ErrBadMetadata, k, len(v), MaxMetadataValue)
		case !printable(k):
			return fmt.Errorf("%w: key %q is not printable UTF-8", ErrBadMetadata, k)
		case !printable(v):
			return fmt.Errorf("%w: the value of %q is not printable UTF-8 (no control characters)", ErrBadMetadata, k)
		}
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// expiryAction is o's end action as stored ("" or "pause"), checked.
func expiryAction(a string) (string, error) {
	switch a {
	case "", ExpiryDestroy:
		return "", nil
	case ExpiryPause:
		return ExpiryPause, nil
	}
	return "", fmt.Errorf("%w: on expiry %q: use %s or %s", ErrBadLifetime, a, ExpiryDestroy, ExpiryPause)
}

// checkEnv checks the names and values of env as UpdateEnv does.
func checkEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !envNameRE.MatchString(k) {
			return fmt.Errorf("%w: variable name %q (letters, digits and _, not starting with a digit)", ErrBadName, k)
		}
		if strings.ContainsRune(env[k], 0) {
			return fmt.Errorf("%w: the value of %s contains a NUL byte", ErrBadName, k)
		}
	}
	return nil
}

// checkExtras checks o's env, metadata and end action; it returns the
// stored form of the end action.
func (o *CreateOptions) checkExtras() (string, error) {
	if err := checkEnv(o.Env); err != nil {
		return "", err
	}
	if err := CheckMetadata(o.Metadata); err != nil {
		return "", err
	}
	return expiryAction(o.OnExpiry)
}

// Networks are the accepted network policies (sandbox.Networks): the
// box's loopback only, the public internet through the server's egress,
// the host's own network.
var Networks = []string{"none", "internet", "host"}

// LegacyFull is the policy sessions had before "internet": the host's
// network then, read as "internet" now (never as "host", which needs the
// operator's leave).
const LegacyFull = "full"

// Create makes a new session with a fresh random id. An empty name gets one
// derived from the id.
func (m *Manager) Create(ctx context.Context, name string) (*Session, error) {
	return m.CreateWith(ctx, name, CreateOptions{})
}

// CreateWith makes a new session with options, for the tenant of ctx.
func (m *Manager) CreateWith(ctx context.Context, name string, o CreateOptions) (*Session, error) {
	return m.create(ctx, name, o, true)
}

// mayCreate checks that ctx's caller may make one more session (not code
// in a session, a valid tenant, under the tenant's cap when capped) and
// returns the tenant and the caps (nil when not capped). The count here
// refuses early, before a disk is made; the store counts again in the
// transaction that adds the session (capped), which alone holds when
// creates run at once.
func (m *Manager) mayCreate(ctx context.Context, capped bool) (string, *store.Caps, error) {
	if onlyFrom(ctx) != "" {
		return "", nil, fmt.Errorf("%w: code running in a session cannot create sessions", ErrConfined)
	}
	tenant := TenantFrom(ctx)
	if !ValidTenant(tenant) {
		return "", nil, fmt.Errorf("%w: tenant %q", ErrBadName, tenant)
	}
	if !capped {
		return tenant, nil, nil
	}
	caps, err := m.admit(ctx, tenant)
	return tenant, caps, err
}

// Admit checks that tenant has room for one more session under its
// ceiling and the server's: what a create and an adoption check first
// (the store counts again when it adds the session). A node asked
// whether it would take a moved session answers with it.
func (m *Manager) Admit(ctx context.Context, tenant string) error {
	_, err := m.admit(ctx, tenant)
	return err
}

// admit checks that tenant has room for one more session under its
// ceiling and the server's, and returns the caps the store counts again
// when it adds the session.
func (m *Manager) admit(ctx context.Context, tenant string) (*store.Caps, error) {
	caps := &store.Caps{Tenant: m.MaxPerTenant, Total: m.MaxTotal, Uncounted: SpareTenant}
	if m.MaxFor != nil {
		caps.Tenant = m.MaxFor(tenant)
	}
	if caps.Tenant > 0 {
		n, err := m.store.CountSessions(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if n >= caps.Tenant {
			return nil, m.limitError(tenant, "tenant", n, caps.Tenant)
		}
	}
	if caps.Total > 0 {
		n, err := m.CountAll(ctx)
		if err != nil {
			return nil, err
		}
		if n >= caps.Total {
			return nil, m.limitError(tenant, "server", n, caps.Total)
		}
	}
	return caps, nil
}

// capped is err as the Manager's error: a *store.CapError becomes
// tenant's *LimitError.
func (m *Manager) capped(tenant string, err error) error {
	var ce *store.CapError
	if errors.As(err, &ce) {
		return m.limitError(tenant, ce.Scope, ce.Sessions, ce.Max)
	}
	return err
}

func (m *Manager) limitError(tenant, scope string, n, maxN int) *LimitError {
	e := &LimitError{Tenant: tenant, Scope: scope, Sessions: n, Max: maxN}
	if m.LimitHint != nil {
		e.Hint = m.LimitHint(scope)
	}
	return e
}

// LimitError is a new session refused at a session ceiling: the tenant's
// (Scope "tenant") or the server's, of all tenants together ("server").
// It wraps ErrLimit.
type LimitError struct {
	Tenant        string
	Scope         string
	Sessions, Max int
	Hint          string // how the operator raises it ("": not said)
}

func (e *LimitError) Error() string {
	who := "the tenant"
	if e.Scope == "server" {
		who = "the server (all tenants together)"
	}
	msg := fmt.Sprintf("%v: %s is at its session ceiling of %d (%d sessions): destroy one you no longer need", ErrLimit, who, e.Max, e.Sessions)
	if e.Hint != "" {
		msg += ", or " + e.Hint
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrLimit) true.
func (e *LimitError) Unwrap() error { return ErrLimit }

// sessionName is name, or one made from id when empty, checked.
func sessionName(name, id string) (string, error) {
	if name == "" {
		name = "s-" + id[:8]
	}
	if !nameRE.MatchString(name) || idRE.MatchString(name) {
		return "", fmt.Errorf("%w %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrBadName, name)
	}
	return name, nil
}

// materialize makes row's directories and disk image (of diskTenant's
// quota) and stores row; on an error nothing of it is left.
func (m *Manager) materialize(ctx context.Context, row *store.Session, diskTenant string, caps *store.Caps) (*Session, error) {
	s := m.fromRow(row)
	if m.Disk.Prepare != nil {
		if err := m.Disk.Prepare(diskTenant, s.Dir); err != nil {
			return nil, err
		}
	}
	release := func() {
		if m.Disk.Release != nil {
			_ = m.Disk.Release(s.Dir) // clean-up of a create that fails: its error is the one to report
		}
		os.RemoveAll(s.Dir)
	}
	if err := m.ensureDirs(s); err != nil {
		release()
		return nil, err
	}
	if err := m.store.CreateSessionWithin(ctx, row, caps); err != nil {
		release()
		var ce *store.CapError
		switch {
		case errors.Is(err, store.ErrExists):
			return nil, fmt.Errorf("%w: %q", ErrExists, row.Name)
		case errors.As(err, &ce):
			return nil, m.capped(row.Tenant, err)
		}
		return nil, fmt.Errorf("session: %w", err)
	}
	s.UID = row.UID
	return s, nil
}

func (m *Manager) create(ctx context.Context, name string, o CreateOptions, capped bool) (*Session, error) {
	tenant, caps, err := m.mayCreate(ctx, capped)
	if err != nil {
		return nil, err
	}
	if o.Network == "" {
		o.Network = "none"
	}
	if !slices.Contains(Networks, o.Network) {
		return nil, fmt.Errorf("%w: network policy %q; use one of %v", ErrBadName, o.Network, Networks)
	}
	if o.Rootfs != "" && !nameRE.MatchString(o.Rootfs) {
		return nil, fmt.Errorf("%w: rootfs name %q", ErrBadName, o.Rootfs)
	}
	onExpiry, err := o.checkExtras()
	if err != nil {
		return nil, err
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	if name, err = sessionName(name, id); err != nil {
		return nil, err
	}
	now := time.Now()
	row := &store.Session{ID: id, Name: name, Tenant: tenant, CreatedAt: now, LastUsedAt: now, Network: o.Network, NetRules: encodeRules(o.NetRules), Rootfs: o.Rootfs,
		Env: maps.Clone(o.Env), Metadata: maps.Clone(o.Metadata), ExpiresAt: o.ExpiresAt, OnExpiry: onExpiry}
	return m.materialize(ctx, row, tenant, caps)
}

// List returns the sessions of ctx's tenant, oldest first.
func (m *Manager) List(ctx context.Context) ([]*Session, error) {
	if onlyFrom(ctx) != "" {
		s, err := m.Default(ctx)
		if err != nil {
			return nil, err
		}
		return []*Session{s}, nil
	}
	rows, err := m.store.Sessions(ctx, TenantFrom(ctx))
	if err != nil {
		return nil, err
	}
	out := make([]*Session, len(rows))
	for i, r := range rows {
		out[i] = m.fromRow(r)
	}
	return out, nil
}

// ListEvery returns every tenant's sessions (each with its Tenant): for
// the operator only, which the caller checks. Spares are nobody's yet and
// not listed (as CountAll does not count them).
func (m *Manager) ListEvery(ctx context.Context) ([]*Session, error) {
	rows, err := m.store.AllSessions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*Session, 0, len(rows))
	for _, r := range rows {
		if r.Tenant == SpareTenant {
			continue
		}
		out = append(out, m.fromRow(r))
	}
	return out, nil
}

// Count returns the number of sessions of ctx's tenant.
func (m *Manager) Count(ctx context.Context) (int, error) {
	if onlyFrom(ctx) != "" {
		return 1, nil
	}
	return m.store.CountSessions(ctx, TenantFrom(ctx))
}

// CountAll returns the number of sessions of every tenant (spares, which
// are nobody's yet, are not counted).
func (m *Manager) CountAll(ctx context.Context) (int, error) {
	n, err := m.store.CountAllSessions(ctx)
	if err != nil {
		return 0, err
	}
	spares, err := m.store.CountSessions(ctx, SpareTenant)
	return n - spares, err
}

// ByIDAnyTenant finds session id whatever its tenant. It is for access
// paths that have already authorized the caller through the controller
// (which resolved the id as the caller) and for housekeeping.
func (m *Manager) ByIDAnyTenant(ctx context.Context, id string) (*Session, error) {
	return m.anyByID(ctx, id)
}

// Owners maps the id of every session that is someone's (spares are
// nobody's yet) to its tenant, in one query. It is for access paths that
// must find a session by a credential that names none (E2B's signed URLs
// with E2B_SANDBOX_URL), never for callers.
func (m *Manager) Owners(ctx context.Context) (map[string]string, error) {
	owners, err := m.store.SessionOwners(ctx)
	if err != nil {
		return nil, err
	}
	maps.DeleteFunc(owners, func(_, tenant string) bool { return tenant == SpareTenant })
	return owners, nil
}

// AllTenants lists every tenant's sessions. It is for the service's own
// housekeeping, never for callers.
func (m *Manager) AllTenants(ctx context.Context) ([]*Session, error) {
	ids, err := m.store.AllSessionIDs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*Session, 0, len(ids))
	for _, id := range ids {
		if s, err := m.anyByID(ctx, id); err == nil {
			out = append(out, s)
		}
	}
	return out, nil
}

// Exists reports whether a session with id exists, whatever its tenant.
// It is for the service's own housekeeping, never for callers.
func (m *Manager) Exists(ctx context.Context, id string) bool {
	_, err := m.store.SessionByID(ctx, id)
	return err == nil
}

// touchEvery is how stale a session's recorded last use may get: a
// session used again within it is not written to the database again (a
// write per run would cost a warm run most of its time). The store's
// cached row takes the new time when it is written, so the next lookup's
// LastUsedAt (which this throttle and the idle auto-pause read) is current.
const touchEvery = time.Second

// Touch records that s was used now (to within touchEvery) and makes sure
// its directories exist.
func (m *Manager) Touch(ctx context.Context, s *Session) error {
	if err := m.ensureDirs(s); err != nil {
		return err
	}
	now := time.Now()
	if d := now.Sub(s.LastUsedAt); d >= 0 && d < touchEvery {
		return nil
	}
	s.LastUsedAt = now
	err := m.store.TouchSession(ctx, s.ID, s.LastUsedAt)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, s.ID)
	}
	return err
}

// SetDefault makes s the default session of its tenant.
func (m *Manager) SetDefault(ctx context.Context, s *Session) error {
	return m.store.SetSetting(WithTenant(ctx, s.Tenant), defaultSetting(WithTenant(ctx, s.Tenant)), s.ID)
}

// IsDefault reports whether s is the default session of its tenant.
func (m *Manager) IsDefault(ctx context.Context, s *Session) bool {
	id, err := m.store.Setting(ctx, defaultSetting(WithTenant(ctx, s.Tenant)))
	return err == nil && id == s.ID
}

// SetCwd records the shell's working directory of session id.
func (m *Manager) SetCwd(ctx context.Context, id, cwd string) error {
	return m.wrap(m.store.SetSessionCwd(ctx, id, cwd), id)
}

// Env returns the variables of session id (whatever its tenant) as stored.
func (m *Manager) Env(ctx context.Context, id string) (map[string]string, error) {
	s, err := m.anyByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.Env == nil {
		s.Env = map[string]string{}
	}
	return s.Env, nil
}

// UpdateEnv applies changes to the session's variables: a nil value unsets.
// It returns the new set.
func (m *Manager) UpdateEnv(ctx context.Context, s *Session, changes map[string]*string) (map[string]string, error) {
	for k, v := range changes {
		if !envNameRE.MatchString(k) {
			return nil, fmt.Errorf("%w: variable name %q (letters, digits and _, not starting with a digit)", ErrBadName, k)
		}
		if v != nil && strings.ContainsRune(*v, 0) {
			return nil, fmt.Errorf("%w: the value of %s contains a NUL byte", ErrBadName, k)
		}
	}
	env, err := m.Env(ctx, s.ID)
	if err != nil {
		return nil, err
	}
	for k, v := range changes {
		if v == nil {
			delete(env, k)
		} else {
			env[k] = *v
		}
	}
	if err := m.wrap(m.store.SetSessionEnv(ctx, s.ID, env), s.ID); err != nil {
		return nil, err
	}
	return env, nil
}

// SetLifetime sets when s's lifetime ends (zero: it has none) and what
// happens then (ExpiryDestroy, ExpiryPause; "" keeps s's current action).
func (m *Manager) SetLifetime(ctx context.Context, s *Session, expiresAt time.Time, onExpiry string) error {
	if onExpiry == "" {
		onExpiry = s.OnExpiry
	}
	a, err := expiryAction(onExpiry)
	if err != nil {
		return err
	}
	if err := m.wrap(m.store.SetSessionLifetime(ctx, s.ID, expiresAt, a), s.ID); err != nil {
		return err
	}
	s.ExpiresAt, s.OnExpiry = expiresAt, a
	return nil
}

// SetPaused records whether s is paused (a no-op when it is recorded so).
func (m *Manager) SetPaused(ctx context.Context, s *Session, paused bool) error {
	if s.Paused == paused {
		return nil
	}
	if err := m.wrap(m.store.SetSessionPaused(ctx, s.ID, paused), s.ID); err != nil {
		return err
	}
	s.Paused = paused
	return nil
}

// SetMetadata replaces s's metadata (CheckMetadata).
func (m *Manager) SetMetadata(ctx context.Context, s *Session, md map[string]string) error {
	if err := CheckMetadata(md); err != nil {
		return err
	}
	if err := m.wrap(m.store.SetSessionMetadata(ctx, s.ID, md), s.ID); err != nil {
		return err
	}
	s.Metadata = maps.Clone(md)
	return nil
}

// Expired lists the sessions, of every tenant, whose lifetime ended by
// now, soonest first. It is for the server's own housekeeping.
func (m *Manager) Expired(ctx context.Context, now time.Time) ([]*Session, error) {
	ids, err := m.store.ExpiredSessions(ctx, now)
	if err != nil {
		return nil, err
	}
	out := make([]*Session, 0, len(ids))
	for _, id := range ids {
		if s, err := m.anyByID(ctx, id); err == nil {
			out = append(out, s)
		}
	}
	return out, nil
}

// NextExpiry is the soonest end of a session's lifetime (zero: none).
func (m *Manager) NextExpiry(ctx context.Context) (time.Time, error) {
	return m.store.NextExpiry(ctx)
}

// Delete removes the session's row and its directory, workspace included.
// Stop everything running in it first. It is Forget, then the release
// it returns, run at once.
func (m *Manager) Delete(ctx context.Context, s *Session) error {
	release, err := m.Forget(ctx, s)
	if err != nil {
		return err
	}
	return release()
}

// Forget removes s's row: from now on the session is gone for every
// caller (its name is free, it is counted nowhere). What is left of it on
// the host — its disk image (unmounted, its loop device detached,
// removed), its directory and then its uid — is released by the function
// returned, which the caller runs once: at once (Delete) or in the
// background (Life.Destroy, with Releasing). Until it has run, the
// session's disk keeps its place (AwaitRelease waits for one), and a uid
// reap leaves its directory alone. Its uid stays reserved until no
// process runs under it and the directory is gone (see reapUIDs): a
// process of the session that outlived the stop keeps the uid from being
// given to a new session.
func (m *Manager) Forget(ctx context.Context, s *Session) (release func() error, err error) {
	// Marked releasing before the row goes: a uid reap that sees the
	// session retired leaves its directory to this release.
	m.relMu.Lock()
	if m.releasing == nil {
		m.releasing = map[string]bool{}
	}
	m.releasing[s.ID] = true
	m.pending++
	m.relMu.Unlock()
	if _, err := m.store.DeleteSession(ctx, s.ID); err != nil {
		m.released1(s.ID)
		m.releaseEnded()
		return nil, m.wrap(err, s.ID)
	}
	if h := m.hooks; h != nil && h.Destroyed != nil {
		h.Destroyed(s)
	}
	// The uids of the sessions destroyed before go back in the releases
	// (at most once per reapEvery: a scan of every process on the host,
	// which grows with the sessions open), not here: a destroy answers
	// without it.
	var once sync.Once
	return func() (err error) {
		once.Do(func() {
			defer m.releaseEnded()
			err = m.releaseHost(s)
			m.released1(s.ID)
			if err == nil {
				m.reapDue(context.WithoutCancel(ctx))
			}
		})
		return err
	}, nil
}

// releaseHost frees s's disk and directory.
func (m *Manager) releaseHost(s *Session) error {
	if m.Disk.Release != nil {
		if err := m.Disk.Release(s.Dir); err != nil {
			return fmt.Errorf("session %s: %w", s.Name, err)
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("session %s: remove %s: %w", s.Name, s.Dir, err)
	}
	return nil
}

// reapDue reaps the uids of destroyed sessions when the last reap is
// reapEvery old.
func (m *Manager) reapDue(ctx context.Context) {
	// The uid goes back to the pool once nothing of it is left: a scan of
	// every process on the machine, so at most once per reapEvery however
	// many sessions are destroyed (a uid left reserved is looked at again
	// on the next destroy and the next open).
	m.reapMu.Lock()
	due := time.Since(m.lastReap) >= reapEvery
	if due {
		m.lastReap = time.Now()
	}
	m.reapMu.Unlock()
	if due {
		m.reapUIDs(ctx)
	}
}

// ReapUIDs releases now the uids of destroyed sessions whose releases
// ended and under which no process runs (the releases and the start do
// it on their own, at most once per reapEvery).
func (m *Manager) ReapUIDs(ctx context.Context) {
	m.reapMu.Lock()
	m.lastReap = time.Now()
	m.reapMu.Unlock()
	m.reapUIDs(ctx)
}

// released1 marks the disk and directory of session id released.
func (m *Manager) released1(id string) {
	m.relMu.Lock()
	delete(m.releasing, id)
	m.signalLocked()
	m.relMu.Unlock()
}

// releaseEnded marks one release ended, its uid reap included.
func (m *Manager) releaseEnded() {
	m.relMu.Lock()
	m.pending--
	m.signalLocked()
	m.relMu.Unlock()
}

// signalLocked wakes the waiters for a release (m.relMu held).
func (m *Manager) signalLocked() {
	if m.released != nil {
		close(m.released)
		m.released = nil
	}
}

// releaseChangedLocked is the channel closed at the next change (m.relMu held).
func (m *Manager) releaseChangedLocked() <-chan struct{} {
	if m.released == nil {
		m.released = make(chan struct{})
	}
	return m.released
}

// Releasing is how many destroyed sessions' releases are under way.
func (m *Manager) Releasing() int {
	m.relMu.Lock()
	defer m.relMu.Unlock()
	return len(m.releasing)
}

// AwaitRelease waits until one of the releases under way ends, and
// reports whether one did; false at once when none is under way (or
// when ctx ends first). A create refused a place that a destroyed
// session's disk still holds waits here, not on a clock.
func (m *Manager) AwaitRelease(ctx context.Context) bool {
	m.relMu.Lock()
	if len(m.releasing) == 0 {
		m.relMu.Unlock()
		return false
	}
	ch := m.releaseChangedLocked()
	m.relMu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// WaitReleases waits for every release under way (a server closing).
func (m *Manager) WaitReleases() {
	for {
		m.relMu.Lock()
		if m.pending == 0 {
			m.relMu.Unlock()
			return
		}
		ch := m.releaseChangedLocked()
		m.relMu.Unlock()
		<-ch
	}
}

// isReleasing reports whether session id's release is under way.
func (m *Manager) isReleasing(id string) bool {
	m.relMu.Lock()
	defer m.relMu.Unlock()
	return m.releasing[id]
}

// reapEvery is the least time between two scans for uids to release.
const reapEvery = time.Second

func (m *Manager) wrap(err error, id string) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return err
}

// byID finds session id of ctx's tenant. Another tenant's session is
// reported exactly as a missing one.
func (m *Manager) byID(ctx context.Context, id string) (*Session, error) {
	s, err := m.anyByID(ctx, id)
	if err == nil && s.Tenant != TenantFrom(ctx) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return s, err
}

func (m *Manager) anyByID(ctx context.Context, id string) (*Session, error) {
	row, err := m.store.SessionByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	return m.fromRow(row), nil
}

func (m *Manager) byName(ctx context.Context, name string) (*Session, error) {
	row, err := m.store.SessionByName(ctx, TenantFrom(ctx), name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	return m.fromRow(row), nil
}

func (m *Manager) fromRow(r *store.Session) *Session {
	return &Session{
		ID:         r.ID,
		Name:       r.Name,
		CreatedAt:  r.CreatedAt,
		LastUsedAt: r.LastUsedAt,
		Env:        maps.Clone(r.Env),
		Cwd:        r.Cwd,
		Network:    network(r.Network),
		NetRules:   decodeRules(r.NetRules),
		Rootfs:     r.Rootfs,
		Tenant:     r.Tenant,
		Dir:        filepath.Join(m.root, r.ID),
		UID:        r.UID,
		Metadata:   maps.Clone(r.Metadata),
		ExpiresAt:  r.ExpiresAt,
		OnExpiry:   r.OnExpiry,
		Paused:     r.Paused,
		m:          m,
	}
}

func (m *Manager) ensureDirs(s *Session) error {
	for _, d := range []string{s.Workspace(), s.TmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("session %s: %w", s.Name, err)
		}
	}
	return nil
}

func newID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// network is a stored policy as it applies now: a session stored with
// LegacyFull has "internet".
func network(stored string) string {
	if stored == LegacyFull {
		return "internet"
	}
	return stored
}
