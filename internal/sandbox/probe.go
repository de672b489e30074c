package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// Feature is one isolation mechanism as found on this machine.
type Feature struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Used says whether Quro applies it to user code in this build.
	Used   bool   `json:"used"`
	Detail string `json:"detail"`
}

// Probe reports the isolation layers (outermost first: found on this
// machine, used for runs or not, and why) followed by the machine facts
// behind them. Under IsolationFull a missing required layer means no run
// starts; under IsolationMinimal the run goes ahead without it.
func (s *Sandbox) Probe(ctx context.Context) []Feature {
	feats := []Feature{{Name: "isolation", Available: true, Used: true, Detail: s.isolationDetail()}}
	for _, f := range s.Layers() {
		if !f.Available && s.isolation == IsolationFull && slices.Contains(s.layers.require, f.Name) {
			f.Detail = "MISSING (runs refused): " + f.Detail
		}
		feats = append(feats, f)
	}
	return append(feats,
		Feature{Name: "process group", Available: true, Used: true,
			Detail: "own process group, parent-death signal, group killed on timeout and at run end"},
		Feature{Name: "environment", Available: true, Used: true,
			Detail: "cleared; whitelist PATH HOME LANG TERM TMPDIR plus session variables"},
		s.userNSRow(ctx),
		s.cgroup2Row(),
		s.cgroup1MemoryRow(),
		s.cpuWeightRow(),
	)
}

// userNSRow is the machine fact behind the namespaces layer: bubblewrap
// puts every box in a user namespace of its own, so they are used exactly
// when the namespaces layer is.
func (s *Sandbox) userNSRow(ctx context.Context) Feature {
	f := probeUserNS(ctx, s.self)
	f.Used = s.layers.ok(LayerNamespaces)
	if f.Used {
		f.Detail += "; bubblewrap gives each box its own (with pid, mount, ipc, uts, cgroup and net)"
	} else if f.Available {
		f.Detail += "; not used: no box without the namespaces layer"
	}
	return f
}

// cgroup2Row says whether the unified hierarchy is there and which of the
// run controllers the cgroups layer takes from it.
func (s *Sandbox) cgroup2Row() Feature {
	f := probeCgroup2()
	var used []string
	for _, ctrl := range cgroupControllers {
		if s.layers.cg.v2[ctrl] {
			used = append(used, ctrl)
		}
	}
	if len(used) > 0 {
		f.Used = true
		f.Detail += "; runs use " + strings.Join(used, " ") + " from it"
	}
	return f
}

// cgroup1MemoryRow says whether a v1 memory hierarchy is there and whether
// runs get their memory limit from it.
func (s *Sandbox) cgroup1MemoryRow() Feature {
	f := probeCgroup1Memory()
	if base := s.layers.cg.base["memory"]; base != "" && !s.layers.cg.v2["memory"] {
		f.Used = true
		f.Detail += "; runs' memory cgroups are made under " + base
	}
	return f
}

func (s *Sandbox) isolationDetail() string {
	if s.isolation == IsolationMinimal {
		return "minimal: layers the machine lacks are skipped (opted in with --isolation=minimal)"
	}
	return "full: a run fails closed when a required layer (" + strings.Join(s.layers.require, ", ") + ") is missing"
}

// userNSMade is set once this process has made a user namespace: the
// kernel's answer does not change while it runs, so later sandboxes (one
// per test, or a restarted layer check) need not ask again.
var userNSMade atomic.Bool

// probeUserNS makes a user+pid+mount namespace as bubblewrap would. The
// verdict is Start's: the kernel creates the namespaces, and Go writes the
// id maps and execs the child, before Start returns, so a refusal is
// Start's error. The child, which only exits, is then reaped within the
// deadline or killed, in the background: a loaded machine that is slow to
// run it has not lost the layer, and the sandbox's making (every App's
// start, every CLI command's) does not wait for a process whose only news
// is its exit.
func probeUserNS(ctx context.Context, self string) Feature {
	f := Feature{Name: "user namespaces"}
	made := func() Feature {
		f.Available = true
		f.Detail = "a user+pid+mount namespace was created as uid " + strconv.Itoa(os.Geteuid())
		return f
	}
	if userNSMade.Load() {
		return made()
	}
	cmd := exec.Command(self, boxinit.ProbeArg)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		f.Detail = "cannot create a user+pid+mount namespace as uid " + strconv.Itoa(os.Geteuid()) + ": " + err.Error()
		if why := userNSBlocked(); why != "" {
			f.Detail += " (" + why + ")"
		}
		return f
	}
	userNSMade.Store(true)
	go reap(ctx, cmd, 5*time.Second)
	return made()
}

// reap waits for a started child that has nothing left to say, killing it
// when ctx ends or after limit.
func reap(ctx context.Context, cmd *exec.Cmd, limit time.Duration) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-ctx.Done():
	case <-t.C:
	}
	_ = cmd.Process.Kill()
	<-done
}

// userNSFailure says why bubblewrap, at path, cannot make the user
// namespace of a box, or "" when it can: the sysctls that forbid it, then
// a real attempt (a kernel or security module can refuse without any
// sysctl saying so). A setuid-root bubblewrap does not need unprivileged
// user namespaces, so only the sysctls count for it.
func userNSFailure(path string) string {
	if why := userNSBlocked(); why != "" {
		return why
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSetuid != 0 {
		return ""
	}
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	if f := probeUserNS(context.Background(), self); !f.Available {
		return f.Detail
	}
	return ""
}

// cgroup2Root finds the cgroup v2 mount: /sys/fs/cgroup on unified hosts,
// /sys/fs/cgroup/unified on hybrid ones.
func cgroup2Root() string {
	for _, m := range mounts() {
		if m.fstype == "cgroup2" {
			return m.dir
		}
	}
	return ""
}

func probeCgroup2() Feature {
	f := Feature{Name: "cgroup v2"}
	root := cgroup2Root()
	if root == "" {
		f.Detail = "no cgroup2 mount"
		return f
	}
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		f.Detail = root + ": " + err.Error()
		return f
	}
	ctrls := strings.Fields(string(b))
	f.Available = true
	if len(ctrls) == 0 {
		f.Detail = root + " (no controllers delegated)"
	} else {
		f.Detail = root + " controllers: " + strings.Join(ctrls, " ")
	}
	return f
}

func probeCgroup1Memory() Feature {
	f := Feature{Name: "cgroup v1 memory"}
	for _, m := range mounts() {
		if m.fstype == "cgroup" && strings.Contains(","+m.opts+",", ",memory,") {
			f.Available = true
			f.Detail = m.dir
			return f
		}
	}
	f.Detail = "no cgroup v1 memory hierarchy mounted"
	return f
}

type mount struct{ dir, fstype, opts string }

func mounts() []mount {
	fh, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer fh.Close()
	var ms []mount
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 4 {
			ms = append(ms, mount{dir: f[1], fstype: f[2], opts: f[3]})
		}
	}
	return ms
}

// probeCgroupDir checks that runs can get cgroups under base: it makes a
// child cgroup there and removes it again, as each run will. A base that
// exists is not enough: one made by root (an earlier server, or a root
// `quro` on this machine) is not writable by a server running as another
// user, whose runs would then fail on their first mkdir.
func probeCgroupDir(base string) error {
	var rnd [6]byte
	rand.Read(rnd[:])
	dir := filepath.Join(base, fmt.Sprintf("probe-%d-%x", os.Getpid(), rnd))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return os.Remove(dir)
}

// cgroupFix is what to do when the server cannot make cgroups: the ways to
// get the cgroups layer, and what --isolation=minimal gives up instead.
//
// A delegated cgroup v2 subtree (systemd Delegate=yes) is not offered: the
// server would have to leave its own cgroup first (the kernel enables
// controllers for children only in a cgroup without processes of its
// own), which it does not do yet.
const cgroupFix = "run quro as root; or give the user running quro cgroups of its own " +
	"(as root, in each v1 hierarchy memory, pids and cpu: mkdir a cgroup, chown -R it to the user, " +
	"and start quro with its process in them); " +
	"or start quro with --isolation=minimal, which runs without per-run memory, process and CPU limits " +
	"(a memory or fork bomb is then stopped only by the rlimits: address space and CPU time per process) " +
	"and without killing a run's leftover processes as a whole"

// cgroupError adds the fix to an error of making or writing a cgroup when
// the kernel said the server may not (the cgroup became unwritable after
// the server started, e.g. chowned back to root).
func cgroupError(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w (the server, uid %d, may not make cgroups there: %s)", err, os.Geteuid(), cgroupFix)
	}
	return err
}
