package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// BinDirs are where a program is searched for in a rootfs: the PATH of a
// box, relative to the rootfs's top.
var BinDirs = []string{"usr/local/bin", "usr/bin", "bin"}

// ErrNoEngineRootfs is the error of an engine asked to run a session on a
// rootfs when it was built without a way to reach rootfs directories.
func ErrNoEngineRootfs(name string) error {
	return fmt.Errorf("the session runs on rootfs %q, which this engine cannot use", name)
}

// Stat stats file (absolute, as the box sees it) in the rootfs at dir,
// resolving symbolic links as the box does: inside the rootfs (openat2's
// RESOLVE_IN_ROOT, an absolute target such as Debian's /etc/alternatives
// links is taken from the rootfs's top, ".." stops there), with no magic
// links. The rootfs's content is not the server's (install_packages runs
// its packages' scripts): a link in it never leads the server to a host
// path. On a kernel without openat2 (before 5.6) it looks through os.Root,
// which refuses a link that leaves the rootfs (and so an absolute one).
func Stat(dir, file string) (fs.FileInfo, error) {
	rel := strings.TrimPrefix(path.Clean("/"+file), "/")
	if rel == "" {
		rel = "."
	}
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, rel, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOSYS) {
		root, err := os.OpenRoot(dir)
		if err != nil {
			return nil, err
		}
		defer root.Close()
		return root.Stat(rel)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "stat", Path: "/" + rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), "/"+rel)
	defer f.Close()
	return f.Stat()
}

// Executable reports whether file (absolute, as the box sees it) is an
// executable regular file of the rootfs at dir (see Stat).
func Executable(dir, file string) bool {
	fi, err := Stat(dir, file)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// LookPath returns the path, as the box sees it, of the first of names
// that the rootfs at dir has as an executable regular file: an absolute
// name is looked at as is, another in each of BinDirs in turn.
func LookPath(dir string, names ...string) (string, bool) {
	for _, n := range names {
		if path.IsAbs(n) {
			if Executable(dir, n) {
				return path.Clean(n), true
			}
			continue
		}
		if n == "" || strings.Contains(n, "/") {
			continue
		}
		for _, d := range BinDirs {
			if p := "/" + d + "/" + n; Executable(dir, p) {
				return p, true
			}
		}
	}
	return "", false
}
