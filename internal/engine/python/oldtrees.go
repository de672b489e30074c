package python

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/flock"
	"github.com/quro-dev/quro/internal/sandbox"
)

// The install root (the machine's cache, or a data directory) holds one
// interpreter tree, pip directory and worker module directory per quro
// build that used it: each new build adds its own. A server holds a
// shared lock on each directory it uses (treeLock, from before it
// prepares one until it closes), and once its first worker has started
// it removes in the background the directories of other builds that
// nobody holds (removeOldTrees): a server of another version that uses
// or prepares one holds its lock, and a box of any server that shows one
// has it among its mounts.

// treeLock is the lock file of the directory dir of the install root:
// beside it (a box shows the directory, not its parent), named after it.
func treeLock(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".lock")
}

// treeLocks are the shared locks an engine holds on the directories it
// uses, each taken once (hold) and all released by release.
type treeLocks struct {
	mu   sync.Mutex
	held map[string]func()
}

// hold takes the shared lock of dir, unless held already.
func (l *treeLocks) hold(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[dir] != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	unlock, err := flock.Shared(treeLock(dir))
	if err != nil {
		return err
	}
	if l.held == nil {
		l.held = map[string]func(){}
	}
	l.held[dir] = unlock
	return nil
}

func (l *treeLocks) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, unlock := range l.held {
		unlock()
	}
	l.held = nil
}

// Names of the directories removeOldTrees may remove: an interpreter
// tree (3.14.6-<hash>, with or without a layout suffix), a pip directory
// and, in python/worker, a worker module's directory; and what an
// interrupted removal left (.gc-*). Nothing else of the install root is
// touched.
var (
	oldTreeName   = regexp.MustCompile(`^([0-9]+\.[0-9]+\.[0-9]+-[0-9a-f]{16}(-[a-z0-9]+)?|pip-[0-9][0-9a-z.]*-[0-9a-f]{12})$`)
	oldWorkerName = regexp.MustCompile(`^[0-9a-f]{12}$`)
)

// locklessGrace is how long a directory that has no lock file (made by a
// build before the locks) must have been left unchanged before it is
// removed: a server of such a build takes no lock, and one that has
// just prepared it is about to use it.
const locklessGrace = 10 * time.Minute

// removeOldTrees removes the interpreter trees, pip directories and
// worker module directories under root/python other than keep (this
// server's) that nobody uses: each one whose lock nobody holds
// (flock.TryRemove), that no box shows (boundByABox) and, without a lock
// file, that was left unchanged for locklessGrace. A directory is
// renamed aside (.gc-*) before it is removed, so that a half-removed one
// is never taken for a tree; symbolic links are removed, never
// followed. It returns what it removed; errors are of the directories it
// could not remove, the rest is removed regardless.
func removeOldTrees(root string, keep []string) (removed []string, err error) {
	// One remover at a time on the machine: a lock file TryRemove makes
	// for a lockless tree is gone before the next remover looks, which
	// would otherwise take it for a tree's own and skip the grace.
	unlock, ok, err := flock.TryLock(filepath.Join(root, "python", ".gc.lock"))
	if errors.Is(err, fs.ErrNotExist) || err == nil && !ok {
		return nil, nil // nothing installed, or another server collects
	}
	if err != nil {
		return nil, err
	}
	defer unlock()
	var errs []error
	for _, d := range []struct {
		dir  string
		name *regexp.Regexp
	}{{filepath.Join(root, "python"), oldTreeName}, {filepath.Join(root, "python", "worker"), oldWorkerName}} {
		ents, rerr := os.ReadDir(d.dir)
		if rerr != nil {
			if !errors.Is(rerr, fs.ErrNotExist) {
				errs = append(errs, rerr)
			}
			continue
		}
		for _, ent := range ents {
			p := filepath.Join(d.dir, ent.Name())
			if strings.HasPrefix(ent.Name(), ".gc-") {
				// An interrupted removal's: renamed aside under the lock,
				// nobody uses it.
				errs = append(errs, os.RemoveAll(p))
				continue
			}
			if !d.name.MatchString(ent.Name()) || slices.Contains(keep, p) || ent.Type() != fs.ModeDir {
				continue
			}
			ok, rerr := flock.TryRemove(treeLock(p), func(existed bool) (bool, error) {
				return removeTree(p, existed)
			})
			if ok {
				removed = append(removed, p)
			}
			errs = append(errs, rerr)
		}
	}
	return removed, errors.Join(errs...)
}

// removeTree removes dir, whose lock is held exclusively, unless a box
// shows it or, without a lock file before (a build older than the
// locks), it changed within locklessGrace.
func removeTree(dir string, hadLock bool) (bool, error) {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !hadLock && ok &&
		time.Since(time.Unix(st.Ctim.Unix())) < locklessGrace {
		return false, nil
	}
	if bound, err := boundByABox(dir); bound || err != nil {
		return false, err
	}
	aside := filepath.Join(filepath.Dir(dir), ".gc-"+randomHex(6))
	if err := os.Rename(dir, aside); err != nil {
		return false, err
	}
	// os.RemoveAll opens each directory without following a link
	// (openat, O_NOFOLLOW) and unlinks links as they are.
	return true, os.RemoveAll(aside)
}

// boundByABox reports whether a mount namespace of a process on the
// machine (a box of this or another server) has a mount of dir or of a
// directory in it: a box shows the interpreter's directories through
// bind mounts, which /proc/PID/mountinfo lists by their device and their
// path within its filesystem.
func boundByABox(dir string) (bool, error) {
	// Mount points are real paths: a data directory reached through a
	// link is matched by where it is.
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, err
	}
	dev, rel, err := mountedAt(real)
	if err != nil {
		return false, err
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false, err
	}
	seen := map[string]bool{}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns", "mnt"))
		if err != nil || seen[ns] {
			continue // gone, or a namespace already looked at
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "mountinfo"))
		if err != nil {
			continue // gone meanwhile: another process of its namespace is read
		}
		seen[ns] = true
		for _, m := range parseMountinfo(b) {
			if m.dev == dev && (m.root == rel || strings.HasPrefix(m.root, rel+"/")) {
				return true, nil
			}
		}
	}
	return false, nil
}

// mountedAt is where dir lies in the server's mount namespace: the
// device of the mount that holds it and its path within that mount's
// filesystem, as mountinfo names a bind mount of it.
func mountedAt(dir string) (dev, rel string, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	var best *mountEntry
	for _, m := range parseMountinfo(b) {
		if (dir == m.point || strings.HasPrefix(dir, strings.TrimSuffix(m.point, "/")+"/")) &&
			(best == nil || len(m.point) >= len(best.point)) {
			best = &m
		}
	}
	if best == nil {
		return "", "", fmt.Errorf("%s is on no mount", dir)
	}
	rest := strings.TrimPrefix(dir, strings.TrimSuffix(best.point, "/"))
	return best.dev, filepath.Join(best.root, rest), nil
}

// mountEntry is one line of /proc/PID/mountinfo: the mount's device
// (major:minor), the path within its filesystem it shows, and where.
type mountEntry struct{ dev, root, point string }

func parseMountinfo(b []byte) []mountEntry {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		out = append(out, mountEntry{dev: f[2], root: sandbox.UnescapeMountPath(f[3]), point: sandbox.UnescapeMountPath(f[4])})
	}
	return out
}
