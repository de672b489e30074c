package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/share"
	"github.com/quro-dev/quro/internal/store"
)

// TenantLimits are one tenant's ceilings. In Options.Limits they are the
// defaults; an admin overrides them per tenant (quro tenant limits set),
// kept in the settings table. Zero means "the default"; negative, no
// ceiling.
type TenantLimits struct {
	Memory     int64 `json:"memory_bytes,omitempty"` // all of the tenant's processes together, no swap (kernel: tenant cgroup)
	Tasks      int64 `json:"tasks,omitempty"`        // processes and threads together (kernel: pids.max of the tenant cgroup)
	CPUPercent int64 `json:"cpu_percent,omitempty"`  // CPU quota in percent of one CPU (kernel: CFS quota of the tenant cgroup)
	Sessions   int64 `json:"sessions,omitempty"`     // sessions at once (admission)
	Disk       int64 `json:"disk_bytes,omitempty"`   // disk quota of each session: workspace, tmp and saved outputs (kernel: a btrfs subvolume, or an ext4 image, per session)
	// Runs caps the tenant's calls that run code in flight at once
	// (controller.Limits: a run, a command, terminal input, a process's
	// start); files, kill, status and lists take none.
	Runs int64 `json:"runs_in_flight,omitempty"`
	// Processes caps the background processes (start_process, E2B's
	// commands and PTYs) of all the tenant's sessions together, and
	// SessionProcesses those of one session (proc.Limits).
	Processes        int64 `json:"processes,omitempty"`
	SessionProcesses int64 `json:"processes_per_session,omitempty"`
	// NetworkMax is the most network the tenant's sessions may ask for
	// (none, internet or host; "": the server's --network-max). It never
	// lifts the server's maximum: the effective one is the lower.
	NetworkMax string `json:"network_max,omitempty"`
}

// Default tenant ceilings. Memory, tasks and CPU are derived from the
// machine (DeriveDefaults); these three are what it keeps for a figure
// it cannot read.
const (
	DefaultTenantMemory     = 8 << 30
	DefaultTenantTasks      = 4096
	DefaultTenantCPUPercent = 200
	DefaultDiskQuota        = 2 << 30
	// DefaultRunsPerTenant is how many calls that run code a tenant has
	// in flight at once: as many as the streams one token holds
	// (streamcap.DefaultMax), so that twenty E2B sandboxes each running a
	// command or two at once fit. What those runs use is bounded by the
	// tenant's memory, tasks and CPU ceilings; this bounds the server's
	// work per call (a goroutine, pipes and a sandbox start each).
	DefaultRunsPerTenant = 64
	// DefaultProcessesPerTenant is how many background processes a
	// tenant runs over all its sessions: 20 sandboxes with a dozen each
	// (E2B's users start one or a few per sandbox), below the default
	// tasks ceiling (derived: at least 4096) that bounds them in the
	// kernel anyway.
	DefaultProcessesPerTenant = 256
)

// or fills t's zero fields from def.
func (t TenantLimits) or(def TenantLimits) TenantLimits {
	pick := func(v, d int64) int64 {
		if v == 0 {
			return d
		}
		return v
	}
	network := def.NetworkMax
	if t.NetworkMax != "" && (network == "" || networkRank(t.NetworkMax) < networkRank(network)) {
		network = t.NetworkMax // lower than the default (the server's maximum): never above it
	}
	return TenantLimits{Memory: pick(t.Memory, def.Memory), Tasks: pick(t.Tasks, def.Tasks),
		CPUPercent: pick(t.CPUPercent, def.CPUPercent), Sessions: pick(t.Sessions, def.Sessions), Disk: pick(t.Disk, def.Disk),
		Runs: pick(t.Runs, def.Runs), Processes: pick(t.Processes, def.Processes), SessionProcesses: pick(t.SessionProcesses, def.SessionProcesses),
		NetworkMax: network}
}

// procLimits are l's process limits as the process table takes them
// (none: -1).
func (l TenantLimits) procLimits() proc.Limits {
	none := func(v int64) int {
		if v <= 0 {
			return -1
		}
		return int(v)
	}
	return proc.Limits{Session: none(l.SessionProcesses), Tenant: none(l.Processes)}
}

// How the operator raises the limits of calls and processes, for the
// refusals' messages.
const (
	raiseRuns = "the operator raises it for every tenant with quro serve --runs-per-tenant N, " +
		"for one with quro tenant limits set --runs N (set_tenant_limits runs_in_flight)"
	raiseSessionProcesses = "end one first (signal_process; E2B: kill), or the operator raises the limit for every tenant with " +
		"quro serve --processes-per-session N, for one with quro tenant limits set --processes-per-session N (set_tenant_limits processes_per_session)"
	raiseTenantProcesses = "end one of any of its sessions first (signal_process; E2B: kill), or the operator raises the limit for every tenant with " +
		"quro serve --processes-per-tenant N, for one with quro tenant limits set --processes N (set_tenant_limits processes)"
)

// runsOf is controller.Limits.RunsOf: tenant's cap of calls running code
// in flight (0: none), or why its ceilings cannot be read.
func (a *App) runsOf(ctx context.Context, tenant string) (int, error) {
	l, err := a.tenants.Limits(ctx, tenant)
	return int(max(l.Runs, 0)), err
}

// explainProcessLimit adds to a start refused at a process limit how to
// get past it.
func explainProcessLimit(err error) error {
	var le *proc.LimitError
	if !errors.As(err, &le) {
		return err
	}
	if le.Scope == "tenant" {
		return fmt.Errorf("%w; %s", err, raiseTenantProcesses)
	}
	return fmt.Errorf("%w; %s", err, raiseSessionProcesses)
}

func pos(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

// tenants resolves each run's tenant and ceilings for the sandbox and the
// session manager, and keeps each session on its disk image.
type tenants struct {
	store    *store.Store
	src      atomic.Pointer[TenantLimitsSource] // nil: the store's (source)
	sessions func() *session.Manager
	root     string // $QURO_DATA/sessions
	defaults TenantLimits
	derived  Defaults // the defaults derived from the machine (DeriveDefaults)
	ceilings Defaults // those in force, each with its source (status, quro doctor)
	disks    *quota.Disks
	log      *slog.Logger

	// diskShares are the session disks' places: each image is a loop
	// device of the host's, a host-wide pool, so the server holds at most
	// Limits.SessionDisks and a tenant its share (a quarter).
	diskShares *share.Pool

	mu       sync.Mutex
	ofID     map[string]string // session id → tenant
	diskOf   map[string]string // session directory → tenant whose place its image holds
	noQuotas int               // sessions without an image (made before quotas, or where images fail)
}

func tenantKey(tenant string) string { return "tenant_limits/" + tenant }

// Limits are tenant's effective ceilings, or a *CeilingsUnreadableError
// when its own cannot be read: its runs and new sessions are then refused
// (fail closed), never made under the server's defaults in their place.
func (t *tenants) Limits(ctx context.Context, tenant string) (TenantLimits, error) {
	own, err := t.own(ctx, tenant)
	if err != nil {
		if ctx.Err() == nil {
			// The operator's log keeps the source's error whole; the
			// error the tenant reads has its host paths cut.
			cause := err
			if ce, ok := errors.AsType[*CeilingsUnreadableError](err); ok && ce.cause != nil {
				cause = ce.cause
			}
			t.log.Error("tenant ceilings: runs refused", "tenant", tenant, "err", err, "cause", cause)
		}
		return TenantLimits{}, err
	}
	return own.or(t.defaults), nil
}

// CeilingsUnreadableError says that a tenant's stored ceilings cannot be
// read (the store failed, or the stored value is not what
// set_tenant_limits writes) and how the operator repairs them. It wraps
// sandbox.ErrTenantUnreadable (unavailable, 503) and names no host path.
type CeilingsUnreadableError struct {
	Tenant  string
	Problem string // why, host paths cut
	cause   error  // the source's error whole, for the operator's log
}

func (e *CeilingsUnreadableError) Error() string {
	flag := ""
	if e.Tenant != "" {
		flag = " --tenant " + e.Tenant
	}
	return fmt.Sprintf("%s: its stored ceilings cannot be read (%s), so its runs and new sessions are refused: "+
		"the operator sets them again with quro tenant limits set%s (flags not given: the server's defaults)",
		sandbox.DisplayTenant(e.Tenant), e.Problem, flag)
}

// Unwrap makes errors.Is(err, sandbox.ErrTenantUnreadable) true.
func (e *CeilingsUnreadableError) Unwrap() error { return sandbox.ErrTenantUnreadable }

// TenantLimitsSource is where the tenants' own ceilings are kept, each as
// the JSON set_tenant_limits writes: the data directory's store (a single
// server), or the cluster's API server (quro serve --cluster: a tenant's
// ceilings are the cluster's, not one node's). The tenant-limit layer
// (tenants) reads and writes them through it alone.
type TenantLimitsSource interface {
	// TenantLimits is tenant's stored JSON, ok false when none is stored.
	TenantLimits(ctx context.Context, tenant string) (raw string, ok bool, err error)
	// SetTenantLimits stores raw as tenant's.
	SetTenantLimits(ctx context.Context, tenant, raw string) error
}

// storeSource keeps the ceilings in the store's settings table.
type storeSource struct{ st *store.Store }

func (s storeSource) TenantLimits(ctx context.Context, tenant string) (string, bool, error) {
	v, err := s.st.Setting(ctx, tenantKey(tenant))
	if errors.Is(err, store.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("the store failed: %w", err)
	}
	return v, true, nil
}

func (s storeSource) SetTenantLimits(ctx context.Context, tenant, raw string) error {
	return s.st.SetSetting(ctx, tenantKey(tenant), raw)
}

// TenantOverrides are the ceilings an admin set for tenant in st (zero
// fields: the server's defaults), as overridesFrom reads them.
func TenantOverrides(ctx context.Context, st *store.Store, tenant string) (TenantLimits, error) {
	return overridesFrom(ctx, storeSource{st}, tenant)
}

// overridesFrom are the ceilings an admin set for tenant in src (zero
// fields: the server's defaults). They are read at each use, so that quro
// tenant limits set, from another process or another node, applies to the
// next run. An error says they could not be read (a
// *CeilingsUnreadableError: the source failed, or the stored value is not
// the JSON that set_tenant_limits writes, or holds ceilings it refuses),
// or ctx's own.
func overridesFrom(ctx context.Context, src TenantLimitsSource, tenant string) (TenantLimits, error) {
	v, ok, err := src.TenantLimits(ctx, tenant)
	if err != nil {
		if ctx.Err() != nil {
			return TenantLimits{}, ctx.Err()
		}
		return TenantLimits{}, &CeilingsUnreadableError{Tenant: tenant, Problem: hostpath.Names(err.Error()), cause: err}
	}
	if !ok {
		return TenantLimits{}, nil
	}
	var own TenantLimits
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&own); err != nil || dec.More() {
		if err == nil {
			err = errors.New("more than one value")
		}
		return TenantLimits{}, &CeilingsUnreadableError{Tenant: tenant, Problem: "not the JSON set_tenant_limits writes: " + err.Error()}
	}
	if err := own.check(); err != nil {
		return TenantLimits{}, &CeilingsUnreadableError{Tenant: tenant, Problem: "refused by set_tenant_limits: " + err.Error()}
	}
	return own, nil
}

// check refuses ceilings too small for anything to run (set_tenant_limits'
// bounds).
func (t TenantLimits) check() error {
	switch {
	case t.Disk > 0 && t.Disk < 8<<20:
		return errors.New("a disk quota must be at least 8 MiB")
	case t.Memory > 0 && t.Memory < 64<<20:
		return errors.New("a memory ceiling must be at least 64 MiB")
	case t.Tasks > 0 && t.Tasks < 32:
		return errors.New("a process ceiling must be at least 32")
	case t.NetworkMax != "" && networkRank(t.NetworkMax) < 0:
		return fmt.Errorf("network maximum %q: want none, internet or host", t.NetworkMax)
	}
	return nil
}

// setTenantLimits stores tenant's ceilings (zero fields: the defaults of
// the server; negative: none). A larger disk quota grows the tenant's
// sessions.
func (a *App) setTenantLimits(ctx context.Context, tenant string, l TenantLimits) error {
	return a.tenants.Set(ctx, tenant, l)
}

// tenantLimitsOf are tenant's own ceilings (zero: default) and the
// effective ones, or why its own cannot be read.
func (a *App) tenantLimitsOf(ctx context.Context, tenant string) (own, eff TenantLimits, err error) {
	own, err = a.tenants.own(ctx, tenant)
	if err != nil {
		return TenantLimits{}, TenantLimits{}, err
	}
	return own, own.or(a.tenants.defaults), nil
}

// Set stores tenant's overrides. A larger disk quota grows the tenant's
// existing sessions; a smaller one applies to its new sessions.
func (t *tenants) Set(ctx context.Context, tenant string, l TenantLimits) error {
	if !session.ValidTenant(tenant) {
		return fmt.Errorf("%w: tenant %q", session.ErrBadName, tenant)
	}
	if err := l.check(); err != nil {
		return fmt.Errorf("%w: %w", session.ErrBadName, err)
	}
	if err := t.elsewhere(ctx); err != nil {
		return err
	}
	b, _ := json.Marshal(l)
	if err := t.source().SetTenantLimits(ctx, tenant, string(b)); err != nil {
		return err
	}
	return t.growDisks(ctx, tenant, l)
}

// growDisks grows the disks of tenant's sessions here to its disk quota
// under its own ceilings l.
func (t *tenants) growDisks(ctx context.Context, tenant string, l TenantLimits) error {
	eff := l.or(t.defaults)
	if eff.Disk > 0 && t.disks.Enforced() == nil {
		list, err := t.sessions().List(session.WithTenant(ctx, tenant))
		if err != nil {
			return err
		}
		var errs []error
		for _, s := range list {
			if t.disks.Has(s.Dir) {
				errs = append(errs, t.disks.Grow(s.Dir, eff.Disk))
			}
		}
		return errors.Join(errs...)
	}
	return nil
}

// own are tenant's own ceilings as its source holds them.
func (t *tenants) own(ctx context.Context, tenant string) (TenantLimits, error) {
	return overridesFrom(ctx, t.source(), tenant)
}

// source is where the ceilings are kept: the store unless the cluster
// supplied its own (UseTenantLimitsSource).
func (t *tenants) source() TenantLimitsSource {
	if s := t.src.Load(); s != nil {
		return *s
	}
	return storeSource{t.store}
}

// clusterLimitsKey is the setting that marks a data directory whose
// server is a cluster node: where its tenants' ceilings are (its value,
// "" for none). Another process on the data directory (quro tenant limits
// set in-process) reads it and refuses to set or show the store's, which
// no node reads.
const clusterLimitsKey = "tenant_limits_source"

// UseTenantLimitsSource makes src the one place the tenants' own
// ceilings are read from and written to (quro serve --cluster: the
// cluster's API server, where names it for messages), in place of the
// data directory's store, and marks the data directory so. Called before
// the server serves.
func (a *App) UseTenantLimitsSource(ctx context.Context, src TenantLimitsSource, where string) error {
	a.tenants.src.Store(&src)
	return a.Store.SetSetting(ctx, clusterLimitsKey, where)
}

// UseStoreTenantLimits drops the mark of UseTenantLimitsSource a previous
// server left (quro serve without --cluster on a former node's data
// directory): the store is the source again.
func (a *App) UseStoreTenantLimits(ctx context.Context) error {
	v, err := a.Store.Setting(ctx, clusterLimitsKey)
	if errors.Is(err, store.ErrNotFound) || err == nil && v == "" {
		return nil
	}
	if err != nil {
		return err
	}
	return a.Store.SetSetting(ctx, clusterLimitsKey, "")
}

// elsewhere refuses this process the store's ceilings when the data
// directory's server keeps them elsewhere (UseTenantLimitsSource), so
// that a set here is never silently ignored by the server.
func (t *tenants) elsewhere(ctx context.Context) error {
	if t.src.Load() != nil {
		return nil
	}
	v, err := t.store.Setting(ctx, clusterLimitsKey)
	if err != nil || v == "" {
		return nil //nolint:nilerr // no mark (or none readable): the store is the source
	}
	return capability.Errorf(capability.InvalidArgument,
		"this data directory's server keeps the tenants' ceilings in %s, not here: set and show them through the server "+
			"(quro tenant limits set or show --server http://127.0.0.1:7070 on its host or in its pod, or any node with the operator's token)", v)
}

// TenantLimitsChanged applies tenant's ceilings, changed by another
// node, to what they bound here at once: a larger disk quota grows the
// tenant's sessions here, as set_tenant_limits does on the node that
// took it (the other ceilings are read at each run and create).
func (a *App) TenantLimitsChanged(ctx context.Context, tenant string) {
	own, err := a.tenants.own(ctx, tenant)
	if err == nil {
		err = a.tenants.growDisks(ctx, tenant, own)
	}
	if err != nil && ctx.Err() == nil {
		a.tenants.log.Warn("tenant ceilings changed in the cluster: applying them here failed", "tenant", tenant, "err", err)
	}
}

// TenantOwnLimits are tenant's own ceilings (zero fields: this server's
// defaults; negative: none), or why they cannot be read.
func (a *App) TenantOwnLimits(ctx context.Context, tenant string) (TenantLimits, error) {
	return a.tenants.own(ctx, tenant)
}

// tenantOf finds the tenant of session id.
func (t *tenants) tenantOf(id string) (string, bool) {
	t.mu.Lock()
	tenant, ok := t.ofID[id]
	t.mu.Unlock()
	if ok {
		return tenant, true
	}
	s, err := t.sessions().ByIDAnyTenant(context.Background(), id)
	if err != nil {
		return "", false
	}
	t.mu.Lock()
	t.ofID[id] = s.Tenant
	t.mu.Unlock()
	return s.Tenant, true
}

// remember records the tenant of session id before its row says so (a
// spare's box belongs to the tenant it is made for).
func (t *tenants) remember(id, tenant string) {
	t.mu.Lock()
	t.ofID[id] = tenant
	t.mu.Unlock()
}

// forget drops session id from the tenant map once the session is gone
// (a server that had a thousand sessions kept a thousand entries).
func (t *tenants) forget(id string) {
	t.mu.Lock()
	delete(t.ofID, id)
	t.mu.Unlock()
}

// sessionDir is the session directory holding dir, if dir is in one.
func (t *tenants) sessionDir(dir string) (id, sdir string, ok bool) {
	rel, err := filepath.Rel(t.root, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", "", false
	}
	id = strings.SplitN(rel, string(filepath.Separator), 2)[0]
	return id, filepath.Join(t.root, id), true
}

// forRun is sandbox.Options.Tenant: the tenant of a run in dir.
func (t *tenants) forRun(dir string) (sandbox.Tenant, bool) {
	id, sdir, ok := t.sessionDir(dir)
	if !ok {
		return sandbox.Tenant{}, false
	}
	// Another process (a CLI that stopped) may have unmounted the
	// session's image: a run never writes beneath it.
	if err := t.disks.Remount(sdir); err != nil {
		return sandbox.Tenant{}, false
	}
	tenant, ok := t.tenantOf(id)
	if !ok {
		return sandbox.Tenant{}, false
	}
	l, err := t.Limits(context.Background(), tenant)
	if err != nil {
		return sandbox.Tenant{Name: tenant, Refused: err}, true
	}
	return sandbox.Tenant{Name: tenant, Limits: sandbox.Limits{Memory: pos(l.Memory), Tasks: pos(l.Tasks), CPUPercent: pos(l.CPUPercent)}}, true
}

// note is sandbox.Options.Note: what to tell a run whose disk is full.
func (t *tenants) note(dir string) string {
	if _, sdir, ok := t.sessionDir(dir); ok {
		return t.disks.Note(sdir)
	}
	return ""
}

// maxSessions is session.Manager.MaxFor. A tenant whose ceilings cannot
// be read is refused by prepare, which every new session goes through.
func (t *tenants) maxSessions(tenant string) int {
	l, _ := t.Limits(context.Background(), tenant)
	return int(pos(l.Sessions))
}

// prepare is session.Manager.Disk.Prepare: a new session gets an image
// of its tenant's disk quota.
func (t *tenants) prepare(tenant, dir string) error {
	l, err := t.Limits(context.Background(), tenant)
	if err != nil {
		return err
	}
	size := l.Disk
	if size <= 0 || t.disks.Enforced() != nil {
		return nil //nolint:nilerr // no kernel quota here (the status says why): the session goes without an image
	}
	t.awaitDiskRelease(tenant)
	if err := t.diskShares.Acquire(tenant); err != nil { // counts the refusal (Stats)
		return diskFull(err)
	}
	if err := t.disks.Create(dir, size); err != nil {
		t.diskShares.Release(tenant)
		return err
	}
	t.holdDisk(dir, tenant)
	return nil
}

// diskRoom refuses tenant, whose disk quota per session is disk, one
// more session disk when its share of them, or the server's cap, is
// held: prepare's check, without taking the place or counting a
// refusal (a node asked whether it would take a moved session answers
// with it). A destroyed session's image keeps its place until the
// destroy's background release has removed it: a session refused only
// for those waits for the releases under way (each ends in the time an
// unmount takes), not on a clock, and is refused when none is left.
// Sessions here get no image (no disk quota, or no kernel quota): no
// refusal.
func (t *tenants) diskRoom(tenant string, disk int64) error {
	if disk <= 0 || t.disks.Enforced() != nil {
		return nil //nolint:nilerr // no kernel quota here (the status says why): the session goes without an image
	}
	t.awaitDiskRelease(tenant)
	if err := t.diskShares.Check(tenant); err != nil {
		return diskFull(err)
	}
	return nil
}

// awaitDiskRelease waits, while tenant would be refused a session disk,
// for the destroys' releases under way (diskRoom).
func (t *tenants) awaitDiskRelease(tenant string) {
	for t.diskShares.Check(tenant) != nil && t.sessions().AwaitRelease(context.Background()) {
	}
}

// diskFull is a refusal of the session disks' pool as a session ceiling
// (session.ErrLimit: resource_exhausted), with what to do.
func diskFull(err error) error {
	return fmt.Errorf("%w: %v (each is a loop device of the host's; the server's cap is quro serve --max-session-disks, by default one per session of its session ceiling, a tenant's share its session ceiling, or a quarter of a cap set): destroy a session you no longer need",
		session.ErrLimit, err)
}

// holdDisk records that dir's image holds a place of tenant's.
func (t *tenants) holdDisk(dir, tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.diskOf[dir] = tenant
}

// releaseDisk gives back the place dir's image held, if it held one.
func (t *tenants) releaseDisk(dir string) {
	t.mu.Lock()
	tenant, ok := t.diskOf[dir]
	delete(t.diskOf, dir)
	t.mu.Unlock()
	if ok {
		t.diskShares.Release(tenant)
	}
}

// release is session.Manager.Disk.Release. An image not removed keeps
// its place (its loop device may still be bound).
func (t *tenants) release(dir string) error {
	if !t.disks.Has(dir) {
		t.releaseDisk(dir)
		return nil
	}
	if err := t.disks.Remove(dir); err != nil {
		return err
	}
	t.releaseDisk(dir)
	return nil
}

// adopt runs at start: every session's image is mounted again, and a
// session without one (made before quotas, such as the default session
// Open just made) gets one when its directory holds nothing yet; the
// others keep running without a kernel quota, counted in the status.
func (t *tenants) adopt(ctx context.Context) error {
	if t.disks.Enforced() != nil {
		return nil //nolint:nilerr // no kernel quota here (the status says why): no image to mount
	}
	list, err := t.sessions().AllTenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	none := 0
	for _, s := range list {
		l, lerr := TenantLimits{}, error(nil)
		if !t.disks.Has(s.Dir) {
			l, lerr = t.Limits(ctx, s.Tenant)
		}
		switch {
		case t.disks.Has(s.Dir):
			// A place past the caps if need be: the session exists.
			t.diskShares.Adopt(s.Tenant)
			t.holdDisk(s.Dir, s.Tenant)
			errs = append(errs, t.disks.Remount(s.Dir))
		case lerr != nil:
			none++ // its quota is unknown (logged): its runs are refused
		case emptySession(s):
			size := l.Disk
			if size <= 0 {
				continue
			}
			t.diskShares.Adopt(s.Tenant)
			if err := t.disks.Create(s.Dir, size); err != nil {
				t.diskShares.Release(s.Tenant)
				errs = append(errs, err)
				none++
				continue
			}
			t.holdDisk(s.Dir, s.Tenant)
			for _, d := range []string{s.Workspace(), s.TmpDir()} {
				errs = append(errs, mkdir(d))
			}
		default:
			none++
		}
	}
	t.mu.Lock()
	t.noQuotas = none
	t.mu.Unlock()
	return errors.Join(errs...)
}

// admit refuses an exec call of a tenant at its memory or process ceiling
// with resource_exhausted (HTTP 429) and what to do, and one of a tenant
// whose ceilings cannot be read with unavailable (503) and the fix.
func (a *App) admit(ctx context.Context, s *session.Session) error {
	t, ok := a.tenants.forRun(s.Workspace())
	if !ok {
		return nil
	}
	return a.admitTenant(t, sandbox.Room{})
}

// admitSession refuses a new session of ctx's tenant, at once, when its
// memory or process ceiling leaves no room for what an idle session holds
// (its box and worker): made anyway, the session's processes would be
// OOM-killed or stall in reclaim, and so would the tenant's others.
func (a *App) admitSession(ctx context.Context) error {
	return a.admitSessionOf(ctx, session.TenantFrom(ctx))
}

// admitSessionOf is admitSession for tenant (a moved session's, which
// is not the caller's).
func (a *App) admitSessionOf(ctx context.Context, tenant string) error {
	l, err := a.tenants.Limits(ctx, tenant)
	if err != nil {
		return err
	}
	t := sandbox.Tenant{Name: tenant, Limits: sandbox.Limits{Memory: pos(l.Memory), Tasks: pos(l.Tasks), CPUPercent: pos(l.CPUPercent)}}
	return a.admitTenant(t, sandbox.Room{Memory: sessionMemory, Tasks: sessionTasks})
}

// How the operator raises a tenant's memory and process ceilings.
var raiseCeiling = map[string]string{
	"memory": "the operator raises it for every tenant with quro serve --tenant-memory SIZE, for one with quro tenant limits set --memory SIZE (set_tenant_limits memory_bytes)",
	"tasks":  "the operator raises it for every tenant with quro serve --tenant-tasks N, for one with quro tenant limits set --tasks N (set_tenant_limits tasks)",
}

func (a *App) admitTenant(t sandbox.Tenant, room sandbox.Room) error {
	if t.Refused != nil {
		return t.Refused // its ceilings cannot be read: unavailable, with the fix
	}
	var ce *sandbox.CeilingError
	if err := a.Sandbox.AdmitWith(t, room); errors.As(err, &ce) {
		a.Metrics.TenantRefusal(ce.Ceiling)
		msg := ce.Message
		if h := raiseCeiling[ce.Ceiling]; h != "" {
			msg += "; " + h
		}
		e := capability.Errorf(capability.ResourceExhausted, "%s", msg)
		e.RetryAfter = 30
		return e
	}
	return nil
}

// sessionLimitHint is session.Manager.LimitHint: how the operator raises
// a session ceiling, and where the server's came from.
func (t *tenants) sessionLimitHint(scope string) string {
	if scope == "server" {
		return fmt.Sprintf("the operator raises it with quro serve --max-sessions N (the default, %d, is derived from %s)",
			t.derived.Sessions, t.derived.From["sessions"])
	}
	return "the operator raises it for every tenant with quro serve --max-sessions-per-tenant N, for one with quro tenant limits set --sessions N (set_tenant_limits sessions)"
}

// gauges counts, over every tenant and session, those at a ceiling.
func (a *App) tenantGauges() metrics.TenantGauges {
	var g metrics.TenantGauges
	ctx := context.Background()
	list, err := a.Sessions.AllTenants(ctx)
	if err != nil {
		return g
	}
	seen := map[string]bool{}
	for _, s := range list {
		if s.Tenant == session.SpareTenant {
			continue // nobody's yet: counted once claimed
		}
		if u, ok := a.tenants.disks.Usage(s.Dir); !ok {
			g.DisksNone++
		} else if u.Full() {
			g.DisksFull++
		} else {
			g.DisksOK++
		}
		if seen[s.Tenant] {
			continue
		}
		seen[s.Tenant] = true
		t, ok := a.tenants.forRun(s.Workspace())
		if !ok {
			continue
		}
		var ce *sandbox.CeilingError
		if errors.As(a.Sandbox.Admit(t), &ce) {
			if ce.Ceiling == "memory" {
				g.AtMemoryCeiling++
			} else {
				g.AtTaskCeiling++
			}
		}
	}
	return g
}

func mkdir(d string) error { return os.MkdirAll(d, 0o755) }

// emptySession reports whether s's directory holds nothing but empty
// workspace and tmp directories (a session just made), and removes those
// so that an image can be mounted there.
func emptySession(s *session.Session) bool {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Name() != "workspace" && e.Name() != "tmp" || !e.IsDir() {
			return false
		}
		if sub, err := os.ReadDir(filepath.Join(s.Dir, e.Name())); err != nil || len(sub) > 0 {
			return false
		}
	}
	for _, e := range ents {
		os.Remove(filepath.Join(s.Dir, e.Name()))
	}
	return true
}

// TenantStatus is a tenant's ceilings and what it uses now.
type TenantStatus struct {
	Tenant string       `json:"tenant"`
	Limits TenantLimits `json:"limits" jsonschema:"effective ceilings; 0 or negative: none"`
	// Unreadable says why the tenant's stored ceilings cannot be read
	// (its runs and new sessions are refused until the operator sets them
	// again); Limits is then empty.
	Unreadable string `json:"unreadable,omitempty" jsonschema:"why the tenant's stored ceilings cannot be read: its runs and new sessions are refused until the operator sets them again"`
	// Now: what the tenant's processes and sessions hold.
	MemoryBytes     uint64   `json:"memory_bytes" jsonschema:"memory of all the tenant's processes that reclaim cannot give back: resident and shared memory and the kernel memory of their boxes (page cache excluded)"`
	MemoryPeakBytes uint64   `json:"memory_peak_bytes,omitempty"`
	Tasks           uint64   `json:"tasks" jsonschema:"processes and threads of the tenant"`
	Sessions        int      `json:"sessions"`
	DiskUsedBytes   int64    `json:"disk_used_bytes" jsonschema:"bytes used on the tenant's session disks"`
	DiskFullIn      []string `json:"disk_full_sessions,omitempty" jsonschema:"sessions whose disk quota is full"`
	DiskQuota       string   `json:"disk_quota" jsonschema:"how the disk quota is enforced here"`
	Enforced        bool     `json:"kernel_enforced" jsonschema:"memory, process and CPU ceilings are enforced by the kernel (cgroups)"`
	// The tenant's watches (watch_dir, E2B's watchers) and their caps.
	Watches        int `json:"watches" jsonschema:"watches the tenant runs now"`
	WatchesMax     int `json:"watches_max" jsonschema:"the most watches one tenant runs at once"`
	WatchedDirs    int `json:"watched_dirs" jsonschema:"directories the tenant's watches watch now"`
	WatchedDirsMax int `json:"watched_dirs_max" jsonschema:"the most directories one tenant's watches watch at once"`
	// The tenant's calls running code and its background processes now
	// (their limits are in Limits).
	RunsInFlight int `json:"runs_in_flight" jsonschema:"calls of the tenant running code now (limit: limits.runs_in_flight)"`
	Processes    int `json:"processes" jsonschema:"background processes of all the tenant's sessions now (limit: limits.processes)"`
}

// tenantStatus reports the ceilings and usage of ctx's tenant.
func (a *App) tenantStatus(ctx context.Context) (*TenantStatus, error) {
	tenant := session.TenantFrom(ctx)
	list, err := a.Sessions.List(ctx)
	if err != nil {
		return nil, err
	}
	st := &TenantStatus{Tenant: tenant, Sessions: len(list), DiskQuota: a.tenants.disks.Method()}
	if st.Limits, err = a.tenants.Limits(ctx, tenant); err != nil {
		st.Unreadable = err.Error()
	}
	st.Watches, st.WatchedDirs = a.watchHub.Tenant(tenant)
	st.RunsInFlight, st.Processes = a.Controller.RunsInFlight(tenant), a.procs.TenantCount(tenant)
	wl := a.watchHub.Limits()
	st.WatchesMax, st.WatchedDirsMax = wl.TenantWatches, wl.TenantDirs
	if u, ok := a.Sandbox.TenantUsage(tenant); ok {
		st.Enforced = true
		st.MemoryBytes, st.MemoryPeakBytes, st.Tasks = u.Memory, u.MemoryPeak, u.Tasks
	}
	for _, s := range list {
		if u, ok := a.tenants.disks.Usage(s.Dir); ok {
			st.DiskUsedBytes += u.Used
			if u.Full() {
				st.DiskFullIn = append(st.DiskFullIn, s.Name)
			}
		}
	}
	return st, nil
}

// Text is a few lines about the tenant's ceilings and usage.
func (t *TenantStatus) Text() string {
	lim := func(v int64, f func(int64) string) string {
		if v <= 0 {
			return "none"
		}
		return f(v)
	}
	num := func(v int64) string { return fmt.Sprint(v) }
	s := fmt.Sprintf("%s: memory %s of %s, processes %d of %s, CPU %s%%, sessions %d of %s, disk %s used, %s per session (%s)",
		sandbox.DisplayTenant(t.Tenant), quota.Human(int64(t.MemoryBytes)), lim(t.Limits.Memory, quota.Human), t.Tasks, lim(t.Limits.Tasks, num),
		lim(t.Limits.CPUPercent, num), t.Sessions, lim(t.Limits.Sessions, num), quota.Human(t.DiskUsedBytes), lim(t.Limits.Disk, quota.Human), t.DiskQuota)
	s += fmt.Sprintf(", runs in flight %d of %s, background processes %d of %s (%s per session)",
		t.RunsInFlight, lim(t.Limits.Runs, num), t.Processes, lim(t.Limits.Processes, num), lim(t.Limits.SessionProcesses, num))
	if t.WatchesMax > 0 {
		s += fmt.Sprintf(", watches %d of %d (%d of %d directories)", t.Watches, t.WatchesMax, t.WatchedDirs, t.WatchedDirsMax)
	}
	if len(t.DiskFullIn) > 0 {
		s += "; disk full in: " + strings.Join(t.DiskFullIn, ", ")
	}
	if !t.Enforced {
		s += "; memory, process and CPU ceilings are NOT enforced here (no cgroups)"
	}
	if t.Unreadable != "" {
		s += "; " + t.Unreadable
	}
	return s
}

// TenantLimitsInput is get_tenant_limits' input.
type TenantLimitsInput struct {
	Tenant string `json:"tenant,omitempty" jsonschema:"the tenant; default: your own. Only the operator (an admin of the local tenant) names another"`
}

// SetTenantLimitsInput is set_tenant_limits' input: the tenant's ceilings,
// all of them (a field left out or 0 is the server's default again).
type SetTenantLimitsInput struct {
	Tenant     string `json:"tenant,omitempty" jsonschema:"the tenant whose ceilings to set (\"\" or omitted: the local tenant)"`
	Memory     int64  `json:"memory_bytes,omitempty" jsonschema:"memory of all of the tenant's processes together, no swap, in bytes (at least 64 MiB; 0: the default; negative: none)"`
	Tasks      int64  `json:"tasks,omitempty" jsonschema:"processes and threads of the tenant together (at least 32; 0: the default; negative: none)"`
	CPUPercent int64  `json:"cpu_percent,omitempty" jsonschema:"CPU of the tenant together, in percent of one CPU (0: the default; negative: none)"`
	Sessions   int64  `json:"sessions,omitempty" jsonschema:"sessions of the tenant at once (0: the default; negative: none)"`
	Disk       int64  `json:"disk_bytes,omitempty" jsonschema:"disk quota of each session of the tenant, in bytes (at least 8 MiB; 0: the default; negative: none)"`
	Runs       int64  `json:"runs_in_flight,omitempty" jsonschema:"calls of the tenant running code at once: runs, commands, terminal input, process starts (0: the default; negative: none)"`
	Processes  int64  `json:"processes,omitempty" jsonschema:"background processes (start_process, E2B commands and PTYs) of all the tenant's sessions together (0: the default; negative: none)"`
	// SessionProcesses caps one session's background processes.
	SessionProcesses int64  `json:"processes_per_session,omitempty" jsonschema:"background processes of one session of the tenant (0: the default; negative: none)"`
	NetworkMax       string `json:"network_max,omitempty" jsonschema:"the most network the tenant's sessions may ask for: none, internet or host (omitted: the server's quro serve --network-max, which it never lifts)"`
}

// TenantLimitsInfo is what get_tenant_limits and set_tenant_limits answer.
type TenantLimitsInfo struct {
	Tenant    string       `json:"tenant"`
	Own       TenantLimits `json:"own" jsonschema:"the ceilings set for this tenant (absent or 0: the server's default; negative: none)"`
	Effective TenantLimits `json:"effective" jsonschema:"the ceilings that apply (absent or negative: none)"`
	// Unreadable says why the stored ceilings cannot be read; Own and
	// Effective are then empty, and the tenant's runs are refused.
	Unreadable string `json:"unreadable,omitempty" jsonschema:"why the tenant's stored ceilings cannot be read: its runs and new sessions are refused until the operator sets them again"`
}

// Text says the effective ceilings.
func (t *TenantLimitsInfo) Text() string {
	if t.Unreadable != "" {
		return t.Unreadable
	}
	e := t.Effective
	bytes := func(v int64) string {
		if v <= 0 {
			return "none"
		}
		return quota.Human(v)
	}
	num := func(v int64) string {
		if v <= 0 {
			return "none"
		}
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("tenant %q: memory %s, tasks %s, cpu %s%%, sessions %s, disk per session %s, runs in flight %s, background processes %s (%s per session), network at most %s",
		t.Tenant, bytes(e.Memory), num(e.Tasks), num(e.CPUPercent), num(e.Sessions), bytes(e.Disk), num(e.Runs), num(e.Processes), num(e.SessionProcesses), e.NetworkMax)
}

// tenantLimitsInfo answers get_tenant_limits: ceilings that cannot be read
// are reported as such (the operator reads why, and quro tenant limits set
// starts again from the defaults), not as an error.
func (a *App) tenantLimitsInfo(ctx context.Context, tenant string) (*TenantLimitsInfo, error) {
	if err := a.tenants.elsewhere(ctx); err != nil {
		return nil, err
	}
	own, eff, err := a.tenantLimitsOf(ctx, tenant)
	var ue *CeilingsUnreadableError
	if errors.As(err, &ue) {
		return &TenantLimitsInfo{Tenant: tenant, Unreadable: ue.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	return &TenantLimitsInfo{Tenant: tenant, Own: own, Effective: eff}, nil
}

// registerTenantLimits declares get_tenant_limits (a tenant reads its own
// ceilings) and set_tenant_limits (the operator's alone: a tenant's
// ceilings protect the other tenants, so no tenant raises its own).
func (a *App) registerTenantLimits(reg *capability.Registry) {
	reg.Register(capability.New("get_tenant_limits",
		"Show a tenant's ceilings: memory, processes and CPU of all its processes together, sessions at once, disk per session, "+
			"calls running code at once, background processes (of the tenant, of one session) and the most network its sessions may ask for, "+
			"as set for it (own) and as they apply (effective). Your own tenant's; the operator (an admin of the local tenant) may name any tenant.",
		capability.ScopeRead, func(ctx context.Context, in TenantLimitsInput) (*TenantLimitsInfo, error) {
			c, ok := controller.CallerFrom(ctx)
			if !ok {
				return nil, capability.Errorf(capability.PermissionDenied, "no caller")
			}
			tenant, err := forTenant(c, in.Tenant, "reading")
			if err != nil {
				return nil, err
			}
			return a.tenantLimitsInfo(ctx, tenant)
		}))
	reg.Register(capability.New("set_tenant_limits",
		"Set a tenant's ceilings (the operator's alone: an admin of the local tenant, e.g. quro tenant limits set on the server's host). "+
			"The input is the whole set: a field left out or 0 is the server's default, a negative one no ceiling. "+
			"They apply to the tenant's next runs; a larger disk quota also grows its existing sessions. Needs scope admin.",
		capability.ScopeAdmin, func(ctx context.Context, in SetTenantLimitsInput) (*TenantLimitsInfo, error) {
			c, ok := controller.CallerFrom(ctx)
			if !ok || !operator(c) {
				return nil, capability.Errorf(capability.PermissionDenied,
					"a tenant's ceilings are set by the operator (an admin of the local tenant, e.g. quro tenant limits set on the server's host)")
			}
			l := TenantLimits{Memory: in.Memory, Tasks: in.Tasks, CPUPercent: in.CPUPercent, Sessions: in.Sessions, Disk: in.Disk,
				Runs: in.Runs, Processes: in.Processes, SessionProcesses: in.SessionProcesses, NetworkMax: in.NetworkMax}
			if err := a.tenants.Set(ctx, in.Tenant, l); err != nil {
				return nil, err
			}
			return a.tenantLimitsInfo(ctx, in.Tenant)
		}))
}
