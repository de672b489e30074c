package sandbox

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from what the code produces")

// The launcher golden test: for each policy a box can have, the command
// the server would start (bubblewrap's argv, the descriptors it passes,
// its environment, the init child's argv and the policy it applies),
// built by the same declarations startOneShot and openBox use, without
// starting anything: it needs neither root nor bubblewrap nor a kernel
// with Landlock, and runs under -short. The host's userland is a small
// tree in a temporary directory (hostView), and every host-specific path
// (that tree, the data directory, bubblewrap, the quro binary) is shown as
// a placeholder, so the files are the same on every machine.
//
// go test -run TestLaunchGolden ./internal/sandbox/ -update rewrites them.

// goldenCase is one launch.
type goldenCase struct {
	name      string
	missing   []string // layers this machine lacks
	isolation string
	root      bool // the server runs as root: a uid of the session's own
	cgroups   bool // the run has cgroups to join
	session   bool // a session box, not a box of the run's own
	spec      func(s *Spec, d goldenDirs)
}

// goldenDirs are the paths of the fixture.
type goldenDirs struct {
	work, tmp, extra, tool, sock, rootfs string
	// python is the interpreter's tree under <data>/python and pip its
	// pip directory beside it, which a session box shows (as the App's
	// BoxReadOnlyNow names them); other is another entry of
	// <data>/python, which no box shows.
	python, pip, other string
}

var goldenCases = []goldenCase{
	{name: "oneshot-host-none", cgroups: true},
	{name: "oneshot-host-full", cgroups: true, spec: func(s *Spec, _ goldenDirs) { s.Network = NetworkHost }},
	{name: "oneshot-host-nocgroups"},
	{name: "oneshot-root", root: true, cgroups: true},
	{name: "oneshot-tty", cgroups: true, spec: func(s *Spec, _ goldenDirs) { s.TTY = true }},
	{name: "oneshot-rootfs-none", cgroups: true, spec: func(s *Spec, d goldenDirs) { s.Rootfs = d.rootfs }},
	{name: "oneshot-rootfs-full", root: true, cgroups: true, spec: func(s *Spec, d goldenDirs) {
		s.Rootfs, s.Network = d.rootfs, NetworkHost
	}},
	{name: "oneshot-rootfs-admin", root: true, cgroups: true, spec: func(s *Spec, d goldenDirs) {
		s.Rootfs, s.RootfsAdmin, s.Network = d.rootfs, true, NetworkHost
		s.Writable, s.ReadOnly, s.Binds = nil, nil, nil
	}},
	// Landlock and seccomp are applied by the init child: bubblewrap's
	// argv is that of oneshot-host-none, only the policy differs.
	{name: "minimal-no-landlock-seccomp", isolation: IsolationMinimal, missing: []string{LayerLandlock, LayerSeccomp}, cgroups: true},
	{name: "minimal-no-box", isolation: IsolationMinimal, missing: []string{LayerNamespaces}, cgroups: true},
	{name: "minimal-no-box-no-cgroups", isolation: IsolationMinimal, missing: []string{LayerNamespaces, LayerCgroups}},
	{name: "session-host-none", session: true, cgroups: true},
	{name: "session-rootfs-none", session: true, cgroups: true, spec: func(s *Spec, d goldenDirs) { s.Rootfs = d.rootfs }},
	{name: "session-root-full", session: true, root: true, cgroups: true, spec: func(s *Spec, _ goldenDirs) {
		s.Network, s.TTY = NetworkHost, true
	}},
	// The server's own network namespace and its DNS in /etc/resolv.conf.
	{name: "session-root-internet", session: true, root: true, cgroups: true, spec: func(s *Spec, _ goldenDirs) { s.Network = NetworkInternet }},
	{name: "oneshot-root-internet", root: true, cgroups: true, spec: func(s *Spec, _ goldenDirs) { s.Network = NetworkInternet }},
}

func TestLaunchGolden(t *testing.T) {
	base := t.TempDir()
	host, d := goldenFixture(t, base)
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			got := goldenLaunch(t, c, host, d)
			got = goldenNormalise(got, base)
			file := filepath.Join("testdata", "launch", c.name+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from what the launcher builds now (run with -update to accept):\n%s", file, lineDiff(string(want), got))
			}
		})
	}
}

// goldenFixture makes a host userland, a rootfs and a session's
// directories beneath base.
func goldenFixture(t *testing.T, base string) (hostView, goldenDirs) {
	t.Helper()
	h := filepath.Join(base, "host")
	data := filepath.Join(base, "data")
	d := goldenDirs{
		work:   filepath.Join(data, "sessions", "s1", "workspace"),
		tmp:    filepath.Join(data, "sessions", "s1", "tmp"),
		extra:  filepath.Join(data, "sessions", "s1", "extra"),
		python: filepath.Join(data, "python", "3.14.0-0123456789abcdef"),
		pip:    filepath.Join(data, "python", "pip-25.1.1-0123456789ab"),
		other:  filepath.Join(data, "python", "3.13.1-fedcba9876543210"),
		tool:   filepath.Join(data, "tools", "tool"),
		sock:   filepath.Join(data, "run", "api.sock"),
		rootfs: filepath.Join(data, "rootfs", "debian"),
	}
	for _, p := range []string{
		h + "/usr/bin", h + "/usr/lib", h + "/lib64", h + "/etc/ssl/certs", h + "/etc/python3.12",
		h + "/etc/java-21-openjdk/security", h + "/etc/java-21-openjdk/management",
		d.work, d.tmp, d.extra, d.python, d.pip, d.other, filepath.Dir(d.tool), filepath.Dir(d.sock),
		d.rootfs + "/usr/bin", d.rootfs + "/etc", d.rootfs + "/var", d.rootfs + "/proc", d.rootfs + "/home",
	} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range [][2]string{{"usr/bin", h + "/bin"}, {"usr/lib", h + "/lib"}, {"usr/bin", d.rootfs + "/bin"}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{
		h + "/etc/ld.so.cache", h + "/etc/hosts", h + "/etc/resolv.conf", h + "/etc/os-release", h + "/etc/profile", d.rootfs + "/etc/profile",
		h + "/etc/python3.12/sitecustomize.py", h + "/etc/java-21-openjdk/security/java.security",
		h + "/etc/shadow", d.tool, d.rootfs + "/etc/passwd", d.rootfs + "/etc/resolv.conf", d.rootfs + "/README",
	} {
		if err := os.WriteFile(f, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Larger than etcCopyMax: bound, not copied.
	if err := os.Truncate(func() string {
		f := h + "/etc/magic"
		_ = os.WriteFile(f, nil, 0o644)
		return f
	}(), etcCopyMax+1); err != nil {
		t.Fatal(err)
	}
	return hostView{root: h}, d
}

// goldenLaunch builds the launch of c and renders it.
func goldenLaunch(t *testing.T, c goldenCase, host hostView, d goldenDirs) string {
	t.Helper()
	s := &Sandbox{self: filepath.Join(filepath.Dir(filepath.Dir(d.python)), "bin", "quro"), path: DefaultPath, limits: DefaultLimits(),
		drainGrace: time.Second, isolation: cmp.Or(c.isolation, IsolationFull), host: host,
		binds:  []Bind{{Src: d.sock, Dst: "/run/quro/api.sock"}},
		places: []Bind{{Src: d.python, Dst: RunDir + "/python"}, {Src: d.pip, Dst: RunDir + "/pip"}},
		boxes:  &boxRegistry{boxes: map[string]*boxEntry{}, readOnlyNow: func() []string { return []string{d.python, d.pip} }},
		egress: &echoEgress{}}
	s.layers = &layerSet{found: map[string]Feature{}, require: Layers, bwrap: "/usr/bin/bwrap", root: c.root}
	for _, l := range Layers {
		s.layers.found[l] = Feature{Name: l, Available: !slices.Contains(c.missing, l)}
	}
	spec := &Spec{Args: []string{"sh", "-c", "echo hi"}, Dir: d.work, TmpDir: d.tmp, Writable: []string{d.extra},
		ReadOnly: []string{d.python, d.tool}, Binds: []Bind{{Src: d.work, Dst: HomeUser, Writable: true}}}
	if c.root {
		// The session's uid: the directories' owner already, so that
		// handing them over changes nothing (and needs no root).
		spec.UID = os.Getuid()
	}
	if c.spec != nil {
		c.spec(spec, d)
	}
	pl, err := s.prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	// Compiling the policy needs this kernel's Landlock and a seccomp
	// filter for this architecture; the compiled policy is not shown
	// (goldenPolicy is), so a machine without them builds the same command.
	shown := pl.pol
	if landlockABI() == 0 {
		pl.pol.Landlock = false
	}
	if _, ok := auditArch[runtime.GOARCH]; !ok {
		pl.pol.Seccomp = false
	}
	var l *launch
	if c.session {
		conn, ctl, err := ctlPair()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		defer ctl.Close()
		shape := pl.shape(s)
		shape.readOnly = s.boxReadOnly(shape.readOnly)
		// openBox gives every session box a namespace the server made,
		// but under the host's network.
		var ns *Netns
		if pl.network != NetworkHost {
			ns = &Netns{}
		}
		l, err = s.sessionLaunch(pl, shape, ctl, ns)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		statusR, statusW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer statusR.Close()
		p := &Process{}
		pb, err := pl.plumb(p, statusR, statusW)
		if err != nil {
			t.Fatal(err)
		}
		defer pb.closeChildEnds()
		// startOneShot makes one under NetworkInternet only.
		var ns *Netns
		if pl.network == NetworkInternet {
			ns = &Netns{}
		}
		l, err = s.oneShotLaunch(context.Background(), pl, pb, c.cgroups, ns)
		if err != nil {
			t.Fatal(err)
		}
	}
	defer l.abort()
	shown.WaitFD = pl.pol.WaitFD // set by the launcher
	return renderLaunch(t, l) + goldenPolicy(&shown)
}

// bwrapArity is how many operands each bubblewrap option the launcher
// uses takes.
var bwrapArity = map[string]int{
	"--unshare-user": 0, "--unshare-pid": 0, "--unshare-ipc": 0, "--unshare-uts": 0, "--unshare-cgroup-try": 0,
	"--unshare-net": 0, "--die-with-parent": 0, "--as-pid-1": 0, "--new-session": 0,
	"--uid": 1, "--gid": 1, "--hostname": 1, "--cap-drop": 1, "--cap-add": 1, "--perms": 1, "--size": 1,
	"--dir": 1, "--proc": 1, "--dev": 1, "--tmpfs": 1, "--chdir": 1, "--info-fd": 1, "--block-fd": 1, "--userns-block-fd": 1,
	"--ro-bind": 2, "--ro-bind-try": 2, "--bind": 2, "--symlink": 2, "--file": 2, "--ro-bind-data": 2,
}

// renderLaunch shows l's command: one bubblewrap option a line, the init
// child's argv with its encoded rlimits and compiled policy elided.
func renderLaunch(t *testing.T, l *launch) string {
	t.Helper()
	var b strings.Builder
	cmd := l.cmd
	fmt.Fprintf(&b, "path %s\ndir %s\nenv %s\n", cmd.Path, cmd.Dir, strings.Join(cmd.Env, " "))
	sp := cmd.SysProcAttr
	fmt.Fprintf(&b, "setpgid=%v setsid=%v setctty=%v pdeathsig=%v context=%v\n",
		sp.Setpgid, sp.Setsid, sp.Setctty, sp.Pdeathsig == syscall.SIGKILL, cmd.Cancel != nil)
	for i, f := range cmd.ExtraFiles {
		fmt.Fprintf(&b, "fd %d %s\n", 3+i, f.Name())
	}
	args := cmd.Args
	if cmd.Path == l.bwrap {
		b.WriteString("bwrap\n")
		args = args[1:]
		for len(args) > 0 && args[0] != "--" {
			n, ok := bwrapArity[args[0]]
			if !ok || len(args) < 1+n {
				t.Fatalf("bubblewrap option %q: unknown to the test, or short of operands", args[0])
			}
			b.WriteString("  " + strings.Join(args[:1+n], " ") + "\n")
			args = args[1+n:]
		}
		if len(args) == 0 {
			t.Fatal("no -- after bubblewrap's options")
		}
		args = args[1:]
	}
	if len(args) >= 5 && args[1] == boxinit.Arg {
		args = slices.Concat(args[:3], []string{"<rlimits>", "<policy>"}, args[5:])
	}
	b.WriteString("exec " + strings.Join(args, " ") + "\n")
	return b.String()
}

// goldenPolicy shows what the init child is asked to apply.
func goldenPolicy(p *initPolicy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy landlock=%v seccomp=%v network=%s uid=%d wait_fd=%d caps=%s\n",
		p.Landlock, p.Seccomp, p.Network, p.UID, p.WaitFD, strings.Join(p.Caps, ","))
	for _, l := range []struct {
		name  string
		paths []string
	}{{"rw", p.RW}, {"ro", p.RO}, {"ro-files", p.ROFiles}, {"list", p.ListDirs}} {
		fmt.Fprintf(&b, "  %s %s\n", l.name, strings.Join(l.paths, " "))
	}
	return b.String()
}

// goldenNormalise replaces the fixture's paths with placeholders. The
// directories leading to base, which the box makes as mount points, are
// one line: how many there are depends on the machine's TMPDIR.
func goldenNormalise(s, base string) string {
	first := true
	for d := filepath.Dir(base); d != "/"; d = filepath.Dir(d) {
		line := "  --perms 0755\n  --dir " + d + "\n"
		if i := strings.Index(s, line); i >= 0 && first {
			s = s[:i] + "  --perms 0755 --dir (each directory leading to $TMP)\n" + s[i+len(line):]
			first = false
		}
		s = strings.ReplaceAll(s, line, "")
	}
	return strings.NewReplacer(
		filepath.Join(base, "data", "bin", "quro"), "$QURO",
		filepath.Join(base, "host"), "$HOST",
		filepath.Join(base, "data"), "$DATA",
		base, "$TMP",
		"/usr/bin/bwrap", "$BWRAP",
	).Replace(s)
}

// lineDiff lists the lines of want and got that differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}
