package sandbox

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
		probeUserNS(ctx, s.self),
		probeCgroup2(),
		probeCgroup1Memory(),
	)
}

func (s *Sandbox) isolationDetail() string {
	if s.isolation == IsolationMinimal {
		return "minimal: layers the machine lacks are skipped (opted in with --isolation=minimal)"
	}
	return "full: a run fails closed when a required layer (" + strings.Join(s.layers.require, ", ") + ") is missing"
}

func probeUserNS(ctx context.Context, self string) Feature {
	f := Feature{Name: "user namespaces"}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, boxinit.ProbeArg)
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
