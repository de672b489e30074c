package python

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// The prepared interpreter (the extracted tree with its precompiled
// standard library, pip's directory and the worker module's) depends only
// on what the binary embeds: every directory of it is named by a hash of
// that content. A server therefore keeps it in one install root shared by
// all its data directories, the machine's cache (SharedRoot), so that a
// fresh data directory's first run finds it prepared instead of spending
// seconds of CPU extracting it. What a box runs comes from there: the
// cache is trusted only as far as its ownership and permissions say that
// nobody but the server's own user (root) could have written it
// (checkSecureDir for the root and its ancestors, trustedTree for each
// directory before it is used); a tree that fails is extracted again.

// CacheEnv names the install root a server uses instead of the default
// cache directory; CacheOff ("off") keeps the interpreter in the data
// directory, as before the cache.
const (
	CacheEnv = "QURO_PYTHON_CACHE"
	CacheOff = "off"
)

// DefaultCacheRoot is the shared install root: $QURO_PYTHON_CACHE, else,
// for a server run as root, root's cache directory's quro/
// ($XDG_CACHE_HOME or ~/.cache). Empty when there is none (no HOME: a
// service without one) and for a server that is not root: its sessions
// may run as its own uid (minimal isolation), to which the owner checks
// could not tell a file they wrote from the server's, so its interpreter
// stays in the data directory unless the operator names a cache.
func DefaultCacheRoot() string {
	if d := os.Getenv(CacheEnv); d != "" {
		return d
	}
	if os.Geteuid() != 0 {
		return ""
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "quro")
}

// SharedRoot makes dir the install root of the embedded interpreter
// (EmbeddedOptions.InstallRoot), creating it and its python/worker
// subdirectories, and checks that only the server's user can write it:
// dir, dir/python and dir/python/worker are this user's and writable by
// nobody else; each ancestor of dir is root's or this user's, writable by
// others only when sticky and the server is root (as /tmp, where nobody
// else can rename what is root's). It returns dir made absolute, or an
// error saying why it cannot be used; the caller then keeps the
// interpreter in the data directory (and logs why). dir "" or CacheOff is
// no cache.
func SharedRoot(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("no cache directory (neither $" + CacheEnv + " nor, for a server run as root, a home directory)")
	}
	if dir == CacheOff {
		return "", errors.New("$" + CacheEnv + " is " + CacheOff)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(abs, "python", "worker"), 0o755); err != nil {
		return "", fmt.Errorf("the Python cache %s: %w", abs, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	if err := checkSecureDir(real, filepath.Join(real, "python", "worker")); err != nil {
		return "", fmt.Errorf("the Python cache %s: %w", abs, err)
	}
	return real, nil
}

// checkSecureDir checks leaf and each of its ancestors (see SharedRoot):
// from own down, each must be this user's and writable by nobody else;
// above own, root's or this user's, and writable by others only when
// sticky and the server is root.
func checkSecureDir(own, leaf string) error {
	euid, egid := uint32(os.Geteuid()), uint32(os.Getegid())
	for p := leaf; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", p)
		}
		inside := len(p) >= len(own)
		mode := fi.Mode()
		switch {
		case st.Uid != euid && (inside || st.Uid != 0):
			return fmt.Errorf("%s belongs to uid %d, not to this server's (%d)", p, st.Uid, euid)
		case inside && othersWrite(mode, st.Gid, egid):
			return fmt.Errorf("%s is writable by others (%v)", p, mode.Perm())
		case !inside && othersWrite(mode, st.Gid, egid) && mode&fs.ModeSticky == 0:
			return fmt.Errorf("%s is writable by others (%v) and not sticky", p, mode.Perm())
		case !inside && othersWrite(mode, st.Gid, egid) && euid != 0:
			// A sticky /tmp is writable by the sessions of a server that
			// is not root when they run as its uid (minimal isolation).
			return fmt.Errorf("%s is writable by others (%v): a server that is not root keeps its cache out of shared directories", p, mode.Perm())
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// othersWrite: writable by others than the owner (the world, or a group
// other than the server's own).
func othersWrite(mode fs.FileMode, gid, egid uint32) bool {
	return mode&0o002 != 0 || (mode&0o020 != 0 && gid != egid)
}

// trustedTree checks that everything under dir (dir included) belongs to
// the server's user and is writable by nobody else (symlinks: owned only;
// their targets are checked where they are), so that no box, tenant or
// other user can have changed or added a file a session will run. A walk
// of the tree: 13.5 ms for the interpreter's at a load of 57
// (BenchmarkStartChecks).
func trustedTree(dir string) error {
	euid, egid := uint32(os.Geteuid()), uint32(os.Getegid())
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			var fi fs.FileInfo
			if fi, err = d.Info(); err == nil {
				return trustedEntry(p, fi, euid, egid)
			}
		}
		// An entry gone between the listing and its lstat is not used:
		// compilePip's temporary .pyc files come and go while another
		// server (sharing the install root) compiles pip.
		if p != dir && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	})
}

// trustedEntry is trustedTree's check of one entry.
func trustedEntry(p string, fi fs.FileInfo, euid, egid uint32) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", p)
	}
	if st.Uid != euid {
		return fmt.Errorf("%s belongs to uid %d", p, st.Uid)
	}
	if fi.Mode().Type() != fs.ModeSymlink && othersWrite(fi.Mode(), st.Gid, egid) {
		return fmt.Errorf("%s is writable by others (%v)", p, fi.Mode().Perm())
	}
	return nil
}
