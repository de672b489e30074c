package python

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
// else can rename what is root's). What exists is checked before
// anything is made: a root server run with another user's HOME makes
// nothing of its own there. It returns dir made absolute, or an error
// saying why it cannot be used; the caller then keeps the interpreter in
// the data directory (and logs why). dir "" or CacheOff is no cache.
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
	fail := func(err error) (string, error) { return "", fmt.Errorf("the Python cache %s: %w", abs, err) }
	// The deepest of dir/python/worker and its ancestors that exists, and
	// dir as it will be once made, both with their links resolved.
	have := filepath.Join(abs, "python", "worker")
	for {
		_, err := os.Lstat(have)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || have == filepath.Dir(have) {
			return fail(err)
		}
		have = filepath.Dir(have)
	}
	realHave, err := filepath.EvalSymlinks(have)
	if err != nil {
		return fail(err)
	}
	real := filepath.Join(realHave, strings.TrimPrefix(abs, have))
	if len(have) > len(abs) {
		if real, err = filepath.EvalSymlinks(abs); err != nil {
			return fail(err)
		}
	}
	if err := checkSecureDir(real, realHave); err != nil {
		return fail(err)
	}
	leaf := filepath.Join(real, "python", "worker")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return fail(err)
	}
	if err := checkSecureDir(real, leaf); err != nil {
		return fail(err)
	}
	return real, nil
}

// checkSecureDir checks leaf and each of its ancestors (see SharedRoot):
// from own down, each must be this user's and writable by nobody else;
// above own, root's or this user's, and writable by others only when
// sticky and the server is root.
func checkSecureDir(own, leaf string) error {
	euid := uint32(os.Geteuid())
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
		case inside && othersWrite(mode, st.Gid):
			return fmt.Errorf("%s is writable by others (%v)", p, mode.Perm())
		case !inside && othersWrite(mode, st.Gid) && mode&fs.ModeSticky == 0:
			return fmt.Errorf("%s is writable by others (%v) and not sticky", p, mode.Perm())
		case !inside && othersWrite(mode, st.Gid) && euid != 0:
			// A sticky /tmp is writable by the sessions of a server that
			// is not root when they run as its uid (minimal isolation).
			return fmt.Errorf("%s is writable by others (%v): a server that is not root keeps its cache out of shared directories", p, mode.Perm())
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// othersWrite: writable by others than the owner: the world, or a group
// other than root's. Not the server's own group either when that is not
// root's: its members are other users, who could swap a tree after the
// server checked it.
func othersWrite(mode fs.FileMode, gid uint32) bool {
	return mode&0o002 != 0 || (mode&0o020 != 0 && gid != 0)
}

// trustedTree checks that everything under dir (dir included) belongs to
// the server's user and is writable by nobody else (symlinks: owned only;
// their targets are checked where they are), so that no box, tenant or
// other user can have changed or added a file a session will run. A walk
// of the tree: 13.5 ms for the interpreter's at a load of 57
// (BenchmarkStartChecks).
func trustedTree(dir string) error {
	return walkTrusted(dir, nil)
}

// walkTrusted is trustedTree, keeping in seen (when not nil) what the walk
// read of each entry (its lstat), by its path under dir: intact checks
// types and sizes against these rather than with a second lstat of each.
func walkTrusted(dir string, seen map[string]fs.FileInfo) error {
	euid := uint32(os.Geteuid())
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			var fi fs.FileInfo
			if fi, err = d.Info(); err == nil {
				if seen != nil && len(p) > len(dir) {
					seen[p[len(dir)+1:]] = fi
				}
				return trustedEntry(p, fi, euid)
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
func trustedEntry(p string, fi fs.FileInfo, euid uint32) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner", p)
	}
	if st.Uid != euid {
		return fmt.Errorf("%s belongs to uid %d", p, st.Uid)
	}
	if fi.Mode().Type() != fs.ModeSymlink && othersWrite(fi.Mode(), st.Gid) {
		return fmt.Errorf("%s is writable by others (%v)", p, fi.Mode().Perm())
	}
	return nil
}
