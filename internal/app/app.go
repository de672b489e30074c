// Package app assembles one running Quro: it opens the data directory and
// store, the session manager, the sandbox, the engines and their chains, and
// declares the capabilities on a controller. Every access path (REST, the
// WebSocket, MCP, the in-session socket, the CLI) is built on an App and
// calls capabilities through its Controller; nothing else wires parts.
//
// The capabilities are declared one file per domain (sessions.go,
// files.go, boxes.go, snapshots.go, packages.go, python_run.go, js.go,
// tokens.go, tenants.go, rootfs_caps.go, terminal_open.go, audit.go, and
// capabilities.go for run_code and the service). A handler checks its
// input, calls the package it drives and shapes the result; it returns
// domain errors, which the controller classifies. App starts no process
// itself.
package app

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/insession"
	"github.com/quro-dev/quro/internal/audit"
	"github.com/quro-dev/quro/internal/auth"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/engine/node"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/engine/shell"
	"github.com/quro-dev/quro/internal/engine/toolchain"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/render"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/share"
	"github.com/quro-dev/quro/internal/store"
	"github.com/quro-dev/quro/internal/terminal"
	"github.com/quro-dev/quro/internal/workspace"
)

// Options configure an App; nil or zero fields take the defaults.
type Options struct {
	Logger  *slog.Logger
	Run     *runcode.Options
	Sandbox *sandbox.Options
	JS      *js.Options // nil: defaults (64 MiB, no network)
	Python  *python.EmbeddedOptions
	Limits  Limits
	// AuditKeep is how many audit entries are kept (default 100000).
	AuditKeep int64
	// AutoPause pauses a session's box after it was unused this long
	// (0: DefaultAutoPause; negative: never).
	AutoPause time.Duration
	// DestroyGrace bounds how long a destroy waits for the calls it
	// canceled in the session before it ends the box under them (0:
	// session.DestroyGrace).
	DestroyGrace time.Duration
	// ProcessStartWindow is how long start_process with background:true
	// waits for the process to end before it answers that it runs, so
	// that a process that fails at once is reported with its exit code
	// and output (0: DefaultProcessStartWindow).
	ProcessStartWindow time.Duration
	// PrestartPython starts a new session's Python worker (in its box)
	// as the session is created, so that its first Python run finds it
	// ready (quro serve sets it; it costs a worker per session).
	PrestartPython bool
	// SpareSessions is how many spare sessions are kept ready per box
	// template (tenant, its limits, network policy; see spare.go): each
	// is a session box with a started Python worker, made in the
	// background, that create_session claims, so that the new session's
	// first Python run finds both ready. Each costs a box and a worker
	// (about 12 MiB PSS) while it waits. 0: none (quro serve keeps 1).
	// This is the floor: the pool grows past it under a burst and shrinks
	// back to it when idle (spare.go).
	SpareSessions int
	// MaxSpareSessions bounds the spare sessions of every template
	// together, ready and being made, however the pool grows (0:
	// DefaultMaxSpareSessions of the machine's memory; negative: the pool
	// keeps SpareSessions per template and never grows).
	MaxSpareSessions int
	// SparesPerTenant bounds one tenant's spares (0: a quarter of
	// MaxSpareSessions, share.Of), so that one tenant's burst cannot
	// take every spare of the server.
	SparesPerTenant int
	// Pip configures pip in the sessions and the server's fetches.
	Pip PipOptions
	// Network is the operator's network settings (network.go).
	Network NetworkOptions
	// Observers are told of every call after the audit log and the
	// metrics (tests watch calls with them).
	Observers []controller.Observer
	// InSession, when set, gives every session's boxes a socket of that
	// session's (InSessionServer), so that its code calls back (quro
	// call, pip and apt-get through the server) as its own session. nil:
	// none.
	InSession *InSessionOptions
	// diskImages keeps the sessions' disks to the ext4 images (the
	// fallback of a machine without btrfs, or a data directory of
	// before): its tests.
	diskImages bool
	// rootfsInstaller replaces debootstrap for python_run's install on
	// first use (nil: debootstrap): its tests, each with an installer of
	// its own (an option, not a package variable, so that they run in
	// parallel).
	rootfsInstaller rootfs.Installer
}

// InSessionOptions configure the in-session sockets.
type InSessionOptions struct {
	// Handler is what the sockets serve, built over the App's controller
	// and sessions (quro serve: the REST API with insession.Resolver's
	// authentication). It is called once, by New.
	Handler func(ctrl *controller.Controller, sessions *session.Manager) http.Handler
	// MaxConns is the most connections all sockets hold together (0:
	// insession's default).
	MaxConns int
}

// Limits bound the tenants. Zero fields take the defaults that
// DeriveDefaults derives from Machine; negative ones are no cap.
type Limits struct {
	// Machine is what the defaults are derived from (nil: ReadMachine,
	// this host's figures; tests give others).
	Machine *Machine
	// Sessions caps the sessions of all tenants together (default
	// Defaults.Sessions) and SessionsPerTenant one tenant's (default
	// Defaults.SessionsPerTenant); negative: no cap.
	Sessions          int
	SessionsPerTenant int
	RunsPerTenant     int // calls running code in flight (TenantLimits.Runs), default DefaultRunsPerTenant (64); negative: no cap
	// ProcessesPerSession and ProcessesPerTenant cap the background
	// processes of a session (default proc.DefaultMax, 64) and of all of
	// a tenant's sessions (default DefaultProcessesPerTenant); negative:
	// no cap. Limits.Tenant's fields, when set, win over these three.
	ProcessesPerSession int
	ProcessesPerTenant  int
	// Tenant are the default ceilings of every tenant (see TenantLimits;
	// zero fields: the derived Defaults' Memory, Tasks and CPUPercent,
	// DefaultDiskQuota; negative: none). An admin overrides them per
	// tenant (quro tenant limits set).
	Tenant TenantLimits
	// Snapshots caps the snapshots one tenant holds (default 32) and
	// SnapshotBytes their bytes (default 8 GiB); negative: no cap.
	Snapshots     int
	SnapshotBytes int64
	// SessionDisks caps the sessions' disk images of all tenants together
	// (default Defaults.SessionDisks, one per session; negative: no cap):
	// each is mounted on a loop device, and the host's loop devices are
	// one pool for every process. A tenant's share is its session
	// ceiling's default; past it, or past the cap, a new session is
	// refused with resource_exhausted.
	SessionDisks int
	// Watch caps the watches (watch_dir, E2B's watchers), per tenant and
	// for the server; zero fields are derived from the host's inotify
	// limits (workspace.HubLimits).
	Watch workspace.HubLimits
}

// App is one assembled Quro. Close it when done.
//
// Every change of state goes through Controller.Call, which checks the
// caller's scope, confines it to its tenant and records the call in the
// audit log. The parts below it (Store, Sessions, Sandbox, Runner,
// Terminals, Python) are exported for an access path's wiring
// (quro serve: the in-session server, the token check, the WebSocket
// terminal) and for tests and benchmarks that set up state; a command
// never uses them (cmd/quro's TestBypassNoPartsOutsideTheController
// fails on one that does). The audit log and the token table are not
// exported at all: tokens change through create_token and revoke_token
// only, besides the first admin token (EnsureAdminToken).
type App struct {
	moved      movedNotes // sessions moved here whose next call is told so
	DataDir    string
	Store      *store.Store
	Sessions   *session.Manager
	Sandbox    *sandbox.Sandbox
	Runner     *runcode.Runner
	Controller *controller.Controller
	Terminals  *terminal.Manager
	// Events is the bus of live call events the controller publishes to
	// (the web UI's timeline, GET /v1/events).
	Events *events.Bus
	Python *python.Embedded // tier 1 of the Python chain: resident workers
	// PythonRootfs is tier 2: resident workers of the sessions on a rootfs.
	PythonRootfs *python.RootfsWorker
	Metrics      *metrics.Metrics // Prometheus metrics of this App (serve mounts Metrics.Handler)
	Log          *slog.Logger
	Started      time.Time
	// InSession serves the sessions' sockets (Options.InSession; nil
	// without): quro serve reads its connection counts.
	InSession *insession.Server

	auditLog  *audit.Log   // written by the controller's observer; read by get_audit_log
	tokens    *auth.Tokens // changed by create_token and revoke_token (tokens.go) alone
	isolation func() []sandbox.Feature
	tenants   *tenants
	limits    Limits
	network   NetworkOptions // Options.Network, defaults filled
	// egress is the way out of boxes under "internet" (egress.go), and
	// netPolicies the sessions' policies it applies.
	egress      *boxEgress
	netPolicies *netPolicies
	secrets     *sessionSecrets
	preview     previewKey   // the preview URLs' secret (preview.go)
	public      publicPorts  // the sessions' public ports (preview.go)
	js          *js.Engine   // its prepared VMs are freed by Close
	node        *node.Engine // the sessions' Node workers, stopped by Close
	procs       *proc.Table  // the sessions' background processes (processes.go)
	boxFiles    boxFiles     // the sessions' file helpers for box paths (boxfiles.go)
	// boxFilesTimeout bounds one box file operation (0: boxFilesTimeout;
	// tests shorten it).
	boxFilesTimeout time.Duration
	startWindow     time.Duration // Options.ProcessStartWindow, default filled
	contexts        codeContexts  // code contexts of every session (contexts.go)

	lives          *session.Life    // the sessions' states, entries and teardown (boxes.go)
	watches        watchSlots       // watch_dir calls running per session (fsops.go)
	edits          editLocks        // edit_file calls, one at a time per session (edit.go)
	watchHub       *workspace.Hub   // the inotify instances every watch shares, and their caps (fsops.go)
	autoPauseAfter time.Duration    // Options.AutoPause
	prestart       bool             // Options.PrestartPython
	spares         *spares          // Options.SpareSessions; nil: none
	pip            *pipSetup        // pip of the sessions (pip.go)
	life           lifetimes        // the patrol of session lifetimes (lifetime.go)
	copyHook       func(rel string) // tests: workspace.CopyOptions.BeforeOpen of snapshots
	// rootfsInstaller is Options.rootfsInstaller: python_run's installer.
	rootfsInstaller rootfs.Installer
}

// DefaultDataDir is $QURO_DATA, else $XDG_DATA_HOME/quro, else
// ~/.local/share/quro.
func DefaultDataDir() string {
	if d := os.Getenv("QURO_DATA"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "quro")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "quro")
	}
	return filepath.Join(home, ".local", "share", "quro")
}

// New opens the data directory dataDir and assembles an App.
func New(ctx context.Context, dataDir string, o *Options) (*App, error) {
	if dataDir == "" {
		return nil, fmt.Errorf("app: no data directory")
	}
	var opts Options
	if o != nil {
		opts = *o
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, err
	}
	for _, u := range append([]string{opts.Pip.IndexURL}, opts.Pip.ExtraIndexURLs...) {
		if err := CheckIndexURL(u); u != "" && err != nil {
			return nil, err
		}
	}
	if err := checkNetworkOptions(&opts.Network); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	st, err := store.Open(ctx, filepath.Join(dir, "quro.db"))
	if err != nil {
		return nil, err
	}
	// The in-session server comes before the session Manager, which is
	// opened with its hooks: every box of a session, the first spare's
	// included, gets the session's socket. It asks the Manager and the
	// handler (made below, over the controller) only when a box is made.
	var sessions *session.Manager
	var inSession *insession.Server
	var inSessionHandler http.Handler
	var hooks *session.BoxHooks
	if opts.InSession != nil {
		inSession = insession.NewServer(ctx, dir, func(ctx context.Context, id string) bool { return sessions.Exists(ctx, id) },
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inSessionHandler.ServeHTTP(w, r) }),
			&insession.Options{Logger: log, MaxConns: opts.InSession.MaxConns, Tenant: func(ctx context.Context, id string) string {
				if s, err := sessions.ByIDAnyTenant(ctx, id); err == nil {
					return s.Tenant
				}
				return ""
			}})
		hooks = inSession.Hooks()
	}
	// undo releases what New made when it fails.
	undo := func(err error) (*App, error) {
		if inSession != nil {
			inSession.Close()
		}
		st.Close()
		return nil, err
	}
	sessions, err = session.Open(ctx, st, dir, hooks)
	if err != nil {
		return undo(err)
	}
	tl := openTenants(ctx, dir, st, sessions, opts, log)
	m := metrics.New()
	netPol := newNetPolicies(sessions)
	ew := openEgressLog(ctx, st, m, log)
	sb, pipS, eg, err := openSandbox(dir, opts, m, tl, netPol, st, ew)
	if err != nil {
		ew.close()
		return undo(err)
	}
	if err := closeDataDir(dir, sb.Boxed()); err != nil {
		return undo(fmt.Errorf("data directory: %w", err))
	}
	jsEng, nodeEng := js.New(jsOptions(opts.JS, eg, netPol)), node.New(sb, RootfsDir(dir))
	pyChain, emb, pyRootfs := PythonChain(dir, sb, opts.Python)
	pipS.emb.Store(emb)
	a := &App{
		DataDir: dir, Store: st, Sessions: sessions, Sandbox: sb, Log: log, Started: time.Now(),
		Python: emb, PythonRootfs: pyRootfs, Metrics: m, tokens: auth.New(st), auditLog: audit.New(st, &audit.Options{Keep: opts.AuditKeep, Logger: log}),
		Runner:  runcode.New(Languages(sb, pyChain, jsEng, nodeEng, RootfsDir(dir)), opts.Run),
		tenants: tl, limits: opts.Limits, network: opts.Network, egress: eg, netPolicies: netPol, secrets: eg.secrets, js: jsEng, node: nodeEng, watchHub: workspace.NewHub(opts.Limits.Watch),
		startWindow: cmp.Or(opts.ProcessStartWindow, DefaultProcessStartWindow), autoPauseAfter: opts.AutoPause,

		prestart:        opts.PrestartPython,
		procs:           proc.New(),
		pip:             pipS,
		rootfsInstaller: opts.rootfsInstaller,
	}
	if a.autoPauseAfter == 0 {
		a.autoPauseAfter = DefaultAutoPause
	}
	a.isolation = sync.OnceValue(func() []sandbox.Feature {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return sb.Probe(ctx)
	})
	a.lives = session.NewLife(sessions, session.LifeOptions{Boxes: sessionBoxes{sb: sb, files: &a.boxFiles}, Log: log, Enders: a.enders(), Grace: opts.DestroyGrace})
	a.Terminals = a.openTerminals()
	reg := capability.NewRegistry()
	a.register(reg)
	a.registerJS(reg, jsEng)
	a.registerAudit(reg)
	a.registerBoxes(reg)
	a.registerTokens(reg)
	a.registerTenantLimits(reg)
	a.registerRootfs(reg)
	a.registerOpenTerminal(reg)
	a.registerNetwork(reg)
	a.Controller = a.newController(reg, log, opts.Observers)
	if inSession != nil {
		inSessionHandler = opts.InSession.Handler(a.Controller, sessions)
		a.InSession = inSession
	}
	a.instrument()
	a.Metrics.WatchTenants(a.tenantGauges)
	a.Metrics.WatchWatches(a.watchHub.Stats)
	if opts.SpareSessions > 0 && sb.SessionBoxes() && emb.KeepsSpares() {
		a.spares = a.openSpares(ctx, opts.SpareSessions, opts.MaxSpareSessions, opts.SparesPerTenant)
	}
	a.life.wake = make(chan struct{}, 1)
	return a, nil
}

// closeDataDir keeps the data directory dir from the machine's other
// users: dir and dir/sessions are made 0700 (also when they exist already:
// a data directory made beforehand keeps its mode through MkdirAll, and
// the sessions directory used to be 0755), so that no one but the server
// lists the session ids or reaches the store, the snapshots or a
// workspace. A box needs neither:
// bubblewrap, host root in the box's namespace, binds what the box shows
// (the workspace, the interpreters' directory, the in-session socket),
// and in the box only the bound directory's own mode counts; the session's
// uid never walks these directories on the host. Without namespaces
// (boxed false) a root server runs a session's code as the session's uid
// on the host, which has to pass through both to reach its workspace:
// then they are 0711, passable but not listable (an id is 128 random
// bits).
func closeDataDir(dir string, boxed bool) error {
	mode := os.FileMode(0o700)
	if !boxed && os.Geteuid() == 0 {
		mode = 0o711
	}
	for _, d := range []string{dir, filepath.Join(dir, "sessions")} {
		if err := os.Chmod(d, mode); err != nil {
			return err
		}
	}
	return nil
}

// openTenants sets sessions' admission and disks to the tenants' limits
// under dir (the data directory), adopting the disks a previous server
// left mounted.
func openTenants(ctx context.Context, dir string, st *store.Store, sessions *session.Manager, opts Options, log *slog.Logger) *tenants {
	m := opts.Limits.Machine
	if m == nil {
		mm := ReadMachine()
		m = &mm
	}
	derived := DeriveDefaults(*m)
	sessions.MaxPerTenant = orDefault(opts.Limits.SessionsPerTenant, int(derived.SessionsPerTenant))
	sessions.MaxTotal = orDefault(opts.Limits.Sessions, int(derived.Sessions))
	tl := &tenants{store: st, sessions: func() *session.Manager { return sessions }, root: filepath.Join(dir, "sessions"), derived: derived,
		defaults: opts.Limits.Tenant.or(TenantLimits{Memory: derived.Memory, Tasks: derived.Tasks,
			CPUPercent: derived.CPUPercent, Sessions: int64(sessions.MaxPerTenant), Disk: DefaultDiskQuota,
			Runs:             int64(orDefault(opts.Limits.RunsPerTenant, DefaultRunsPerTenant)),
			Processes:        int64(orDefault(opts.Limits.ProcessesPerTenant, DefaultProcessesPerTenant)),
			SessionProcesses: int64(orDefault(opts.Limits.ProcessesPerSession, proc.DefaultMax)),
			NetworkMax:       opts.Network.Max}),
		log: log, ofID: map[string]string{}, diskOf: map[string]string{}}
	if opts.diskImages {
		tl.disks = quota.OpenImages(dir)
	} else {
		tl.disks = quota.Open(dir)
	}
	// The disks: one per session, and a tenant's share as many as its
	// sessions, so that they never refuse a session the session ceilings
	// admit; of a cap the operator set, a quarter. Only images hold a
	// loop device each: subvolumes of the shared filesystem need no cap.
	maxDisks, diskShare := sessions.MaxTotal, sessions.MaxPerTenant
	if opts.Limits.SessionDisks != 0 {
		maxDisks = orDefault(opts.Limits.SessionDisks, 0)
		diskShare = share.Of(maxDisks, 1)
	}
	if maxDisks > 0 && !tl.disks.Shared() {
		tl.diskShares = share.New("session disks (loop-mounted images)", maxDisks, diskShare)
	}
	tl.ceilings = effectiveCeilings(derived, tl.defaults, sessions.MaxTotal, maxDisks)
	if tl.disks.Shared() {
		tl.ceilings.From["session_disks"] = "not applied: the sessions' disks are subvolumes of one shared filesystem, no loop device each"
	}
	sessions.MaxFor = tl.maxSessions
	sessions.LimitHint = tl.sessionLimitHint
	sessions.Disk.Prepare, sessions.Disk.Release = tl.prepare, tl.release
	if err := tl.adopt(ctx); err != nil {
		log.Warn("session disks", "err", err)
	}
	return tl
}

// openSandbox makes the sandbox of the sessions under dir, with their
// tenants' cgroups and one box per session, the sessions' pip, and the
// egress of their boxes (with the sessions' secrets, sealed in st).
func openSandbox(dir string, opts Options, m *metrics.Metrics, tl *tenants, netPol *netPolicies, st *store.Store, ew *egressWriter) (*sandbox.Sandbox, *pipSetup, *boxEgress, error) {
	secrets, err := openSecrets(dir, st)
	if err != nil {
		return nil, nil, nil, err
	}
	eg, err := newBoxEgress(opts.Network, netPol.get, m, dir, secrets, ew)
	if err != nil {
		return nil, nil, nil, err
	}
	sbo := sandboxOptions(opts.Sandbox, m)
	if sbo.Egress == nil {
		sbo.Egress = eg
	}
	sbo.Tenant, sbo.Note = tl.forRun, tl.note
	sbo.TenantScope = dir // tenants are the data directory's
	// Boxes are born without the other sessions' disks (the N-th box
	// costs what the first did).
	sbo.MountRoot = tl.disks.Root()
	if sbo.Log == nil {
		sbo.Log = opts.Logger
	}
	// A run in a session's directory runs in that session's box, or says
	// why not (sandbox.Spec.Outside).
	sbo.SessionOf = func(d string) (string, bool) {
		id, _, ok := tl.sessionDir(d)
		return id, ok
	}
	// One box per session: every process of a session is spawned in it.
	// What later runs name read-only must be visible in the box: the
	// sealed copies of bash, and of the interpreters' directory
	// <pyRoot>/python only the embedded interpreter's own directories,
	// as they are when the box is made (pipSetup.boxDirs; a run naming
	// one that was not ready then gets a box that shows it).
	sbo.SessionBoxes = true
	pyRoot := dir
	if opts.Python != nil && opts.Python.InstallRoot != "" {
		pyRoot = opts.Python.InstallRoot
	}
	if d, err := terminal.SealedDir(); err == nil {
		// At terminal.SealedInBox, not at its host path in the host's
		// temporary directory.
		sbo.BoxReadOnly = append(sbo.BoxReadOnly, d)
		sbo.Places = append(sbo.Places, sandbox.Bind{Src: d, Dst: terminal.SealedInBox})
	}
	// The embedded interpreter's tree, pip's and the worker module's
	// directories are shown at box paths (python.BoxTree, BoxPip,
	// BoxWorker), not at their host paths, and run from there: what the
	// session's code reads of its Python names no host path.
	sbo.Places = append(sbo.Places, python.BoxPlaces(pyRoot)...)
	// The tenant's wheel cache (<data>/pip/<tenant>/wheels, bound per
	// run) at /run/quro/wheels/<tenant>/wheels: pip's "Looking in links"
	// names no host path.
	sbo.Places = append(sbo.Places, sandbox.Bind{Src: filepath.Join(dir, "pip"), Dst: WheelsInBox})
	pipS := newPipSetup(dir, pyRoot, sbo.Path, tl, opts.Pip)
	sbo.BoxReadOnlyNow = pipS.boxDirs
	// A session's secrets: their placeholders, and the trust store with
	// the egress's CA (bound into every box; only a session with secrets
	// is pointed at it).
	sbo.RunEnv = withSecretEnv(pipS.runEnv, sbo.SessionOf, secrets)
	sbo.Binds = append(sbo.Binds, sandbox.Bind{Src: eg.bundle, Dst: CABundleInBox})
	sb, err := sandbox.New(sbo)
	if err != nil {
		eg.Close()
		return nil, nil, nil, err
	}
	pipS.sb = sb // before any run: its RunEnv names the box paths
	return sb, pipS, eg, nil
}

// newController makes a's controller over reg, with the audit log, the
// metrics and observers told of every call, and the live events' bus.
func (a *App) newController(reg *capability.Registry, log *slog.Logger, observers []controller.Observer) *controller.Controller {
	a.Events = events.New()
	a.Events.Redact = audit.RedactTokens
	return controller.New(describeTools(reg), &controller.Options{
		Logger:    log,
		Limits:    controller.Limits{Raise: raiseRuns, RunsOf: a.runsOf},
		Observers: append([]controller.Observer{a.auditLog.Observe, a.Metrics.Observer(reg)}, observers...),
		Enter:     a.lives.Enter,
		Events:    a.Events,
		Note:      a.moveNote,
	})
}

// openTerminals makes the terminal manager of a's sessions: their
// shells and PTYs, with the sessions' variables and recorded cwd.
func (a *App) openTerminals() *terminal.Manager {
	sessions, log := a.Sessions, a.Log
	runOpts := a.Runner.Options()
	return terminal.NewManager(a.Sandbox, &terminal.ManagerOptions{
		Env: func(id string) map[string]string {
			env, _ := sessions.Env(context.Background(), id)
			return env
		},
		OnCwd: func(id, cwd string) {
			if err := sessions.SetCwd(context.Background(), id, cwd); err != nil {
				log.Warn("cannot record cwd", "session", id, "err", err)
			}
		},
		MaxOutput: runOpts.MaxStdout, SpillLimit: runOpts.SpillLimit,
		Rootfs: RootfsDir(a.DataDir),
	})
}

// orDefault is v, or def when v is 0, or 0 (no cap) when v is negative.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Close destroys the spare sessions, stops every session's terminals,
// writes the pending audit entries and releases the store.
func (a *App) Close() error {
	a.stopLifetimes()
	a.spares.close()
	if a.InSession != nil {
		a.InSession.Close()
	}
	a.lives.Close(context.Background())
	a.procs.Close()
	a.Sandbox.CloseBoxes()
	a.egress.Close()
	a.Terminals.Close()
	a.Python.Close()
	a.PythonRootfs.Close()
	a.js.Close()
	a.node.Close()
	a.Sandbox.ReleaseTenants()
	a.auditLog.Close()
	a.tenants.disks.UnmountMine()
	a.tenants.disks.Close()
	return a.Store.Close()
}

// Supervise runs the supervisor patrol until ctx ends, and the patrol
// of session lifetimes (lifetime.go) until Close.
func (a *App) Supervise(ctx context.Context, every time.Duration) {
	a.startLifetimes()
	go a.Terminals.Patrol(ctx, every, a.patrolHooks())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.autoPause(ctx)
		}
	}
}

func (a *App) patrolHooks() terminal.PatrolHooks {
	return terminal.PatrolHooks{
		Default:     a.Sessions.DefaultIfAny, // the patrol makes none: a drain moved it, or it was destroyed
		Exists:      a.Sessions.Exists,
		SessionsDir: filepath.Join(a.DataDir, "sessions"),
		// A paused session's shell stays: it costs no CPU, and its state
		// is what the pause keeps.
		Paused: func(id string) bool {
			bx := a.Sandbox.Box(id)
			return bx != nil && bx.Paused()
		},
	}
}

// RootfsDir resolves the rootfs names of sessions under dataDir to their
// directories, refusing one that is not installed and ready.
func RootfsDir(dataDir string) func(name string) (string, error) {
	m := rootfs.New(rootfs.DirIn(dataDir))
	return func(name string) (string, error) {
		if err := rootfs.CheckName(name); err != nil {
			return "", err
		}
		if !m.Ready(name) {
			return "", fmt.Errorf("%w: the session runs on rootfs %q, which is not installed: run quro rootfs install %s (python_run installs it too)",
				runcode.ErrInvalid, name, name)
		}
		return m.Path(name), nil
	}
}

// Authenticate is the check of a request's bearer token, for an access
// path over HTTP (quro serve's REST, MCP and WebSocket).
func (a *App) Authenticate() httpauth.Func { return a.tokens.HTTP() }

// VerifyToken returns the caller a bearer token stands for (Path left for
// the access path to set).
func (a *App) VerifyToken(ctx context.Context, token string) (controller.Caller, error) {
	return a.tokens.Verify(ctx, token)
}

// LiveToken returns the caller of the token with id while it is live (not
// revoked), for credentials derived from it: E2B's sandbox access tokens.
func (a *App) LiveToken(ctx context.Context, id string) (controller.Caller, error) {
	return a.tokens.Live(ctx, id)
}

// LiveTokenIDs are the ids of tenant's live tokens that cover scope.
func (a *App) LiveTokenIDs(ctx context.Context, tenant string, scope capability.Scope) ([]string, error) {
	return a.tokens.LiveIDs(ctx, tenant, scope)
}

// EnsureAdminToken makes sure someone can administer the server: on a
// data directory with no live token it issues an admin token for the
// local tenant, writes it to file (mode 0600) and returns it (quro
// serve's first start); else it returns "".
func (a *App) EnsureAdminToken(ctx context.Context, file string) (string, error) {
	return a.tokens.EnsureAdmin(ctx, file)
}

// ImportTokens adds the tokens listed in file, one a line: TOKEN TENANT
// SCOPES [LABEL] (TENANT "-" for the local tenant, SCOPES comma-separated;
// blank lines and lines starting with # skipped). Every node of a Quro
// cluster reads the same file (a Kubernetes Secret), so that a token works
// on any node. It returns how many lines named a token.
func (a *App) ImportTokens(ctx context.Context, file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	n := 0
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) < 3 {
			return n, fmt.Errorf("%s line %d: want TOKEN TENANT SCOPES [LABEL]", filepath.Base(file), i+1)
		}
		tenant := f[1]
		if tenant == "-" {
			tenant = ""
		}
		label := "imported"
		if len(f) > 3 {
			label = strings.Join(f[3:], " ")
		}
		if err := a.tokens.Import(ctx, f[0], tenant, strings.Split(f[2], ","), label); err != nil {
			return n, fmt.Errorf("%s line %d: %w", filepath.Base(file), i+1, err)
		}
		n++
	}
	return n, nil
}

// Isolation reports the machine's isolation features (probed once).
func (a *App) Isolation() []sandbox.Feature { return a.isolation() }

// Languages declares run_code's language matrix and engine chains.
//
// JavaScript: "js" and "ts" run in QuickJS (fast, no Node needed), their
// code contexts (E2B's JS/TS contexts) on the session's Node where its
// userland has node; "node" runs on that Node, in QuickJS where there is
// none (with a note saying why).
func Languages(sb *sandbox.Sandbox, pythonChain []runcode.Engine, jsEng *js.Engine, nodeEng *node.Engine, rootfsDir func(string) (string, error)) []runcode.Language {
	code := render.Code{}
	langs := []runcode.Language{
		{Name: "python", Aliases: []string{"py", "py3", "python3"}, Runs: true,
			Chain: pythonChain},
		{Name: "js", Aliases: []string{"javascript", "mjs", "cjs"}, Runs: true, Chain: []runcode.Engine{nodeEng.ForContexts(), jsEng}},
		{Name: "ts", Aliases: []string{"typescript"}, Runs: true, Chain: []runcode.Engine{nodeEng.ForContexts(), jsEng.TS()}},
		{Name: "node", Aliases: []string{"nodejs"}, Runs: true, Chain: []runcode.Engine{nodeEng, jsEng}},
	}
	langs = append(langs, shell.Languages(sb, rootfsDir)...)
	langs = append(langs, []runcode.Language{
		{Name: "html", Aliases: []string{"htm", "markup"}, Chain: []runcode.Engine{render.HTML{}}},
		{Name: "json", Chain: []runcode.Engine{render.JSON{}}},
		{Name: "css", Chain: []runcode.Engine{render.CSS{}}},
		{Name: "xml", Chain: []runcode.Engine{render.XML{}}},
		{Name: "svg", Chain: []runcode.Engine{render.XML{SVGOnly: true}}},
	}...)
	// Compiled and other languages run with the toolchain of the
	// session's userland, and fall through to the highlighted page
	// (saying which Debian package adds the toolchain) where it has none.
	langs = append(langs, toolchain.Languages(sb, rootfsDir, code)...)
	return langs
}
