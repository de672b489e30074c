package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The namespace layer: bubblewrap builds the box, then runs the init child
// inside it. The box has new user, pid, mount, ipc, uts and cgroup
// namespaces (and a new, empty network namespace under policy "none"), a
// read-only view of /usr and the /lib and /bin directories, only the /etc
// files a program needs, a fresh /proc, a minimal /dev, a size-limited
// private /tmp, and the session's own directories (the workspace first) as
// the only writable host paths: the workspace at HomeUser and the session's
// tmp at BoxTmp, never at their host paths (view.go), others at their host
// paths.

// initPath is where the quro binary is bound inside the box: the init
// child runs from it, and it is on the box's PATH (BinDir) so that code in
// a session can run `quro call`.
const initPath = BinDir + "/quro"

// BinDir is the directory of the quro binary inside a box.
const BinDir = RunDir + "/bin"

// BinNames are further names of the quro binary in BinDir: started as
// apt-get or apt, it asks the server to install packages into the
// session's read-only rootfs (cmd/quro's apt stand-in).
var BinNames = []string{"apt-get", "apt"}

// SudoName is one more name of the quro binary in BinDir, a link to it
// (no mount): started as sudo, it says that a box has no root and what to
// use instead, and hands `sudo apt-get install` to the apt stand-in
// (cmd/quro's sudo stand-in; docs/security.md, "No root in a box").
const SudoName = "sudo"

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
	"/etc/bash.bashrc", profilePath, "/etc/environment", "/etc/locale.alias",
}

// profilePath is the login shells' profile: the box shows the userland's
// own with loginPathKept around it (see profileFile).
const profilePath = "/etc/profile"

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
	places   []Bind   // Options.Places: where read-only paths beneath a Src are shown
	views    []Bind   // writable directories shown only elsewhere (view.go; setViews)
	tmp      string   // the run's Spec.TmpDir, bound read-write at BoxTmp, or ""
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
	ownNetns      bool // born in a network namespace the server made (see Netns)
	host          hostView
}

// hostView is where a box's host userland is read from: the host's root,
// or in tests a directory standing in for it. Paths are the box's; root
// is prepended to read them and never shows in bubblewrap's arguments.
type hostView struct{ root string }

func (h hostView) lstat(p string) (os.FileInfo, error) { return os.Lstat(h.root + p) }
func (h hostView) stat(p string) (os.FileInfo, error)  { return os.Stat(h.root + p) }
func (h hostView) readlink(p string) (string, error)   { return os.Readlink(h.root + p) }
func (h hostView) open(p string) (*os.File, error)     { return os.Open(h.root + p) }

// setViews derives the box's views from its writable directories, binds
// and tmp, and its account's home (the run's HOME) from them.
func (b *bwrapBox) setViews() {
	b.views = viewsOf(b.writable, b.binds, b.tmp)
	b.passwd = passwdFor(inView(b.views, b.spec.homeDir()))
}

// args returns bubblewrap's arguments up to and including "--"; the files
// it needs are added to fds, and also returned so the caller can close its
// copies once the child has started. The order is bubblewrap's order of
// work: namespaces and capabilities, the userland, /etc's extras, the
// kernel's filesystems, quro itself, the session's paths, then the fds
// through which the server holds the box.
func (b *bwrapBox) args(fds *fdList) ([]string, []*os.File, error) {
	w := &bwrapArgs{fds: fds}
	b.namespaces(w)
	b.capabilities(w)
	var err error
	if b.spec.Rootfs == "" {
		err = b.hostUserland(w)
	} else {
		err = b.rootfsUserland(w)
	}
	if err == nil {
		err = b.networkFiles(w)
	}
	if err == nil {
		err = b.passwdFile(w)
	}
	if err == nil {
		err = b.profileFile(w)
	}
	if err != nil {
		for _, f := range w.opened {
			f.Close()
		}
		return nil, nil, err
	}
	b.kernelFS(w)
	b.quroBinary(w)
	b.sessionPaths(w)
	b.control(w)
	return append(w.a, "--"), w.opened, nil
}

// bwrapArgs collects bubblewrap's arguments and the files they pass.
type bwrapArgs struct {
	a      []string
	fds    *fdList
	opened []*os.File // the server's copies of the files passed
}

func (w *bwrapArgs) add(args ...string) { w.a = append(w.a, args...) }

// file passes f to bubblewrap and returns its descriptor's number.
func (w *bwrapArgs) file(f *os.File) string {
	w.opened = append(w.opened, f)
	return w.fds.add(f)
}

// parents makes the directories leading to p that made does not hold yet,
// outermost first, as traversable mount points (bubblewrap would make them
// 0700, root's), and records them in made.
func (w *bwrapArgs) parents(made map[string]bool, p string) {
	var anc []string
	for d := filepath.Dir(p); !made[d]; d = filepath.Dir(d) {
		anc = append(anc, d)
		made[d] = true
	}
	for i := len(anc) - 1; i >= 0; i-- {
		w.add("--perms", "0755", "--dir", anc[i])
	}
}

// namespaces: the new namespaces, who the box's first process is in
// them, and its session.
func (b *bwrapBox) namespaces(w *bwrapArgs) {
	id := strconv.Itoa(insideUID)
	if b.admin {
		id = "0"
	}
	w.add("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--uid", id, "--gid", id,
		"--hostname", "quro",
		"--die-with-parent")
	if b.asPID1 {
		w.add("--as-pid-1")
	}
	if !b.spec.TTY {
		// No TIOCSTI into a terminal the box was given. A TTY spec keeps
		// its session (the terminal must stay the controlling one); seccomp
		// denies TIOCSTI and TIOCLINUX there.
		w.add("--new-session")
	}
	if b.network != NetworkHost && !b.ownNetns {
		// The server made none: bubblewrap makes one, loopback only.
		w.add("--unshare-net")
	}
}

// capabilities: what the box's first process holds in its user namespace.
func (b *bwrapBox) capabilities(w *bwrapArgs) {
	if b.capSetID || b.admin {
		// bubblewrap run by host root keeps every capability for the box's
		// root, and --cap-add adds to that set: drop them all first, so
		// the lists below are all the box holds.
		w.add("--cap-drop", "ALL")
	}
	if b.capSetID {
		// The init child starts as the box's root only to switch to
		// insideUID itself (see mapIDs): SETUID and SETGID for that, and
		// DAC_READ_SEARCH because bubblewrap and the init child reach the
		// session's 0700 directories (chdir, Landlock's rules) before the
		// switch. The switch to a non-zero uid clears them all.
		w.add("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_DAC_READ_SEARCH")
		if b.asPID1 {
			// A session box's init (the box's root) signals the processes
			// it spawned, which run as insideUID.
			w.add("--cap-add", "CAP_KILL")
		}
	}
	if b.admin {
		// The program itself is the box's root: these, in the box's user
		// namespace only, are what apt and dpkg use.
		for _, c := range AdminCaps {
			w.add("--cap-add", c)
		}
	}
}

// hostUserland shows the host's /usr, its /lib and /bin directories (or
// the same symlinks), and of its /etc only etcFiles and runtimeEtc.
func (b *bwrapBox) hostUserland(w *bwrapArgs) error {
	h := b.host
	w.add("--perms", "0755", "--dir", "/etc", "--ro-bind", "/usr", "/usr")
	for _, d := range hostLibDirs {
		fi, err := h.lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := h.readlink(d)
			if err != nil {
				return err
			}
			w.add("--symlink", target, d)
		case fi.IsDir():
			w.add("--ro-bind", d, d)
		}
	}
	for _, f := range etcFiles {
		if f == profilePath {
			continue // profileFile
		}
		fi, err := h.stat(f)
		if err != nil {
			continue
		}
		if fi.Mode().IsRegular() && fi.Size() <= etcCopyMax {
			// A small file is copied into the box's own /etc (root's,
			// 0444, beneath Landlock's read-only /etc): one write
			// instead of a bind mount and its read-only remount, each
			// of which re-reads the mount table (~0.3 ms a file).
			if fh, err := h.open(f); err == nil {
				w.add("--perms", "0444", "--file", w.file(fh), f)
				continue
			}
		}
		w.add("--ro-bind", f, f)
	}
	etcMade := map[string]bool{"/": true, "/etc": true}
	for _, f := range h.runtimeEtc() {
		w.parents(etcMade, f)
		w.add("--ro-bind", f, f)
	}
	return nil
}

// rootfsUserland shows the rootfs's top-level directories and symlinks
// but rootfsSkip: read-only, or read-write for a RootfsAdmin box.
func (b *bwrapBox) rootfsUserland(w *bwrapArgs) error {
	entries, err := os.ReadDir(b.spec.Rootfs)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if rootfsSkip[name] {
			continue
		}
		src := filepath.Join(b.spec.Rootfs, name)
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			w.add("--symlink", target, "/"+name)
		case !e.IsDir():
		case b.admin:
			w.add("--bind", src, "/"+name)
		default:
			w.add("--ro-bind", src, "/"+name)
		}
	}
	return nil
}

// inUserland reports whether /etc file f is there to be covered: always
// on the host userland (which binds what it needs), in a rootfs only when
// the rootfs has it.
func (b *bwrapBox) inUserland(f string) bool {
	return b.spec.Rootfs == "" || exists(filepath.Join(b.spec.Rootfs, f))
}

// networkFiles: a box with the host's network resolves names as the host
// does.
func (b *bwrapBox) networkFiles(w *bwrapArgs) error {
	if b.ownNetns && b.inUserland("/etc/resolv.conf") {
		// The box's DNS is the server's, on its own loopback (see Netns):
		// under NetworkNone nothing answers there (until SetNetwork opens
		// the way), and a lookup fails at once.
		return w.data("/etc/resolv.conf", "nameserver 127.0.0.1\noptions edns0\n")
	}
	if b.network != NetworkHost {
		return nil
	}
	for _, f := range []string{"/etc/resolv.conf", "/etc/hosts"} {
		if _, err := b.host.stat(f); err == nil && b.inUserland(f) {
			w.add("--ro-bind", f, f)
		}
	}
	return nil
}

// passwdFile shows b.passwd as /etc/passwd.
func (b *bwrapBox) passwdFile(w *bwrapArgs) error {
	if b.passwd == "" || !b.inUserland("/etc/passwd") {
		return nil
	}
	return w.data("/etc/passwd", b.passwd)
}

// profileFile shows the userland's /etc/profile with the run's PATH kept
// across it: a login shell (E2B's commands run `bash -l -c`, its PTY
// `bash -i -l`) would otherwise take Debian's fixed PATH from it and lose
// what the run was given first (quro's stand-ins in BinDir, the session's
// python3, python, pip and pip3: Options.RunEnv), so `python3` there
// would be the userland's and `python` none. What the profile adds
// (its profile.d scripts) comes after. A RootfsAdmin box sees the
// rootfs's own file, which dpkg may replace.
func (b *bwrapBox) profileFile(w *bwrapArgs) error {
	if b.admin {
		return nil
	}
	var orig []byte
	var err error
	if b.spec.Rootfs == "" {
		orig, err = readSmall(func() (*os.File, error) { return b.host.open(profilePath) })
	} else {
		orig, err = readSmall(func() (*os.File, error) { return openInRoot(b.spec.Rootfs, profilePath) })
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil // none: a login shell keeps the PATH as it is
	case errors.Is(err, errNotSmallFile):
		// Not what a box's /etc carries as data: shown as it is (a
		// rootfs's /etc shows it already).
		if b.spec.Rootfs == "" {
			w.add("--ro-bind", profilePath, profilePath)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", profilePath, err)
	}
	return w.data(profilePath, loginPathKept(string(orig)))
}

// loginPathKept is profile (a shell script) with the PATH it was entered
// with put back in front at its end, in POSIX sh (dash reads it too),
// followed by the directories the profile added.
//
// Its "$(id -u)" (Debian's profile asks it to choose root's PATH) is bash's
// $EUID when there is one: the same number without a fork and exec of id
// in every login shell (E2B's commands.run is one: `bash -l -c CMD`); dash,
// which has no EUID, still runs id.
func loginPathKept(profile string) string {
	profile = strings.ReplaceAll(profile, `"$(id -u)"`, `"${EUID:-$(id -u)}"`)
	return "# quro: the PATH this login shell was started with stays first (quro's\n" +
		"# stand-ins, the session's python3 and pip); what follows is the userland's\n" +
		"# " + profilePath + ", whose directories come after.\n" +
		"__quro_path=${PATH-}\n" +
		profile + "\n" +
		"# quro: back to the PATH the shell was started with, then what the profile added.\n" +
		"if [ -n \"${__quro_path}\" ]; then\n" +
		"\t__quro_rest=${PATH-}\n" +
		"\tPATH=$__quro_path\n" +
		"\t__quro_ifs=$IFS\n" +
		"\tIFS=:\n" +
		"\tfor __quro_d in $__quro_rest; do\n" +
		"\t\tcase \":$PATH:\" in *\":$__quro_d:\"*) ;; *) PATH=$PATH:$__quro_d ;; esac\n" +
		"\tdone\n" +
		"\tIFS=$__quro_ifs\n" +
		"\texport PATH\n" +
		"fi\n" +
		"unset __quro_path __quro_rest __quro_ifs __quro_d\n"
}

// errNotSmallFile: not a regular file of at most etcCopyMax bytes.
var errNotSmallFile = errors.New("not a regular file of at most 1 MiB")

// readSmall reads the file open returns when it is a regular file of at
// most etcCopyMax bytes.
func readSmall(open func() (*os.File, error)) ([]byte, error) {
	f, err := open()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > etcCopyMax {
		return nil, errNotSmallFile
	}
	b, err := io.ReadAll(io.LimitReader(f, etcCopyMax+1))
	if err == nil && len(b) > etcCopyMax {
		err = errNotSmallFile
	}
	return b, err
}

// openInRoot opens p of the tree at root as a process chrooted there
// would (links resolved inside it, never a magic link): a rootfs's file
// read by the server never names a host file.
func openInRoot(root, p string) (*os.File, error) {
	d, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, strings.TrimPrefix(p, "/"), &unix.OpenHow{
		Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// data shows content as the read-only file p (0644).
func (w *bwrapArgs) data(p, content string) error {
	r, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	// A few hundred bytes: the pipe buffer holds them, nothing blocks.
	_, err = pw.WriteString(content)
	pw.Close()
	if err != nil {
		r.Close()
		return err
	}
	w.add("--perms", "0644", "--ro-bind-data", w.file(r), p)
	return nil
}

// kernelFS: a fresh /proc, a minimal /dev, a size-limited private /tmp
// and /dev/shm.
func (b *bwrapBox) kernelFS(w *bwrapArgs) {
	size := strconv.FormatUint(b.tmpSize, 10)
	w.add("--proc", "/proc", "--dev", "/dev",
		"--perms", "01777", "--size", size, "--tmpfs", "/tmp",
		"--perms", "01777", "--size", size, "--tmpfs", "/dev/shm")
	if b.admin {
		// The box's root is host uid 0, which the kernel lets write the
		// sysctls of mode 0644 whatever the namespace (bubblewrap covers
		// /proc/sys only when it finds it writable while it builds the box,
		// which it does not as root of a new namespace). Landlock refuses
		// it too.
		w.add("--ro-bind", "/proc/sys", "/proc/sys")
	}
}

// quroBinary binds quro at initPath and, but in a RootfsAdmin box, at its
// stand-in names.
func (b *bwrapBox) quroBinary(w *bwrapArgs) {
	// Made explicitly so that they are traversable by the run's uid (the
	// parents bubblewrap makes for a bind are not).
	w.add("--perms", "0755", "--dir", filepath.Dir(BinDir), "--perms", "0755", "--dir", BinDir)
	w.add("--ro-bind", b.self, initPath)
	if !b.admin {
		for _, n := range BinNames {
			w.add("--ro-bind", b.self, BinDir+"/"+n)
		}
		w.add("--symlink", filepath.Base(initPath), BinDir+"/"+SudoName)
	}
}

// sessionPaths binds the host paths of the run: the read-only binds, the
// session's writable directories, its read-only paths, then the writable
// binds (other names for the writable directories).
func (b *bwrapBox) sessionPaths(w *bwrapArgs) {
	for _, bd := range b.binds {
		if !bd.Writable {
			// -try: a missing source (a server socket not there yet)
			// leaves the box without it rather than refusing the run.
			w.add("--ro-bind-try", bd.Src, bd.Dst)
		}
	}
	// The directories leading to the session's paths exist in the box only
	// as mount points: traversable, empty, read-only to user code.
	made := map[string]bool{"/": true, "/tmp": true, "/dev": true, "/dev/shm": true, "/proc": true, RunDir: true, BinDir: true}
	for _, d := range b.writable {
		if hidden(b.views, d) {
			continue // shown at a view's Dst only, below
		}
		w.parents(made, d)
		w.add("--bind", d, d)
	}
	for _, r := range b.readOnly {
		// At its place (Options.Places) instead of its host path.
		at, _ := placed(b.places, r)
		w.parents(made, at)
		w.add("--ro-bind", r, at)
	}
	for _, bd := range b.binds {
		if bd.Writable {
			// Another name for a writable directory (checked by prepare):
			// the workspace at /home/user.
			w.parents(made, bd.Dst)
			w.add("--bind", bd.Src, bd.Dst)
		}
	}
	if b.tmp != "" {
		// The run's temporary directory where TMPDIR names it (BoxTmp),
		// and only there.
		w.add("--bind", b.tmp, BoxTmp)
	}
}

// control: the working directory and the descriptors through which the
// server learns the box's pid and holds it until the go-ahead.
func (b *bwrapBox) control(w *bwrapArgs) {
	if b.spec.StartsInHome {
		w.add("--chdir", HomeUser) // the box shows the workspace there (prepare)
	} else {
		w.add("--chdir", inView(b.views, b.spec.Dir))
	}
	if b.infoFD != "" {
		w.add("--info-fd", b.infoFD)
	}
	if b.blockFD != "" {
		w.add("--block-fd", b.blockFD)
	}
	if b.usernsBlockFD != "" {
		w.add("--userns-block-fd", b.usernsBlockFD)
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// runtimeEtc lists what of /etc the host's language runtimes cannot start
// without: /etc/python3* (Debian keeps sitecustomize there), and for
// run_code's toolchains (see internal/engine/toolchain) only the files
// their runtimes read: the JDK's security/ directory, jvm-*.cfg and
// top-level .properties (its conf/ and lib/jvm.cfg are symlinks into
// /etc/java-*; not management/, where a JMX password file lives), PHP's
// cli/ and mods-available/ (conf.d links there), R's Renviron, ldpaths,
// repositories and Rprofile.site (not Renviron.site, where sites keep
// tokens), and Mono's config and 4.5/machine.config. What an
// administrator adds elsewhere under those directories is not shown.
func (h hostView) runtimeEtc() []string {
	var out []string
	for _, g := range []string{
		"/etc/python3*",
		"/etc/java-*/security", "/etc/java-*/jvm-*.cfg", "/etc/java-*/*.properties",
		"/etc/php/*/cli", "/etc/php/*/mods-available",
		"/etc/R/Renviron", "/etc/R/ldpaths", "/etc/R/repositories", "/etc/R/Rprofile.site",
		"/etc/mono/config", "/etc/mono/4.5/machine.config",
	} {
		m, _ := filepath.Glob(h.root + g)
		for _, f := range m {
			out = append(out, strings.TrimPrefix(f, h.root))
		}
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
