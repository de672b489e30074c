package sandbox

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The isolation layers, outermost first: the order in which they wrap the
// user program. The server process applies the first three while it starts
// the run, bubblewrap builds the box, and the init child applies the rest
// just before it execs the user program.
const (
	LayerUser       = "user"       // an unprivileged host uid per session, never root
	LayerCgroups    = "cgroups"    // memory (swap off), pids and cpu per run; killed as a whole
	LayerNamespaces = "namespaces" // bubblewrap: user, pid, mount, ipc, uts, cgroup (+net) namespaces
	LayerRlimits    = "rlimits"    // cpu time, address space, open files, file size
	LayerLandlock   = "landlock"   // filesystem, TCP, abstract-socket and signal scoping
	LayerSeccomp    = "seccomp"    // a syscall deny list
)

// Layers lists every layer, outermost first.
var Layers = []string{LayerUser, LayerCgroups, LayerNamespaces, LayerRlimits, LayerLandlock, LayerSeccomp}

// ErrLayerMissing is wrapped by the error of a run that full isolation
// refused because a required layer is missing on this machine.
var ErrLayerMissing = errors.New("required isolation layer missing")

// LayerError names the missing layers, why, and how to get them.
type LayerError struct {
	Missing []Feature
}

func (e *LayerError) Error() string {
	var parts []string
	for _, f := range e.Missing {
		parts = append(parts, f.Name+": "+f.Detail)
	}
	return "isolation layer(s) missing, so no user code runs: " + strings.Join(parts, "; ") +
		". Install what is missing, or start quro with --isolation=minimal to run with fewer layers"
}

func (e *LayerError) Unwrap() error { return ErrLayerMissing }

// layerSet is what New found on this machine, once.
type layerSet struct {
	found   map[string]Feature
	require []string
	bwrap   string
	cg      *cgroups
	root    bool
}

func findLayers(require []string) *layerSet {
	if require == nil {
		require = Layers
	}
	l := &layerSet{found: map[string]Feature{}, require: require, root: os.Geteuid() == 0}
	add := func(f Feature) { l.found[f.Name] = f }

	if l.root {
		add(Feature{Name: LayerUser, Available: true,
			Detail: fmt.Sprintf("the server is root: each session runs as its own uid %d-%d (mapped to %d inside), owning its workspace", uidBase, uidBase+uidRange-1, insideUID)})
	} else {
		add(Feature{Name: LayerUser, Available: true,
			Detail: fmt.Sprintf("the server runs as uid %d, so user code does too (mapped to %d inside); no per-session uid without root", os.Geteuid(), insideUID)})
	}

	l.cg = openCgroups()
	cg := Feature{Name: LayerCgroups, Detail: l.cg.detail}
	if l.cg.has("memory", "pids") {
		cg.Available = true
		if l.cg.base["cpu"] == "" {
			cg.Detail += " (no cpu quota: rlimit cpu time still applies)"
		}
	} else {
		cg.Detail += " — runs need memory and pids cgroups the server (uid " + strconv.Itoa(os.Geteuid()) + ") can create: " + cgroupFix
	}
	add(cg)

	ns := Feature{Name: LayerNamespaces}
	if path, err := lookBwrap(); err != nil {
		ns.Detail = err.Error()
	} else if why := userNSFailure(path); why != "" {
		ns.Detail = path + " found, but " + why
	} else {
		l.bwrap = path
		ns.Available = true
		ns.Detail = path + ": new user, pid, mount, ipc, uts, cgroup namespaces, and net unless the session's policy is full"
	}
	add(ns)

	add(Feature{Name: LayerRlimits, Available: true, Detail: "cpu time, address space, open files, file size, set by the init child"})

	ll := Feature{Name: LayerLandlock}
	if abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION); errno != 0 {
		ll.Detail = "kernel has no Landlock (" + errno.Error() + "): needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= boot list"
	} else {
		ll.Available = true
		ll.Detail = "ABI " + strconv.Itoa(int(abi)) + ": " + landlockScope(int(abi))
	}
	add(ll)

	sc := Feature{Name: LayerSeccomp}
	if err := SeccompAvailable(); err != nil {
		sc.Detail = err.Error()
	} else {
		sc.Available = true
		sc.Detail = fmt.Sprintf("filter denies %d syscalls (ptrace, mount, unshare, bpf, io_uring, keyctl, …), namespace clone flags and TIOCSTI/TIOCLINUX", len(deniedSyscalls)+1)
	}
	add(sc)
	return l
}

// SeccompAvailable says why boxes on this machine get no seccomp filter
// (nil: they get it, whatever the isolation level, since minimal
// isolation skips only the layers the machine lacks). Other layers that
// rely on the filter ask it: the shared btrfs disks (internal/quota) are
// safe only where the filter refuses btrfs's ioctls to boxes.
func SeccompAvailable() error {
	if _, ok := auditArch[runtime.GOARCH]; !ok {
		return errors.New("no filter for " + runtime.GOARCH)
	}
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		return errors.New("kernel has no seccomp: " + err.Error())
	}
	return nil
}

func landlockScope(abi int) string {
	s := "filesystem"
	if abi >= 4 {
		s += ", TCP bind/connect"
	}
	if abi >= 6 {
		s += ", abstract unix sockets and signals scoped"
	}
	if abi >= 10 {
		s += ", UDP"
	}
	return s
}

// userNSBlocked says why unprivileged user namespaces cannot be created,
// or "" when nothing says they cannot.
func userNSBlocked() string {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return "user.max_user_namespaces is 0 (sysctl -w user.max_user_namespaces=15000)"
	}
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return "kernel.unprivileged_userns_clone is 0 (sysctl -w kernel.unprivileged_userns_clone=1)"
	}
	if b, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && strings.TrimSpace(string(b)) == "1" {
		return "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1; add an AppArmor profile for bwrap)"
	}
	return ""
}

func (l *layerSet) ok(name string) bool { return l.found[name].Available }

// check returns a *LayerError when isolation is full and a required layer
// is missing.
func (l *layerSet) check(isolation string) error {
	if isolation != IsolationFull {
		return nil
	}
	var missing []Feature
	for _, name := range l.require {
		if f := l.found[name]; !f.Available {
			if f.Name == "" {
				f = Feature{Name: name, Detail: "unknown layer"}
			}
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return &LayerError{Missing: missing}
	}
	return nil
}

// Layers reports each layer as found on this machine and whether runs use it.
func (s *Sandbox) Layers() []Feature {
	out := make([]Feature, 0, len(Layers))
	for _, name := range Layers {
		f := s.layers.found[name]
		f.Used = f.Available
		out = append(out, f)
	}
	return out
}

// Per-session uids are taken from [uidBase, uidBase+uidRange): above the
// ranges distributions give to people and to subordinate-id users.
const (
	uidBase  = 2_000_000
	uidRange = 1_000_000
)

// AnonymousUID is the uid of a run that belongs to no session (Spec.UID 0
// on a Sandbox not made by ForSession), derived from its directory dir. It
// lies above the session range [uidBase, uidBase+uidRange), so it is never
// a session's: sessions get their uids from the store (session.Session.UID),
// unique, and a run of a session always names it. A hash of the path was
// once the session's uid; hashes collide, and two sessions with one uid
// could act as each other.
func AnonymousUID(dir string) int {
	h := fnv.New32a()
	h.Write([]byte(filepath.Clean(dir)))
	return uidBase + uidRange + int(h.Sum32()%uidRange)
}

// ForSession returns a Sandbox like s whose runs, unless their Spec says
// otherwise, belong to session id (its box, see Spec.Session), go under uid
// and whose boxes also get binds: for code that builds its Specs without
// knowing the session (a session's shell).
func (s *Sandbox) ForSession(id string, uid int, binds []Bind) *Sandbox {
	c := *s
	c.session = id
	c.uid = uid
	c.binds = append(slices.Clone(s.binds), binds...)
	return &c
}

// handOver makes dirs belong to uid (recursively, the first time) and
// private to it.
func handOver(uid int, dirs ...string) error {
	for _, d := range dirs {
		fi, err := os.Lstat(d)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || int(st.Uid) == uid {
			continue
		}
		err = filepath.WalkDir(d, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, uid)
		})
		if err != nil {
			return fmt.Errorf("hand %s to uid %d: %w", d, uid, err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// ShowsHome reports whether the boxes of s show a workspace at HomeUser
// (a session's sandbox, ForSession, with the session's binds, in boxes).
func (s *Sandbox) ShowsHome() bool {
	return s.Boxed() && slices.ContainsFunc(s.binds, func(b Bind) bool { return b.Dst == HomeUser })
}
