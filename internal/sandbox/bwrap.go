package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The namespace layer: bubblewrap builds the box, then runs the init child
// inside it. The box has new user, pid, mount, ipc, uts and cgroup
// namespaces (and a new, empty network namespace under policy "none"), a
// read-only view of /usr and the /lib and /bin directories, only the /etc
// files a program needs, a fresh /proc, a minimal /dev, a size-limited
// private /tmp, and the session's own directories (the workspace first) as
// the only writable host paths, mounted at their host paths so that paths in
// results stay valid for the session's code.

// initPath is where the quro binary is bound inside the box: the init
// child runs from it, and it is on the box's PATH (BinDir) so that code in
// a session can run `quro call`.
const initPath = BinDir + "/quro"

// BinDir is the directory of the quro binary inside a box.
const BinDir = "/run/quro/bin"

// BinNames are further names of the quro binary in BinDir: started as
// apt-get or apt, it asks the server to install packages into the
// session's read-only rootfs (cmd/quro's apt stand-in).
var BinNames = []string{"apt-get", "apt"}

// insideUID is the uid (and gid) user code has inside the box; the user
// namespace maps it to the run's unprivileged host uid.
const insideUID = 1000

// hostLibDirs are bound (or recreated as the same symlinks) from the host.
var hostLibDirs = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// etcFiles is the whole of /etc that user code sees on the host userland:
// dynamic linking, time zone, name service basics, TLS roots, Debian's
// alternatives symlinks and Python's configuration. Never passwords,
// shadow, ssh, sudoers or anything of the server's.
var etcFiles = []string{
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone",
	"/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/etc/protocols", "/etc/services",
	"/etc/mime.types", "/etc/os-release", "/etc/debian_version", "/etc/alternatives",
	"/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/inputrc", "/etc/magic",
	"/etc/bash.bashrc", "/etc/profile", "/etc/environment", "/etc/locale.alias",
}

// AdminCaps are the capabilities a RootfsAdmin box keeps, in its own user
// namespace: owning and moving files of any mapped uid (dpkg unpacks as
// root:root, man:man…; apt hands its downloads to _apt), and switching to
// _apt and back. Not CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_MKNOD or any other.
var AdminCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_SETUID", "CAP_SETGID", "CAP_KILL"}

// rootfsAdminRW are the directories a RootfsAdmin box may write beneath
// (Landlock), besides the usual ones: a Debian system's, never /proc or
// /dev. /bin, /sbin and /lib are symlinks into /usr on a merged-usr tree.
var rootfsAdminRW = []string{"/usr", "/etc", "/var", "/opt", "/srv", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// etcCopyMax is the largest /etc file copied into the box rather than
// bound (see bwrapBox.args).
const etcCopyMax = 1 << 20

// rootfsSkip are top-level entries of a rootfs that the box replaces or
// leaves out.
var rootfsSkip = map[string]bool{"proc": true, "sys": true, "dev": true, "tmp": true, "run": true,
	"boot": true, "media": true, "mnt": true, "home": true, "root": true, "lost+found": true}

// fdList numbers the files passed to a child: file i becomes fd 3+i.
type fdList struct{ files []*os.File }

func (l *fdList) add(f *os.File) string {
	l.files = append(l.files, f)
	return strconv.Itoa(2 + len(l.files))
}

// bwrapBox describes one box.
type bwrapBox struct {
	spec     *Spec
	self     string
	network  string
	writable []string // host paths bound read-write at the same path
	readOnly []string // host paths bound read-only at the same path
	binds    []Bind   // host paths bound elsewhere (read-only unless Writable)
	tmpSize  uint64
	passwd   string
	infoFD   string // --info-fd, "" for none
	blockFD  string // --block-fd, "" for none
	// usernsBlockFD is --userns-block-fd: set when the server (root) writes
	// the box's uid and gid maps itself.
	usernsBlockFD string
	capSetID      bool
	admin         bool // Spec.RootfsAdmin
	asPID1        bool // the command is the box's pid 1 (a session box's init)
}

// args returns bubblewrap's arguments up to and including "--"; the files
// it needs are added to fds, and also returned so the caller can close its
// copies once the child has started.
func (b *bwrapBox) args(fds *fdList) ([]string, []*os.File, error) {
	var opened []*os.File
	fail := func(err error) ([]string, []*os.File, error) {
		for _, f := range opened {
			f.Close()
		}
		return nil, nil, err
	}
	id := strconv.Itoa(insideUID)
	if b.admin {
		id = "0"
	}
	a := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--uid", id, "--gid", id,
		"--hostname", "quro",
		"--die-with-parent",
	}
	if b.asPID1 {
		a = append(a, "--as-pid-1")
	}
	if !b.spec.TTY {
		// No TIOCSTI into a terminal the box was given. A TTY spec keeps
		// its session (the terminal must stay the controlling one); seccomp
		// denies TIOCSTI and TIOCLINUX there.
		a = append(a, "--new-session")
	}
	if b.network != NetworkFull {
		a = append(a, "--unshare-net")
	}
	if b.capSetID || b.admin {
		// bubblewrap run by host root keeps every capability for the box's
		// root, and --cap-add adds to that set: drop them all first, so
		// the lists below are all the box holds.
		a = append(a, "--cap-drop", "ALL")
	}
	if b.capSetID {
		// The init child starts as the box's root only to switch to
		// insideUID itself (see mapIDs): SETUID and SETGID for that, and
		// DAC_READ_SEARCH because bubblewrap and the init child reach the
		// session's 0700 directories (chdir, Landlock's rules) before the
		// switch. The switch to a non-zero uid clears them all.
		a = append(a, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_DAC_READ_SEARCH")
		if b.asPID1 {
			// A session box's init (the box's root) signals the processes
			// it spawned, which run as insideUID.
			a = append(a, "--cap-add", "CAP_KILL")
		}
	}
	if b.admin {
		// The program itself is the box's root: these, in the box's user
		// namespace only, are what apt and dpkg use.
		for _, c := range AdminCaps {
			a = append(a, "--cap-add", c)
		}
	}
	if b.spec.Rootfs == "" {
		a = append(a, "--perms", "0755", "--dir", "/etc", "--ro-bind", "/usr", "/usr")
		for _, d := range hostLibDirs {
			fi, err := os.Lstat(d)
			switch {
			case err != nil:
			case fi.Mode()&os.ModeSymlink != 0:
				target, err := os.Readlink(d)
				if err != nil {
					return fail(err)
				}
				a = append(a, "--symlink", target, d)
			case fi.IsDir():
				a = append(a, "--ro-bind", d, d)
			}
		}
		for _, f := range etcFiles {
			fi, err := os.Stat(f)
			if err != nil {
				continue
			}
			if fi.Mode().IsRegular() && fi.Size() <= etcCopyMax {
				// A small file is copied into the box's own /etc (root's,
				// 0444, beneath Landlock's read-only /etc): one write
				// instead of a bind mount and its read-only remount, each
				// of which re-reads the mount table (~0.3 ms a file).
				if fh, err := os.Open(f); err == nil {
					opened = append(opened, fh)
					a = append(a, "--perms", "0444", "--file", fds.add(fh), f)
					continue
				}
			}
			a = append(a, "--ro-bind", f, f)
		}
		// The directories leading to them are traversable mount points
		// (bubblewrap would make them 0700, root's).
		etcMade := map[string]bool{"/": true, "/etc": true}
		for _, f := range pythonEtc() {
			var anc []string
			for d := filepath.Dir(f); !etcMade[d]; d = filepath.Dir(d) {
				anc = append(anc, d)
				etcMade[d] = true
			}
			for i := len(anc) - 1; i >= 0; i-- {
				a = append(a, "--perms", "0755", "--dir", anc[i])
			}
			a = append(a, "--ro-bind", f, f)
		}
	} else {
		entries, err := os.ReadDir(b.spec.Rootfs)
		if err != nil {
			return fail(fmt.Errorf("rootfs: %w", err))
		}
		for _, e := range entries {
			name := e.Name()
			if rootfsSkip[name] {
				continue
			}
			src := filepath.Join(b.spec.Rootfs, name)
			if e.Type()&os.ModeSymlink != 0 {
				target, err := os.Readlink(src)
				if err != nil {
					return fail(err)
				}
				a = append(a, "--symlink", target, "/"+name)
				continue
			}
			if !e.IsDir() {
				continue
			}
			if b.admin {
				a = append(a, "--bind", src, "/"+name)
			} else {
				a = append(a, "--ro-bind", src, "/"+name)
			}
		}
	}
	if b.network == NetworkFull {
		for _, f := range []string{"/etc/resolv.conf", "/etc/hosts"} {
			if _, err := os.Stat(f); err == nil && (b.spec.Rootfs == "" || exists(filepath.Join(b.spec.Rootfs, f))) {
				a = append(a, "--ro-bind", f, f)
			}
		}
	}
	if b.passwd != "" {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		// A few hundred bytes: the pipe buffer holds them, nothing blocks.
		_, err = w.WriteString(b.passwd)
		w.Close()
		opened = append(opened, r)
		if err != nil {
			return fail(err)
		}
		if b.spec.Rootfs == "" || exists(filepath.Join(b.spec.Rootfs, "etc/passwd")) {
			a = append(a, "--perms", "0644", "--ro-bind-data", fds.add(r), "/etc/passwd")
		}
	}
	size := strconv.FormatUint(b.tmpSize, 10)
	a = append(a, "--proc", "/proc", "--dev", "/dev",
		"--perms", "01777", "--size", size, "--tmpfs", "/tmp",
		"--perms", "01777", "--size", size, "--tmpfs", "/dev/shm")
	if b.admin {
		// The box's root is host uid 0, which the kernel lets write the
		// sysctls of mode 0644 whatever the namespace (bubblewrap covers
		// /proc/sys only when it finds it writable while it builds the box,
		// which it does not as root of a new namespace). Landlock refuses
		// it too.
		a = append(a, "--ro-bind", "/proc/sys", "/proc/sys")
	}
	// Made explicitly so that they are traversable by the run's uid (the
	// parents bubblewrap makes for a bind are not).
	a = append(a, "--perms", "0755", "--dir", filepath.Dir(BinDir), "--perms", "0755", "--dir", BinDir)
	a = append(a, "--ro-bind", b.self, initPath)
	if !b.admin {
		for _, n := range BinNames {
			a = append(a, "--ro-bind", b.self, BinDir+"/"+n)
		}
	}
	for _, bd := range b.binds {
		if bd.Writable {
			continue // after the session's own directories, below
		}
		// -try: a missing source (a server socket not there yet) leaves
		// the box without it rather than refusing the run.
		a = append(a, "--ro-bind-try", bd.Src, bd.Dst)
	}
	// The directories leading to the session's paths exist in the box only
	// as mount points: traversable, empty, read-only to user code.
	made := map[string]bool{"/": true, "/tmp": true, "/dev": true, "/dev/shm": true, "/proc": true}
	for _, w := range b.writable {
		var anc []string
		for d := filepath.Dir(w); !made[d]; d = filepath.Dir(d) {
			anc = append(anc, d)
			made[d] = true
		}
		for i := len(anc) - 1; i >= 0; i-- {
			a = append(a, "--perms", "0755", "--dir", anc[i])
		}
		a = append(a, "--bind", w, w)
	}
	for _, r := range b.readOnly {
		var anc []string
		for d := filepath.Dir(r); !made[d]; d = filepath.Dir(d) {
			anc = append(anc, d)
			made[d] = true
		}
		for i := len(anc) - 1; i >= 0; i-- {
			a = append(a, "--perms", "0755", "--dir", anc[i])
		}
		a = append(a, "--ro-bind", r, r)
	}
	for _, bd := range b.binds {
		if !bd.Writable {
			continue
		}
		// Another name for a writable directory (checked by prepare):
		// the workspace at /home/user.
		var anc []string
		for d := filepath.Dir(bd.Dst); !made[d]; d = filepath.Dir(d) {
			anc = append(anc, d)
			made[d] = true
		}
		for i := len(anc) - 1; i >= 0; i-- {
			a = append(a, "--perms", "0755", "--dir", anc[i])
		}
		a = append(a, "--bind", bd.Src, bd.Dst)
	}
	a = append(a, "--chdir", b.spec.Dir)
	if b.infoFD != "" {
		a = append(a, "--info-fd", b.infoFD)
	}
	if b.blockFD != "" {
		a = append(a, "--block-fd", b.blockFD)
	}
	if b.usernsBlockFD != "" {
		a = append(a, "--userns-block-fd", b.usernsBlockFD)
	}
	return append(a, "--"), opened, nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// pythonEtc lists what of /etc the host's language runtimes cannot start
// without: /etc/python3* (Debian keeps sitecustomize there), and for
// run_code's toolchains (see internal/engine/toolchain) only the files
// their runtimes read: the JDK's security/ directory, jvm-*.cfg and
// top-level .properties (its conf/ and lib/jvm.cfg are symlinks into
// /etc/java-*; not management/, where a JMX password file lives), PHP's
// cli/ and mods-available/ (conf.d links there), R's Renviron, ldpaths,
// repositories and Rprofile.site (not Renviron.site, where sites keep
// tokens), and Mono's config and 4.5/machine.config. What an
// administrator adds elsewhere under those directories is not shown.
func pythonEtc() []string {
	var out []string
	for _, g := range []string{
		"/etc/python3*",
		"/etc/java-*/security", "/etc/java-*/jvm-*.cfg", "/etc/java-*/*.properties",
		"/etc/php/*/cli", "/etc/php/*/mods-available",
		"/etc/R/Renviron", "/etc/R/ldpaths", "/etc/R/repositories", "/etc/R/Rprofile.site",
		"/etc/mono/config", "/etc/mono/4.5/machine.config",
	} {
		m, _ := filepath.Glob(g)
		out = append(out, m...)
	}
	return out
}

// UserName is the account of user code in a box ("user", as in E2B's
// sandboxes, whose SDKs and tests expect it).
const UserName = "user"

// passwdFor is the /etc/passwd the box sees: root, the user code's own
// account and nobody, nothing of the host's accounts.
func passwdFor(home string) string {
	return "root:x:0:0:root:/root:/bin/sh\n" +
		UserName + ":x:" + strconv.Itoa(insideUID) + ":" + strconv.Itoa(insideUID) + ":quro sandbox:" + home + ":/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

// lookBwrap finds bubblewrap.
func lookBwrap() (string, error) {
	for _, p := range []string{"/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("bwrap not installed (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)")
}
