package sandbox

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Feature is one isolation mechanism as found on this machine.
type Feature struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	// Used says whether Quro applies it to user code in this build.
	Used   bool   `json:"used"`
	Detail string `json:"detail"`
}

// Probe inspects the machine for the isolation features Quro can use. It
// runs small checks (a user-namespace clone, a bwrap --version) and takes
// well under a second.
func (s *Sandbox) Probe(ctx context.Context) []Feature {
	uid := os.Geteuid()
	nproc := Feature{Name: "rlimits", Available: true, Used: true,
		Detail: "cpu, address space, open files, file size applied by the init child"}
	if uid == 0 {
		nproc.Detail += "; RLIMIT_NPROC does not bind root (processes are capped by cgroups/pid namespaces where used)"
	}
	return []Feature{
		{Name: "process group", Available: true, Used: true,
			Detail: "own process group, parent-death signal, group killed on timeout and at run end"},
		{Name: "environment", Available: true, Used: true,
			Detail: "cleared; whitelist PATH HOME LANG TERM TMPDIR plus session variables"},
		nproc,
		probeUserNS(ctx, s.self),
		probeBwrap(ctx),
		probeLandlock(),
		probeSeccomp(),
		probeCgroup2(),
		probeCgroup1Memory(),
	}
}

func probeUserNS(ctx context.Context, self string) Feature {
	f := Feature{Name: "user namespaces"}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, initArg+"-probe")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
	}
	if err := cmd.Run(); err != nil {
		f.Detail = "cannot create a user+pid+mount namespace: " + err.Error()
		if b, _ := os.ReadFile("/proc/sys/user/max_user_namespaces"); strings.TrimSpace(string(b)) == "0" {
			f.Detail += " (user.max_user_namespaces is 0)"
		}
		return f
	}
	f.Available = true
	f.Detail = "unprivileged user, pid and mount namespaces can be created"
	return f
}

func probeBwrap(ctx context.Context) Feature {
	f := Feature{Name: "bubblewrap"}
	path, err := exec.LookPath("bwrap")
	if err != nil {
		f.Detail = "bwrap not installed (Debian: apt-get install bubblewrap)"
		return f
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		f.Detail = path + ": " + err.Error()
		return f
	}
	f.Available = true
	f.Detail = path + " " + strings.TrimSpace(string(out))
	return f
}

func probeLandlock() Feature {
	f := Feature{Name: "landlock"}
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		f.Detail = "not available: " + errno.Error()
		return f
	}
	f.Available = true
	f.Detail = "ABI " + strconv.Itoa(int(abi))
	return f
}

func probeSeccomp() Feature {
	f := Feature{Name: "seccomp"}
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		f.Detail = "not available: " + err.Error()
		return f
	}
	f.Available = true
	f.Detail = "filter mode"
	if b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail"); err == nil {
		f.Detail += "; actions: " + strings.TrimSpace(string(b))
	}
	return f
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
