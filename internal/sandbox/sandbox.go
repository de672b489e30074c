// Package sandbox is the only way Quro starts a process that runs user code.
//
// A Spec says what to run, where, with which session variables and limits;
// Start and Run turn it into a process that:
//   - runs in its own process group, killed as a group on timeout and when the
//     run ends, with a parent-death signal so it never outlives the server;
//   - sees a cleared environment: a fixed whitelist (PATH, HOME, LANG, TERM,
//     TMPDIR) plus the session's own variables, never the server's; the
//     privileged helpers that build the box (bubblewrap, the init child)
//     get only HelperEnv, and the program's environment reaches the init
//     child through a sealed memfd, applied at its final execve only;
//   - starts in the session workspace;
//   - runs under rlimits applied by a re-exec'd child of the quro binary itself
//     (see init.go), which then execs the user program.
//
// Output is copied concurrently into the Spec's writers; the writers decide
// how much to keep in memory. A Sandbox is safe for concurrent use.
package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// DefaultPath is the PATH user code sees unless Options say otherwise.
// BinDir comes first: it holds quro itself and its stand-ins for apt-get
// and apt (see BinNames).
const DefaultPath = BinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Isolation levels (Options.Isolation).
const (
	// IsolationFull requires every layer (see Layers); a run fails closed,
	// with an error naming what is missing and how to get it, when the
	// machine lacks one.
	IsolationFull = "full"
	// IsolationMinimal applies the layers the machine has and skips the
	// others. It is the explicit opt-out of fail-closed.
	IsolationMinimal = "minimal"
)

// Network policies (Spec.Network).
const (
	// NetworkNone: the box's own network namespace, with only its
	// loopback: a server one process of a box starts is reachable from
	// the others (a session's box is one namespace for all its runs),
	// nothing outside the box is. Without a box (minimal isolation)
	// Landlock refuses every TCP bind and connect instead.
	NetworkNone = "none"
	// NetworkInternet: the box's own network namespace, whose only way
	// out is the server's egress (Options.Egress, see Netns): its TCP
	// connections and DNS queries are redirected to sockets the server
	// holds, which apply the session's policy; everything else is
	// dropped. It needs a box.
	NetworkInternet = "internet"
	// NetworkHost: the host's own network namespace (its loopback, the
	// server's port, every interface). The server's helpers that fetch
	// for a tenant use it (under their own limits); a session only with
	// the operator's leave.
	NetworkHost = "host"
)

// Networks are the policies a Spec may name.
var Networks = []string{NetworkNone, NetworkInternet, NetworkHost}

// Egress serves the way out of boxes under NetworkInternet.
type Egress interface {
	// Attach opens the egress's sockets in ns (Netns.Listen,
	// Netns.ListenPacket on EgressPort and DNSPort) for the box of
	// session ("" for a run of no session) and serves them until the
	// returned closer is called.
	Attach(session string, ns *Netns) (io.Closer, error)
}

// Options configure a Sandbox. The zero value is usable.
type Options struct {
	// Isolation is IsolationFull (the default) or IsolationMinimal.
	Isolation string
	// Require names the layers that must be present under full isolation;
	// nil means all of Layers.
	Require []string
	// Path is the PATH inside the sandbox; default DefaultPath.
	Path string
	// Limits replace DefaultLimits for specs that leave Limits zero.
	Limits *Limits
	// StartTimeout bounds the start of a run (its box made or claimed,
	// its cgroups, the init child up to the program's exec), apart from
	// the run's own time (Spec.Timeout) and besides the caller's context;
	// default DefaultStartTimeout. A start past it fails with a
	// *StartError that says so (FailStartTimeout).
	StartTimeout time.Duration
	// DrainGrace bounds how long Wait keeps reading output after the process
	// group was killed (a process that left the group may hold a pipe open).
	// Default 1s.
	DrainGrace time.Duration
	// OnFailure, when set, is told the reason (one of FailureReasons) each
	// time Start fails, for metrics. It must not block.
	OnFailure func(reason string)
	// Log gets the whole text of a start failure whose StartError names
	// no host path (nil: slog.Default()).
	Log *slog.Logger
	// Binds are host paths bound read-only into every box at another
	// path, such as the server's in-session API socket. A missing source
	// is skipped. Without a box (minimal isolation) they are absent.
	Binds []Bind
	// Places are where a box shows read-only host paths elsewhere than
	// at their host path: a read-only path of a run or of a session box
	// (Spec.ReadOnly, RunEnv.ReadOnly, BoxReadOnly, BoxReadOnlyNow)
	// beneath a place's Src is bound at the same path beneath its Dst, a
	// RunDir/NAME, and not at its host path, so that nothing the box
	// runs names a host path (the embedded interpreter's tree at
	// /run/quro/python: its sys.prefix is a box path). Only the
	// read-only path itself is bound, never the rest of Src: a place
	// renames what the box shows, never shows more of the host. Without a
	// box (minimal isolation) read-only paths keep their host paths
	// (BoxPath says which).
	Places []Bind
	// Tenant, when set, names the tenant a run belongs to (from its Spec's
	// Dir) and its ceilings: the run's cgroups are made beneath the
	// tenant's (see tenant.go). ok=false: the run has no tenant cgroup.
	Tenant func(dir string) (t Tenant, ok bool)
	// TenantScope names the servers whose tenants are the same tenants:
	// the data directory. Tenant cgroups are per scope (TenantCgroupName),
	// so a tenant of one data directory never counts against the ceilings
	// of the same name in another's. "" is one scope of its own.
	TenantScope string
	// BoxCPUWeight, when not 0, is written as the CPU weight of the group
	// that holds every box (quro/, shared by the servers in one cgroup of
	// the host; the last to start wins) when the Sandbox is made: on
	// cgroup v2's cpu.weight scale, 1 to CPUWeightMax, 100 what one busy
	// host thread weighs; v1 gets cpu.shares = weight×1024/100 (see
	// cpuweight.go). MachineBoxCPUWeight is quro serve's default. 0
	// leaves the weight as it is. It is the operator's: no session or
	// tenant value ever reaches it.
	BoxCPUWeight int
	// SessionBoxes gives each session one box for its lifetime (see
	// box.go): the runs of a Spec that names its Session are spawned in
	// it. Without the namespaces layer it has no effect.
	SessionBoxes bool
	// SessionOf, when set, names the session whose directory dir lies
	// in: a run there must name that session's box (Spec.Session, or a
	// ForSession sandbox) or say why it runs outside it (Spec.Outside);
	// any other is refused (see checkSessionRun).
	SessionOf func(dir string) (id string, ok bool)
	// MountRoot, when set, is the directory whose subdirectories may be
	// mount points of the sessions' disks: boxes are then born in a mount
	// namespace without them, and each gets only its own session's disk
	// (see mountView). It needs root and the namespaces layer; without
	// them it has no effect.
	MountRoot string
	// BoxReadOnly are host paths every session box shows read-only at the
	// same path, besides what its first run names: where the server puts
	// interpreters and tools that later runs of the session name in
	// Spec.ReadOnly (a directory bound now shows what is made in it later).
	BoxReadOnly []string
	// BoxReadOnlyNow, when set, is asked at each session box's creation
	// for more host paths the box shows read-only, like BoxReadOnly: the
	// ones ready then. A bind shows the directory that is at the path when
	// the box is made; one renamed into place later is not in that box,
	// and a run that names it gets a box that shows it (see boxShape.holds).
	BoxReadOnlyNow func() []string
	// RunEnv, when set, is asked for the defaults of each run (never of a
	// RootfsAdmin one) given its Spec and network policy: Env are
	// variables layered over the whitelist (PATH among them) and under the
	// Spec's own Env, ReadOnly further host paths the run sees read-only
	// (like Spec.ReadOnly). The app sets the session's pip there: the
	// python3/pip shims first on PATH, the tenant's wheel cache.
	RunEnv func(spec *Spec, network string) RunEnv
	// Note, when set, is asked after each run ends for text to append to
	// its stderr (e.g. that the session's disk quota is full, and what
	// filled it), given the run's Dir.
	Note func(dir string) string
	// Egress serves boxes under NetworkInternet; without it a Spec that
	// asks for that policy is refused.
	Egress Egress
}

// RunDir is the box's directory of Quro's own things: BinDir, the
// in-session socket, Options.Places.
const RunDir = "/run/quro"

// BoxTmp is where a box shows its run's Spec.TmpDir (the session's
// temporary directory), read-write, and what TMPDIR names there: no
// host path reaches the program through TMPDIR (nor through what reads
// it: Python's tempfile, pip's cache). The directory is also bound at
// its host path, as the workspace is, for the paths the server itself
// writes there and hands over (a long script's file); nothing the
// program is told names it. /tmp stays the box's own (its tmpfs, or
// beneath which a data directory in /tmp binds its paths).
const BoxTmp = RunDir + "/tmp"

// TmpPath is where a run of s whose Spec.TmpDir is tmp sees the host path
// p beneath tmp: beneath BoxTmp when its runs start in a box; else p
// (also for a nil s).
func (s *Sandbox) TmpPath(tmp, p string) string {
	if s == nil || !s.Boxed() || tmp == "" || !beneath(p, tmp) {
		return p
	}
	rel, err := filepath.Rel(tmp, p)
	if err != nil {
		return p
	}
	return filepath.Join(BoxTmp, rel)
}

// RunEnv is what Options.RunEnv adds to a run.
type RunEnv struct {
	Env      map[string]string
	ReadOnly []string
}

// Bind is a host path Src seen at Dst inside a box: read-only, or, when
// Writable, read-write (a writable bind's Src must lie in one of the run's
// own writable directories, its Dir, TmpDir or Writable: it is another
// name for them, never more host).
type Bind struct {
	Src, Dst string
	Writable bool
}

// EnterDirArgs is args run by the box's own sh once it entered dir (a
// path in the box, which the server never resolves), exiting 1 when it
// cannot: how a run starts in a directory other than its Dir.
func EnterDirArgs(dir string, args []string) []string {
	return append([]string{"/bin/sh", "-c", `cd -- "$0" || exit 1; exec "$@"`, dir}, args...)
}

// HomeUser is where every session box also shows its workspace,
// read-write: E2B's SDKs and the code written for them expect the home
// directory /home/user (see docs/e2b.md).
const HomeUser = hostpath.Home

// Reasons a Start fails, as Options.OnFailure reports them.
const (
	FailInvalidSpec  = "invalid_spec"  // the caller built a bad Spec
	FailLayerMissing = "layer_missing" // full isolation refused: a layer is missing
	FailSetup        = "setup"         // the server could not prepare the run (pipes, cgroups, ids, bubblewrap)
	FailInit         = "init"          // the init child refused (program not found, a limit or policy failed)
	FailBox          = "box"           // the box ended before the init child said anything
	FailCanceled     = "canceled"      // the context ended while the run was starting
	FailStartTimeout = "start_timeout" // the start took longer than Options.StartTimeout
)

// FailureReasons lists every reason OnFailure reports.
var FailureReasons = []string{FailInvalidSpec, FailLayerMissing, FailSetup, FailInit, FailBox, FailCanceled, FailStartTimeout}

// DefaultStartTimeout is Options.StartTimeout's default: generous, as a
// box's start on a loaded machine takes seconds, and a start that takes
// this long is a server in trouble, not a slow one.
const DefaultStartTimeout = 2 * time.Minute

// Sandbox starts isolated processes. Create it once with New.
type Sandbox struct {
	self       string
	path       string
	limits     Limits
	drainGrace time.Duration
	stuckGrace time.Duration // stuckBoxGrace; tests shorten it
	cpuWeight  int           // Options.BoxCPUWeight
	startLimit time.Duration // Options.StartTimeout
	isolation  string
	layers     *layerSet
	onFailure  func(reason string)
	log        *slog.Logger
	binds      []Bind
	places     []Bind                          // Options.Places
	uid        int                             // see ForSession
	session    string                          // see ForSession
	sessionOf  func(dir string) (string, bool) // Options.SessionOf
	boxes      *boxRegistry
	tenant     func(dir string) (Tenant, bool)
	note       func(dir string) string
	runEnv     func(spec *Spec, network string) RunEnv
	egress     Egress
	host       hostView // where a box's host userland is read from
	mounts     *mountView
	// refused, set by tests, runs when admitAwaiting's first count is
	// refused at a ceiling, before it looks at the ending boxes.
	refused func()
}

// New returns a Sandbox. opts may be nil.
func New(opts *Options) (*Sandbox, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("sandbox: cannot find the quro executable to re-exec: %w", err)
	}
	s := &Sandbox{self: self, path: o.Path, limits: DefaultLimits(), drainGrace: o.DrainGrace, onFailure: o.OnFailure,
		binds: slices.Clone(o.Binds), tenant: o.Tenant, note: o.Note, runEnv: o.RunEnv, egress: o.Egress, sessionOf: o.SessionOf, log: o.Log}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, pl := range o.Places {
		if filepath.Dir(pl.Dst) != RunDir || pl.Dst == BinDir || pl.Dst == BoxTmp || pl.Writable || !filepath.IsAbs(pl.Src) || filepath.Clean(pl.Src) != pl.Src {
			return nil, fmt.Errorf("sandbox: place %q at %q: want a clean absolute host path shown read-only at %s/NAME (not %s)", pl.Src, pl.Dst, RunDir, BinDir)
		}
	}
	s.places = slices.Clone(o.Places)
	if s.path == "" {
		s.path = DefaultPath
	}
	if o.Limits != nil {
		s.limits = *o.Limits
	}
	s.stuckGrace = stuckBoxGrace
	if s.drainGrace <= 0 {
		s.drainGrace = time.Second
	}
	s.startLimit = cmp.Or(max(o.StartTimeout, 0), DefaultStartTimeout)
	switch o.Isolation {
	case "", IsolationFull:
		s.isolation = IsolationFull
	case IsolationMinimal:
		s.isolation = IsolationMinimal
	default:
		return nil, fmt.Errorf("sandbox: isolation %q: want %q or %q", o.Isolation, IsolationFull, IsolationMinimal)
	}
	s.layers = findLayers(o.Require)
	if s.layers.cg != nil {
		s.layers.cg.scope = o.TenantScope
	}
	if o.BoxCPUWeight != 0 {
		if err := CheckCPUWeight(o.BoxCPUWeight); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		s.cpuWeight = o.BoxCPUWeight
		// Without a cpu controller there is nothing to weigh (doctor's
		// cpu weight row says so).
		if file, _ := s.layers.cg.cpuWeightFile(); file != "" {
			if err := s.layers.cg.setCPUWeight(o.BoxCPUWeight); err != nil {
				// The boxes still run, at the weight the group has.
				s.log.Warn("sandbox: the boxes' CPU weight was not set", "weight", o.BoxCPUWeight, "err", err)
			}
		}
	}
	if o.MountRoot != "" && s.layers.bwrap != "" && os.Geteuid() == 0 {
		v, err := newMountView(o.MountRoot)
		if err != nil {
			// Boxes then copy the server's namespace, disks and all:
			// slower with many sessions, as isolated.
			s.log.Warn("sandbox: boxes start from the server's mount namespace", "err", err)
		}
		s.mounts = v
	}
	if o.SessionBoxes {
		s.boxes = &boxRegistry{boxes: map[string]*boxEntry{}, readOnly: slices.Clone(o.BoxReadOnly), readOnlyNow: o.BoxReadOnlyNow}
	}
	return s, nil
}

// BoxPath is where a run of this Sandbox sees the host path p when p is
// beneath one of Options.Places and runs start in a box; else p itself
// and false.
func (s *Sandbox) BoxPath(p string) (string, bool) {
	if !s.Boxed() {
		return p, false
	}
	return placed(s.places, p)
}

// placed is where a box with places shows the read-only host path p: the
// same path beneath the Dst of the place whose Src holds it; else p and
// false.
func placed(places []Bind, p string) (string, bool) {
	for _, pl := range places {
		if beneath(p, pl.Src) {
			rel, err := filepath.Rel(pl.Src, p)
			if err != nil {
				continue
			}
			return filepath.Join(pl.Dst, rel), true
		}
	}
	return p, false
}

// Isolation is the isolation level: IsolationFull or IsolationMinimal.
func (s *Sandbox) Isolation() string { return s.isolation }

// Boxed reports whether runs start inside a bubblewrap box: then a process
// sees only the host paths its Spec names (Dir, TmpDir, Writable,
// ReadOnly), fixed when it starts.
func (s *Sandbox) Boxed() bool { return s.layers.ok(LayerNamespaces) }

// StartTimeout is the bound of a run's start (Options.StartTimeout, or
// its default): what a caller waiting for a start made by another (a
// worker prestarted) allows it too.
func (s *Sandbox) StartTimeout() time.Duration { return s.startLimit }

// Path is the PATH that user code sees.
func (s *Sandbox) Path() string { return s.path }

// Limits are the limits applied to specs that do not set their own.
func (s *Sandbox) Limits() Limits { return s.limits }

// Spec describes one sandboxed process.
type Spec struct {
	Args   []string // program and arguments; Args[0] is looked up in the sandbox PATH
	Dir    string   // working directory (the session workspace); required
	Home   string   // HOME; default Dir
	TmpDir string   // TMPDIR, shown at BoxTmp in a box; default the box's /tmp (no box: Dir)
	Term   string   // TERM; default "dumb"
	// Env are the session variables, layered over the whitelist. They
	// reach the user program only: never bubblewrap or the init child,
	// which run with HelperEnv. With RootfsAdmin the program is
	// privileged, and names CheckEnvName refuses are refused here.
	Env    map[string]string
	Limits *Limits // nil means the Sandbox's limits

	// Network is the network policy: NetworkNone (also for ""),
	// NetworkInternet or NetworkHost.
	Network string
	// Egress, under NetworkInternet, serves the way out of this run's box
	// instead of Options.Egress: the server's own helpers that need a
	// namespace with a way out of their own (pip's fetch: a policy that
	// admits only the configured indexes, and the fetch's proxy listening
	// inside it). Only for a box of its own: a session box's way out is
	// the session's.
	Egress Egress
	// Rootfs is the directory of a root filesystem (e.g. a debootstrapped
	// Debian) whose userland the box shows, read-only, instead of the host's.
	Rootfs string
	// RootfsAdmin runs the program as the root of Rootfs, to change it
	// (package installs): Rootfs is bound read-write, the user namespace
	// maps host uids and gids 0..65535 to themselves (the owners of a
	// debootstrapped tree's files: root, _apt, man…), the program runs as
	// uid 0 of that namespace with only the capabilities apt and dpkg need
	// (AdminCaps), and Landlock lets it write beneath the rootfs's system
	// directories. Every other layer stays on: cgroups, pid/mount/ipc/uts
	// namespaces (and net unless Network is full), rlimits, Landlock,
	// seccomp, no host path but Rootfs, Dir and TmpDir. It needs a server
	// running as root and the box. Never for user code: the program runs
	// as host uid 0 inside a user namespace (see docs/security.md).
	RootfsAdmin bool
	// Writable are further host directories of the session bound read-write
	// at the same path, besides Dir and TmpDir.
	Writable []string
	// ReadOnly are host files or directories the run may read and execute
	// (not write), bound at the same path: an interpreter tree outside the
	// host userland, the quro binary for a re-executed engine. Never the
	// data directory as a whole.
	ReadOnly []string
	// UID is the unprivileged host uid the run gets when the server runs as
	// root: the session's own (session.Session.UID). 0 takes the uid of a
	// ForSession sandbox, else one outside the session range derived from
	// Dir (see AnonymousUID). Dir, TmpDir and Writable are handed over to it.
	UID int
	// Binds are host paths bound into this run's box besides
	// Options.Binds: the session's own in-session socket (read-only), its
	// workspace at HomeUser (writable).
	Binds []Bind
	// Session names the session box the run is spawned in (see box.go);
	// "" takes the one of a ForSession sandbox, else the run gets a box of
	// its own.
	Session string
	// Outside names why a run in a session's directory runs outside the
	// session's box ("": it does not; see Options.SessionOf): an explicit
	// choice, never a forgotten Session.
	Outside string
	// StartsInHome starts the program in HomeUser, the box's view of the
	// workspace, instead of at Dir's host path, by the cheapest way the
	// run's box has: when the box shows the workspace there, the session
	// box's init enters it as it enters Dir (a box of its own: bubblewrap's
	// --chdir), so that no shell runs first; otherwise the box's own sh
	// enters it first (EnterDirArgs), as for any other directory. Never
	// refused: whichever box takes the run, it starts in HomeUser or fails
	// as `cd` into it fails.
	StartsInHome bool
	// TenantDir, when set, is the directory whose tenant the run belongs
	// to (Options.Tenant is asked about it) instead of Dir: a helper run
	// the server starts for a tenant in a directory of its own (pip's
	// fetch box) still gets the tenant's cgroup and ceilings.
	TenantDir string

	Stdin          io.Reader // nil means /dev/null
	Stdout, Stderr io.Writer // nil discards
	ExtraFiles     []*os.File

	// Timeout, when > 0, is the run's time, counted from the program's
	// start (the init child's exec), never from the making of its box,
	// which a loaded machine can take seconds over (a short timeout then
	// failed the start itself). When it passes the run is killed and
	// Exit.TimedOut is set. The caller's context still ends the run at any
	// time (its own deadline too), and bounds the start with
	// Options.StartTimeout.
	Timeout time.Duration

	// TTY makes Stdin (a terminal's slave side, an *os.File) the process's
	// controlling terminal, in a session of its own. In the box, bubblewrap
	// then keeps the session (no --new-session, which would drop the
	// terminal); seccomp still denies TIOCSTI and TIOCLINUX, which is what
	// --new-session guards against.
	TTY bool
}

// Exit describes how a sandboxed process ended.
type Exit struct {
	Code     int            // exit status; 128+signal when killed by a signal
	Signal   syscall.Signal // the signal that killed it, or 0
	TimedOut bool           // the context's deadline passed; the group was killed
	Canceled bool           // the context was canceled; the group was killed
	// Abandoned is set when a process that left the run's process group still
	// held the output open after the run ended; its later output was not read.
	Abandoned bool
	Duration  time.Duration
	// OOMKilled is set when the kernel's OOM killer killed one of the
	// run's processes: at the run's own memory limit, its tenant's
	// ceiling, or above both. OOM says which were reached.
	OOMKilled bool
	OOM       OOM
}

// OOM is what a run's cgroups say of its OOM kill: which of the memory
// limits above it were reached while it ran. When two sessions of a
// tenant run at once both may have been; neither means the memory above
// them ran out (the server's cgroup, or the machine).
type OOM struct {
	Own         bool   // the run's own limit was reached
	OwnBytes    uint64 // that limit (0: unknown)
	Tenant      bool   // the tenant's ceiling, all of its sessions together, was reached
	TenantBytes uint64 // that ceiling (0: unknown)
	Session     bool   // the run's own limit is its session box's

	hasTenant bool // the run's cgroup is beneath a tenant's
}

// Reason says in words which limit the kernel enforced, for a run's
// result: "the tenant's memory ceiling (256 MiB, …) was reached". It names
// no path or cgroup.
func (o OOM) Reason() string {
	own := "the run's memory limit"
	if o.Session {
		own = "the session's memory limit"
	}
	if o.Own {
		own += sizeIn(o.OwnBytes, "")
	}
	tenant := "the tenant's memory ceiling" + sizeIn(o.TenantBytes, "all of its sessions together")
	switch {
	case o.Own && o.Tenant:
		return own + " and " + tenant + " were both reached"
	case o.Tenant:
		return tenant + " was reached"
	case o.Own:
		return own + " was reached"
	case o.hasTenant:
		return "out of memory above " + own + " and the tenant's memory ceiling (the server's or the machine's memory ran out)"
	}
	return "out of memory above " + own + " (the server's or the machine's memory ran out)"
}

// sizeIn is " (n, note)" with n in words, or " (note)", or "".
func sizeIn(n uint64, note string) string {
	var parts []string
	if n > 0 {
		parts = append(parts, humanBytes(n))
	}
	if note != "" {
		parts = append(parts, note)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// StartError is an engine-level failure: the sandbox could not start the
// program (not found, not executable, a limit could not be applied).
type StartError struct {
	Program string
	Reason  string
	Err     error // the cause, when there is a typed one (e.g. a *LayerError)
	// NoProgram: the program itself is the problem (not in the box's
	// PATH, no such file, not an executable file), not the sandbox: the
	// caller who named it can fix it, a retry cannot.
	NoProgram bool

	from string // FailInit or FailBox when the box itself answered; else FailSetup
}

func (e *StartError) Error() string {
	return fmt.Sprintf("cannot start %s: %s", e.Program, e.Reason)
}

func (e *StartError) Unwrap() error { return e.Err }

// initFailure is the StartError of a start the box's init child (or its
// spawner) refused with msg: one that begins with boxinit.NoProgramByte
// is about the program (NoProgram), without the byte.
func initFailure(prog, msg, from string) *StartError {
	rest, noProgram := strings.CutPrefix(msg, string(rune(boxinit.NoProgramByte)))
	return &StartError{Program: prog, Reason: rest, from: from, NoProgram: noProgram}
}

// ErrInvalidSpec reports a Spec the caller should not have built.
var ErrInvalidSpec = errors.New("sandbox: invalid spec")

// Process is a started sandboxed process. Call Wait exactly once.
type Process struct {
	Cmd *exec.Cmd

	ctx     context.Context
	clock   *runClock // the run's bounds, released by Wait; nil until Start returns it
	start   time.Time
	drain   time.Duration
	readers []*os.File // parent ends of output pipes, closed by Wait
	stdinW  *os.File
	pumps   sync.WaitGroup
	pumpErr error
	errMu   sync.Mutex
	cg      *runCgroup // the run's cgroups, or nil
	net     *boxNet    // a box of its own's network namespace, or nil
	exit    *exitWatch // Cmd's pidfd in the poller, or nil
	boxed   bool       // started inside bubblewrap
	tty     bool       // Spec.TTY

	groupMu sync.Mutex
	group   int // the inner process group, once found

	note func() string // Options.Note for this run, or nil
	errW io.Writer     // Spec.Stderr

	// In a session box (Cmd is nil):
	bx        *Box
	boxID     string        // the box init's name for it
	pid       int           // the program's host pid
	ended     chan struct{} // closed once the box init reported its end
	unwatch   func() bool   // stops the ctx watch (context.AfterFunc); set and taken under bx.mu
	boxExit   boxExit
	oomBefore oomCounts // the cgroups' OOM counters when it started (cg's or bx's)
	// started is closed when the box init's Started for it arrived
	// (boxStarted); boxPid, the program's pid in the box that it named
	// (0: none that can be), and bySpawner, the box init said its spawner
	// started it (forked from the restricted spawner rather than through
	// an init child), are set under bx.mu before.
	started   chan struct{}
	boxPid    int
	bySpawner bool
}

// Env builds the environment a spec's process sees under pl.
func (s *Sandbox) env(pl *plan, defaults map[string]string) ([]string, error) {
	spec := pl.spec
	home, tmp, term := spec.Home, cmp.Or(spec.TmpDir, spec.Dir), spec.Term
	if home == "" {
		home = spec.Dir
	}
	switch {
	case pl.tmp != "":
		tmp = BoxTmp
	case pl.boxed:
		tmp = "/tmp" // the box's own
	}
	if term == "" {
		term = "dumb"
	}
	vars := map[string]string{
		"PATH":   s.path,
		"HOME":   home,
		"LANG":   "C.UTF-8",
		"TERM":   term,
		"TMPDIR": tmp,
	}
	for k, v := range defaults {
		vars[k] = v
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("%w: bad environment variable %q", ErrInvalidSpec, k)
		}
		if spec.RootfsAdmin {
			// The program itself is the box's root: nothing may steer it.
			if err := CheckEnvName(k); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
			}
		}
		vars[k] = v
	}
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env, nil
}

// Start starts spec under ctx. When ctx is done the whole run is killed.
// An error is either ErrInvalidSpec or a *StartError (which wraps a
// *LayerError when full isolation refused to run without a layer).
//
// The layers wrap the user program in the order of Layers: the server picks
// the run's uid and cgroup, bubblewrap builds the box, and the init child
// inside it applies rlimits, Landlock and seccomp, then execs the program.
func (s *Sandbox) Start(ctx context.Context, spec *Spec) (*Process, error) {
	p, err := s.start(ctx, spec)
	if err != nil && s.onFailure != nil {
		s.onFailure(failureReason(ctx, err))
	}
	var se *StartError
	if errors.As(err, &se) && se.Err != nil && se.Err.Error() != se.Reason {
		s.log.Warn("a run could not start", "program", se.Program, "err", se.Err)
	}
	return p, err
}

// failureReason sorts a Start error into one of FailureReasons.
func failureReason(ctx context.Context, err error) string {
	var se *StartError
	switch {
	case errors.Is(err, ErrInvalidSpec):
		return FailInvalidSpec
	case errors.Is(err, ErrLayerMissing):
		return FailLayerMissing
	case ctx.Err() != nil:
		return FailCanceled
	case errors.As(err, &se) && se.from != "":
		return se.from
	}
	return FailSetup
}

func (s *Sandbox) start(ctx context.Context, spec *Spec) (*Process, error) {
	pl, err := s.prepare(spec)
	if err != nil {
		return nil, err
	}
	clock := newRunClock(ctx, s.startLimit)
	p, err := s.launchPlan(clock.ctx, pl)
	if err == nil && !clock.started(spec.Timeout) {
		// The run's context ended as the program began: it was killed.
		p.clock = clock
		p.Wait()
		return nil, pl.startCut(clock.ctx)
	}
	if err != nil {
		clock.stop()
		var st startTimeout
		if errors.As(context.Cause(clock.ctx), &st) && ctx.Err() == nil {
			return nil, pl.startCut(clock.ctx)
		}
		return p, err
	}
	p.clock = clock
	return p, nil
}

// startCut is the StartError of a start that ctx, the run's context,
// ended: the caller's, or the start's own bound.
func (pl *plan) startCut(ctx context.Context) error {
	from := FailCanceled
	var st startTimeout
	if errors.As(context.Cause(ctx), &st) {
		from = FailStartTimeout
	}
	return &StartError{Program: pl.prog, Reason: canceledWhileStarting(ctx), from: from}
}

// launchPlan starts pl under ctx, the run's context: in its session's box
// or in a box of its own.
func (s *Sandbox) launchPlan(ctx context.Context, pl *plan) (*Process, error) {
	if h := startHook.Load(); h != nil {
		(*h)(ctx, pl.spec)
	}
	if bx, err := s.boxFor(ctx, pl); err != nil {
		return nil, pl.startErr(err)
	} else if bx != nil {
		if h := boxClaimedHook.Load(); h != nil {
			(*h)(bx.key)
		}
		return bx.spawn(ctx, pl)
	}
	return s.startOneShot(ctx, pl)
}

// plan is a Spec checked and prepared, whatever launches it: a box of its
// own (startOneShot) or the session's box (Box.spawn).
type plan struct {
	spec     *Spec
	prog     string
	env      []string
	limits   Limits
	network  string
	boxed    bool   // inside bubblewrap
	tmp      string // Spec.TmpDir, shown at BoxTmp (boxed, and the directory exists)
	admin    bool   // Spec.RootfsAdmin
	writable []string
	readOnly []string
	// views are the writable directories the box shows elsewhere than at
	// their host paths (view.go): the workspace at HomeUser, TmpDir at
	// BoxTmp. nil outside a box.
	views []Bind
	uid   int // the host uid, 0 when the server is not root (or admin)
	pol   initPolicy
}

// selfInBox names the quro binary, self, where every box shows it
// (initPath, quroBinary) and only there: a run whose program is the
// binary by its host path (an engine the server re-executes, gpython)
// starts it at initPath, and a read-only path naming it binds nothing
// more, so nothing in the box (its mount table, argv, /proc/PID/exe)
// names the install location. Only the program is renamed: the run's
// other arguments and its variables are a tenant's bytes as often as the
// server's, and a tenant may name the install location (a unit file's
// ExecStart, a grep for it): they reach the box as they were given. It
// returns the run's spec (as it is outside a box).
func (pl *plan) selfInBox(self string) *Spec {
	if !pl.boxed {
		return pl.spec // no box: the binary is where it is
	}
	pl.readOnly = slices.DeleteFunc(pl.readOnly, func(p string) bool { return p == self })
	if len(pl.spec.Args) > 0 && pl.spec.Args[0] == self {
		c := *pl.spec
		c.Args = slices.Clone(c.Args)
		c.Args[0] = initPath
		pl.spec, pl.prog = &c, initPath
	}
	return pl.spec
}

// startErr is the StartError of a failure of the server's own: its text
// says what failed without the host paths in it (the cgroups', the data
// directory's), which the server log keeps (see Start).
func (pl *plan) startErr(err error) error {
	return &StartError{Program: pl.prog, Reason: hostpath.Names(err.Error()), Err: err}
}

// checkNetwork refuses a spec whose network policy this sandbox cannot
// give.
func (s *Sandbox) checkNetwork(spec *Spec) error {
	switch spec.Network {
	case "", NetworkNone, NetworkHost:
	case NetworkInternet:
		if s.egress == nil && spec.Egress == nil {
			return fmt.Errorf("%w: network policy %q: this server has no egress", ErrInvalidSpec, NetworkInternet)
		}
	default:
		return fmt.Errorf("%w: network policy %q: want one of %v", ErrInvalidSpec, spec.Network, Networks)
	}
	if spec.Egress != nil && (spec.Network != NetworkInternet || spec.Session != "" || s.session != "") {
		return fmt.Errorf("%w: an egress of the run's own needs network %q and a box of its own (no session)", ErrInvalidSpec, NetworkInternet)
	}
	return nil
}

// prepare is the first step of a start: check the spec, build the
// program's environment, choose its uid (handing the session's directories
// to it) and the policy the init child applies.
func (s *Sandbox) prepare(spec *Spec) (*plan, error) {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, fmt.Errorf("%w: no program", ErrInvalidSpec)
	}
	if spec.Dir == "" || !filepath.IsAbs(spec.Dir) {
		return nil, fmt.Errorf("%w: the working directory must be an absolute path", ErrInvalidSpec)
	}
	if err := s.checkSessionRun(spec); err != nil {
		return nil, err
	}
	pl := &plan{spec: spec, prog: spec.Args[0], network: cmp.Or(spec.Network, NetworkNone)}
	if err := s.checkNetwork(spec); err != nil {
		return nil, err
	}
	pl.boxed = s.layers.ok(LayerNamespaces)
	pl.tmp = boxTmpDir(pl.boxed, spec.TmpDir)
	if spec.StartsInHome && !(pl.boxed && slices.ContainsFunc(append(slices.Clone(s.binds), spec.Binds...), func(b Bind) bool { return b.Dst == HomeUser })) {
		// No view of the workspace at HomeUser for the box's init or
		// bubblewrap to enter: the box's sh enters it (or says why not).
		c := *spec
		c.StartsInHome = false
		c.Args = EnterDirArgs(HomeUser, spec.Args)
		spec, pl.spec, pl.prog = &c, &c, c.Args[0]
	}
	var extra RunEnv
	if s.runEnv != nil && !spec.RootfsAdmin {
		extra = s.runEnv(spec, pl.network)
	}
	var err error
	if pl.env, err = s.env(pl, extra.Env); err != nil {
		return nil, err
	}
	if err := s.layers.check(s.isolation); err != nil {
		return nil, pl.startErr(err)
	}
	pl.limits = s.limits
	if spec.Limits != nil {
		pl.limits = *spec.Limits
	}
	if spec.Rootfs != "" && !pl.boxed {
		return nil, pl.startErr(errors.New("a rootfs needs the namespaces layer (bubblewrap)"))
	}
	if pl.network == NetworkInternet && (!pl.boxed || !s.layers.root) {
		return nil, pl.startErr(fmt.Errorf("network policy %q needs the box (bubblewrap) and a server running as root", NetworkInternet))
	}
	pl.admin = spec.RootfsAdmin
	if pl.admin && (spec.Rootfs == "" || !s.layers.root) {
		return nil, pl.startErr(errors.New("changing a rootfs needs a rootfs, the box and a server running as root"))
	}

	// The session's own directories: the only writable host paths.
	pl.writable = []string{spec.Dir}
	for _, d := range append([]string{spec.TmpDir}, spec.Writable...) {
		if d != "" && filepath.IsAbs(d) && !slices.Contains(pl.writable, d) && exists(d) {
			pl.writable = append(pl.writable, d)
		}
	}
	if s.layers.root && !pl.admin {
		pl.uid = cmp.Or(max(spec.UID, 0), s.uid, AnonymousUID(spec.Dir))
		if err := handOver(pl.uid, pl.writable...); err != nil {
			return nil, pl.startErr(err)
		}
	}
	for _, p := range append(slices.Clone(spec.ReadOnly), extra.ReadOnly...) {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%w: read-only path %q is not absolute", ErrInvalidSpec, p)
		}
		if p = filepath.Clean(p); exists(p) && !slices.Contains(pl.readOnly, p) {
			pl.readOnly = append(pl.readOnly, p)
		}
	}
	spec = pl.selfInBox(s.self)

	for _, bd := range append(slices.Clone(s.binds), spec.Binds...) {
		if !bd.Writable {
			continue
		}
		// Another name for one of the run's own writable directories,
		// never more of the host.
		if !filepath.IsAbs(bd.Src) || !filepath.IsAbs(bd.Dst) ||
			!slices.ContainsFunc(pl.writable, func(d string) bool { return beneath(filepath.Clean(bd.Src), d) }) {
			return nil, fmt.Errorf("%w: writable bind %q is not within the run's writable directories", ErrInvalidSpec, bd.Src)
		}
	}
	pl.view(append(slices.Clone(s.binds), spec.Binds...))
	pl.pol = s.initPolicy(pl)
	return pl, nil
}

// boxTmpDir is the directory a run's box shows at BoxTmp: its TmpDir,
// when the run is boxed and the directory is there; else "".
func boxTmpDir(boxed bool, tmp string) string {
	if !boxed || tmp == "" || !filepath.IsAbs(tmp) || !exists(tmp) {
		return ""
	}
	return filepath.Clean(tmp)
}

// initPolicy is what the init child applies to pl: the layers it has, and
// the paths Landlock lets the program read and write.
func (s *Sandbox) initPolicy(pl *plan) initPolicy {
	pol := initPolicy{
		Landlock: s.layers.ok(LayerLandlock),
		Seccomp:  s.layers.ok(LayerSeccomp),
		Network:  pl.network,
		OwnNetns: pl.boxed && pl.network != NetworkHost,
	}
	for _, d := range pl.writable {
		// Where the box shows it (Landlock opens the path in the box).
		if at := inView(pl.views, d); !slices.Contains(pol.RW, at) {
			pol.RW = append(pol.RW, at)
		}
	}
	pol.RW = append(pol.RW, "/tmp", "/dev/shm")
	if pl.admin {
		pol.RW = append(pol.RW, rootfsAdminRW...)
		pol.Caps = AdminCaps
	}
	if pl.boxed {
		pol.ListDirs = []string{"/"}
		pol.RO = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/opt", "/var", "/srv", "/run/quro"}
		if pl.uid != 0 {
			// bubblewrap hands the box to the init child as the box's
			// root; the child switches to insideUID.
			pol.UID = insideUID
		}
	} else {
		// No box: Landlock alone keeps the host's secrets out of reach.
		pol.RO = append([]string{"/usr", "/proc"}, hostLibDirs...)
		pol.ROFiles = append(append(slices.Clone(etcFiles), s.host.runtimeEtc()...), "/etc/passwd", "/etc/group", "/etc/resolv.conf")
		pol.UID = pl.uid
	}
	for _, p := range pl.readOnly {
		at := p
		if pl.boxed {
			at, _ = placed(s.places, p) // where the box shows it
		}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			pol.RO = append(pol.RO, at)
		} else {
			pol.ROFiles = append(pol.ROFiles, at)
		}
	}
	return pol
}

// plumbing is the second step: the descriptors a started program gets
// (stdio, the spec's ExtraFiles, the status channel, its environment) and
// the pipes the server reads its output from.
type plumbing struct {
	fds       *fdList     // the child's descriptors from 3 on
	stdio     [3]*os.File // the child's 0, 1, 2; nil: /dev/null
	childEnds []*os.File  // the server's copies of what the child holds, closed once it started
	statusR   *os.File    // the server's end of the status channel
	envFD     int
	statusFD  string
	pumps     []func()
}

// plumb builds pb for pl and records in p the pipes p owns (its output
// readers, its stdin writer). status is the child's end of the status
// channel and statusR the server's.
func (pl *plan) plumb(p *Process, statusR, statusW *os.File) (*plumbing, error) {
	spec := pl.spec
	pb := &plumbing{fds: &fdList{files: slices.Clone(spec.ExtraFiles)}, statusR: statusR, childEnds: []*os.File{statusW}}
	pb.statusFD = pb.fds.add(statusW)
	envF, err := envFile(pl.env)
	if err != nil {
		return pb, err
	}
	pb.childEnds = append(pb.childEnds, envF)
	pb.envFD, _ = strconv.Atoi(pb.fds.add(envF))

	switch in := spec.Stdin.(type) {
	case nil:
	case *os.File:
		pb.stdio[0] = in
	default:
		r, w, err := os.Pipe()
		if err != nil {
			return pb, err
		}
		pb.childEnds = append(pb.childEnds, r)
		pb.stdio[0] = r
		p.stdinW = w
	}
	for i, w := range []io.Writer{spec.Stdout, spec.Stderr} {
		switch w := w.(type) {
		case nil:
		case *os.File:
			pb.stdio[1+i] = w
		default:
			if i == 1 && sameWriter(spec.Stdout, spec.Stderr) {
				// One writer for both: one pipe, as os/exec does, so the
				// writer is never written from two goroutines and keeps
				// the order in which the program wrote.
				pb.stdio[2] = pb.stdio[1]
				continue
			}
			r, wr, err := os.Pipe()
			if err != nil {
				return pb, err
			}
			pb.childEnds = append(pb.childEnds, wr)
			p.readers = append(p.readers, r)
			pb.stdio[1+i] = wr
			pb.pumps = append(pb.pumps, func() { p.pump(w, r) })
		}
	}
	return pb, nil
}

// closeChildEnds closes the server's copies of the child's descriptors.
func (pb *plumbing) closeChildEnds() {
	for _, f := range pb.childEnds {
		f.Close()
	}
	pb.childEnds = nil
}

// run starts the output pumps and the stdin copy once the child holds its
// ends.
func (pb *plumbing) run(p *Process, stdin io.Reader) {
	for _, pump := range pb.pumps {
		p.pumps.Add(1)
		go pump()
	}
	if p.stdinW != nil {
		go func() {
			// A program that exits without reading all of stdin breaks
			// the pipe: not an error of the run.
			_, _ = io.Copy(p.stdinW, stdin)
			p.stdinW.Close()
		}()
	}
}

// closeParent closes what p holds of a start that failed.
func (p *Process) closeParent() {
	for _, f := range p.readers {
		f.Close()
	}
	if p.stdinW != nil {
		p.stdinW.Close()
	}
}

// initArgs is the init child's argv after the binary: the status fd, the
// rlimits, the compiled policy, then the program.
func (pl *plan) initArgs(pb *plumbing) ([]string, error) {
	bpol, err := pl.pol.compile()
	if err != nil {
		return nil, err
	}
	bpol.EnvFD = pb.envFD
	return append([]string{boxinit.Arg, pb.statusFD, pl.limits.rlimits().encode(), bpol.Encode(), "--"}, pl.spec.Args...), nil
}

// startOneShot launches pl in a box of its own (or, without the namespaces
// layer, directly): its own cgroups, bubblewrap, the uid maps, the
// go-ahead, then the handshake with the init child.
func (s *Sandbox) startOneShot(ctx context.Context, pl *plan) (*Process, error) {
	spec := pl.spec
	p := &Process{ctx: ctx, drain: s.drainGrace, boxed: pl.boxed, tty: spec.TTY, errW: spec.Stderr}
	if s.note != nil {
		p.note = func() string { return s.note(spec.Dir) }
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, pl.startErr(err)
	}
	defer statusR.Close()
	pb, err := pl.plumb(p, statusR, statusW)
	var cg *runCgroup
	if err == nil {
		cg, err = s.runCgroup(pl.limits, spec.tenantDir())
	}
	if err != nil {
		pb.closeChildEnds()
		p.closeParent()
		if errors.Is(err, ErrInvalidSpec) {
			return nil, err
		}
		return nil, pl.startErr(err)
	}
	p.cg = cg
	if cg != nil {
		p.oomBefore = cg.oomCounts()
	}
	var l *launch
	if pl.network == NetworkInternet {
		// A box of its own under NetworkNone keeps bubblewrap's namespace
		// (loopback only); under NetworkInternet the server makes it.
		session := spec.Session
		if session == "" {
			session = s.session
		}
		p.net, err = s.openNet(session, pl.network, spec.Egress)
	}
	if err == nil {
		l, err = s.oneShotLaunch(ctx, pl, pb, cg != nil, p.net.namespace())
	}
	if err != nil {
		pb.closeChildEnds()
		p.closeParent()
		if cg != nil {
			cg.remove()
		}
		p.net.close()
		return nil, pl.startErr(err)
	}
	p.Cmd = l.cmd
	p.start = time.Now()
	born, exit, err := l.start(cg)
	pb.closeChildEnds()
	p.exit = exit
	if err != nil {
		l.closeGoAhead()
		if l.cmd.Process != nil {
			// Started, but the thread that started it could not leave the
			// run's cgroups (see startInside).
			p.Wait()
		} else {
			p.closeParent()
			if cg != nil {
				cg.remove()
			}
			p.net.close()
		}
		return nil, pl.startErr(err)
	}
	pb.run(p, spec.Stdin)
	if l.hold {
		if _, err := l.release(cg, born); err != nil {
			p.Wait()
			return nil, pl.startErr(err)
		}
	}
	err = p.handshake(pl.prog, statusR)
	return p, err
}

// runCgroup makes the cgroups of a run (or a session box) with limits,
// beneath those of the tenant of dir, admitted against its ceilings; nil
// without the cgroup layer.
func (s *Sandbox) runCgroup(limits Limits, dir string) (*runCgroup, error) {
	if !s.layers.ok(LayerCgroups) {
		return nil, nil
	}
	tenant, err := s.admitTenant(dir)
	if err != nil {
		return nil, err
	}
	return s.layers.cg.create(limits, tenant)
}

// handshake is the last step of a start: the init child writes
// boxinit.ReadyByte just before it execs the program, or the reason it
// cannot. Nothing at all means the box itself failed. On failure the
// process has been waited for.
func (p *Process) handshake(prog string, statusR *os.File) error {
	var buf [4096]byte
	n, _ := io.ReadAtLeast(statusR, buf[:], 1)
	if n > 0 && buf[0] == boxinit.ReadyByte {
		return nil
	}
	rest, _ := io.ReadAll(statusR)
	return p.startFailed(prog, string(append(buf[:n], rest...)))
}

// startFailed waits for a process whose init child did not exec the
// program and says why.
func (p *Process) startFailed(prog, msg string) error {
	exit := p.Wait()
	from := FailInit
	if msg == "" {
		from = FailBox
		if p.ctx.Err() != nil {
			msg = canceledWhileStarting(p.ctx)
		} else {
			msg = fmt.Sprintf("the sandbox could not be set up (exit status %d; its message, if any, is in stderr)", exit.Code)
		}
	}
	return initFailure(prog, msg, from)
}

// tenantDir is the directory that names the run's tenant.
func (s *Spec) tenantDir() string {
	if s.TenantDir != "" {
		return s.TenantDir
	}
	return s.Dir
}

// admitTenant returns the tenant of a run in dir, checked against its
// ceilings, or nil when runs have no tenant cgroup.
func (s *Sandbox) admitTenant(dir string) (*Tenant, error) {
	if s.tenant == nil {
		return nil, nil
	}
	t, ok := s.tenant(dir)
	if !ok {
		return nil, nil
	}
	if t.Refused != nil {
		return nil, t.Refused
	}
	if err := s.admitAwaiting(&t, Room{}); err != nil {
		return nil, err
	}
	return &t, nil
}

// bwrapFor describes the box of pl.
func (s *Sandbox) bwrapFor(pl *plan, spec *Spec) *bwrapBox {
	box := &bwrapBox{spec: spec, self: s.self, host: s.host, network: pl.network, writable: pl.writable, readOnly: pl.readOnly,
		binds: append(slices.Clone(s.binds), spec.Binds...), places: s.places, tmp: pl.tmp, tmpSize: 256 << 20, admin: pl.admin}
	box.setViews()
	if pl.admin {
		box.passwd = "" // the rootfs's own accounts, which dpkg may change
	}
	return box
}

// pipes2 makes two pipes: info (read, write) and block (read, write).
func pipes2() (ir, iw, br, bw *os.File, err error) {
	if ir, iw, err = os.Pipe(); err != nil {
		return
	}
	if br, bw, err = os.Pipe(); err != nil {
		ir.Close()
		iw.Close()
	}
	return
}

// childPID reads the host pid of the box's first process, which
// bubblewrap reports on its info fd before it waits on its block fd.
func childPID(info io.Reader) (int, error) {
	var bi struct {
		ChildPID int `json:"child-pid"`
	}
	err := json.NewDecoder(info).Decode(&bi)
	if err == nil && bi.ChildPID <= 0 {
		err = errors.New("no child-pid")
	}
	if err != nil {
		return 0, fmt.Errorf("bubblewrap did not report its child: %v", err)
	}
	return bi.ChildPID, nil
}

// mapIDs writes the user namespace maps of the box whose first process is
// pid: the run's unprivileged host uid appears as insideUID, and root as
// root, so that bubblewrap (running as the server, root) can still reach
// the paths it binds while it builds the box. User code never gets uid 0
// back: bubblewrap switches to insideUID and drops every capability, and
// no_new_privs and seccomp stay on.
func mapIDs(pid, uid int) error {
	m := fmt.Sprintf("0 0 1\n%d %d 1\n", insideUID, uid)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			return fmt.Errorf("user namespace %s: %w", f, err)
		}
	}
	return nil
}

// adminIDs is how many uids and gids, from 0, a RootfsAdmin box maps to
// themselves: every id a Debian system gives its files (nobody is 65534).
const adminIDs = 65536

// mapAdminIDs writes the identity maps of a RootfsAdmin box: host uids and
// gids 0..adminIDs-1 are themselves inside, so dpkg can own files as root,
// _apt, man… exactly as debootstrap left them.
func mapAdminIDs(pid int) error {
	m := fmt.Sprintf("0 0 %d\n", adminIDs)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			return fmt.Errorf("user namespace %s: %w", f, err)
		}
	}
	return nil
}

// Boxed reports whether the process was started inside bubblewrap. Its
// exit status then passes through bubblewrap, which reports it only if it
// is not killed first.
func (p *Process) Boxed() bool { return p.boxed }

// Group is the process group of the user's program in host numbering: the
// group to signal to reach the program and what it runs in the foreground
// (an interrupt), and the pgrp that /proc shows for them. Without the box
// it is the started process's own group. In the box it is the session that
// bubblewrap's --new-session made inside: its leader is the first
// descendant of bubblewrap that leads a session (the box's pid 1), and the
// program and its children are in that group. Killing the run as a whole
// is still killGroup on Cmd (bubblewrap's --die-with-parent and the pid
// namespace take the rest). For TTY specs the terminal's session is the
// started process's, so Group is Cmd.Process.Pid; the foreground job is
// reached through the terminal (^C).
//
// Group returns 0 when the process is gone.
func (p *Process) Group() int {
	if p.bx != nil {
		select {
		case <-p.ended:
			return 0
		default:
			return p.pid
		}
	}
	if p.Cmd.Process == nil {
		return 0
	}
	pid := p.Cmd.Process.Pid
	if !p.boxed || p.tty {
		return pid
	}
	p.groupMu.Lock()
	defer p.groupMu.Unlock()
	if p.group == 0 {
		p.group = innerSessionLeader(pid)
	}
	return p.group
}

// innerSessionLeader returns the first descendant of pid (breadth first)
// that leads a session, or 0.
func innerSessionLeader(pid int) int {
	procs, err := readProcs()
	if err != nil {
		return 0
	}
	children := map[int][]int{}
	for _, pr := range procs {
		children[pr.ppid] = append(children[pr.ppid], pr.pid)
	}
	sid := map[int]int{}
	for _, pr := range procs {
		sid[pr.pid] = pr.sid
	}
	queue := slices.Clone(children[pid])
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		if sid[c] == c {
			return c
		}
		queue = append(queue, children[c]...)
	}
	return 0
}

type procStat struct{ pid, ppid, pgrp, sid int }

// readProcs reads pid, ppid, pgrp and session of every process from /proc
// (there is no /proc/PID/task/TID/children on every kernel).
func readProcs() ([]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...: comm may hold spaces.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 4 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		out = append(out, procStat{pid: pid, ppid: ppid, pgrp: pgrp, sid: sid})
	}
	return out, nil
}

// homeDir is the spec's HOME.
func (spec *Spec) homeDir() string {
	if spec.Home != "" {
		return spec.Home
	}
	return spec.Dir
}

func (p *Process) pump(w io.Writer, r *os.File) {
	defer p.pumps.Done()
	_, err := io.Copy(w, r)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
		p.errMu.Lock()
		p.pumpErr = err
		p.errMu.Unlock()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.errMu.Lock()
		p.pumpErr = os.ErrDeadlineExceeded
		p.errMu.Unlock()
	}
}

// Wait waits for the process to exit, kills what is left of its process
// group, drains its output (bounded by the drain grace) and reports how it
// ended.
func (p *Process) Wait() Exit {
	defer p.clock.stop()
	if p.bx != nil {
		return p.waitBox()
	}
	waitErr := waitCmd(p.Cmd, p.exit)
	// Nothing of a run outlives it: background jobs left in the group go
	// too, and everything left in its cgroup (the box's pid namespace died
	// with bubblewrap already).
	_ = killGroup(p.Cmd) // best effort: the group may be gone already (ESRCH)
	defer p.net.close()
	var oom OOM
	killed := false
	if p.cg != nil {
		killed, oom = p.cg.oomSince(p.oomBefore, false)
		p.cg.kill()
		defer p.cg.remove()
	}
	e := p.finish()
	e.OOMKilled, e.OOM = killed, oom
	if st := p.Cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal()
			e.Code = 128 + int(e.Signal)
		} else {
			e.Code = st.ExitCode()
			// bubblewrap reports a program killed by signal N as 128+N.
			if p.boxed && e.Code > 128 && e.Code <= 128+64 {
				e.Signal = syscall.Signal(e.Code - 128)
			}
		}
	} else if waitErr != nil {
		e.Code = -1
	}
	return e
}

// Pid is the host pid of the process Quro started: the program itself in
// a session box, else bubblewrap (or, without the box, the program).
func (p *Process) Pid() int {
	if p.bx != nil {
		return p.pid
	}
	if p.Cmd == nil || p.Cmd.Process == nil {
		return 0
	}
	return p.Cmd.Process.Pid
}

// oneShotPid is the pid of the program in a box of its own: bubblewrap,
// without --as-pid-1, is the new pid namespace's pid 1, and the one
// process it forks, the init child that execs the program, its pid 2.
const oneShotPid = 2

// BoxPid is the program's pid in its box (the pid namespace it runs in),
// what the program itself sees as its pid ($$): in a session box the one
// the box init named when it spawned it, in a box of its own oneShotPid,
// without the box its host pid. It is known when Start returns and never
// changes, whatever the program does after (it may have ended already);
// nothing is read from /proc. 0 only for a process that never started.
func (p *Process) BoxPid() int {
	if p.bx != nil {
		select {
		case <-p.started:
			return p.boxPid
		default:
			return 0
		}
	}
	if p.Cmd == nil || p.Cmd.Process == nil {
		return 0
	}
	if p.boxed {
		return oneShotPid
	}
	return p.Cmd.Process.Pid
}

// Signal sends sig to the program's process group: what an interrupt
// (^C) reaches, the program and what it runs in the foreground.
func (p *Process) Signal(sig syscall.Signal) {
	if p.bx != nil {
		select {
		case <-p.ended:
		default:
			p.bx.signal(p.boxID, sig, true)
		}
		return
	}
	if g := p.Group(); g > 0 {
		syscall.Kill(-g, sig)
	}
}

// SignalsDelivered returns once every signal sent to the program so far
// (Signal, Interrupt) has been sent by kill(2): in a session box a signal
// is a message to the box's init, which sends it when it reads it — at
// load, after its sender has gone on (a SIGINT meant for one request of
// a long-lived program that lands while it serves the next). Outside a
// box Signal is kill(2) itself. It fails when ctx ended first, or the
// box is gone (its processes with it: no signal is on its way).
func (p *Process) SignalsDelivered(ctx context.Context) error {
	if p.bx == nil {
		return nil
	}
	return p.bx.signalsSent(ctx)
}

// Interrupt asks the program to stop as a person at a terminal would: sig
// to its process group now and, when every > 0, again every `every` (a
// signal that lands before the program is ready for it is lost), until
// settled is ready; if grace passes first, the run is killed (Kill) and
// Interrupt reports true. It returns once settled is ready or the run
// was killed; a receive from settled is consumed.
func (p *Process) Interrupt(sig syscall.Signal, every, grace time.Duration, settled <-chan struct{}) (killed bool) {
	p.Signal(sig)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-settled:
			return false
		case <-tick:
			p.Signal(sig)
		case <-deadline.C:
			select {
			case <-settled:
				return false
			default:
			}
			p.Kill()
			return true
		}
	}
}

// Kill kills the run: the program's process group and, for a box of its
// own, bubblewrap's (whose death takes the box's pid namespace with it).
// Wait still reports the end.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	if p.bx == nil && p.Cmd != nil && p.Cmd.Process != nil {
		syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Run starts spec and waits for it.
func (s *Sandbox) Run(ctx context.Context, spec *Spec) (Exit, error) {
	p, err := s.Start(ctx, spec)
	if err != nil {
		return Exit{}, err
	}
	return p.Wait(), nil
}

func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// sameWriter reports whether a and b are the same writer (false when
// their type cannot be compared).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a != nil && a == b
}
