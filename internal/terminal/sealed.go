package terminal

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/quro-dev/quro/internal/sandbox"
)

// The resident shell must be non-dumpable: its commands run as the same uid
// in child processes, and a dumpable shell would let them open
// /proc/<shell>/fd/3 (the status channel) or write /proc/<shell>/mem. The
// kernel makes a process non-dumpable when it execs a file it may execute
// but not read (fs/exec.c would_dump), and a fork keeps the mm's flag, so
// the shell runs from a copy of bash with mode 0111 (owner root when the
// server is root; its own uid otherwise, which, without read bits and bound
// read-only, is just as unreadable to user code). prctl(PR_SET_DUMPABLE, 0)
// would not do: execve resets it.

var sealed struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string // source key -> sealed copy
}

// sealedBash returns the host path of an execute-only copy of the box's
// bash: src is bash's path inside the box, rootfs the box's root filesystem
// ("" for the host userland). The copy is made once per content.
func sealedBash(rootfs, src string) (string, error) {
	var f *os.File
	var err error
	if rootfs != "" {
		// Resolve inside the rootfs only: an apt run could have left a
		// symlink that points out of it.
		root, rerr := os.OpenRoot(rootfs)
		if rerr != nil {
			return "", rerr
		}
		f, err = root.Open(strings.TrimPrefix(src, "/"))
		root.Close()
	} else {
		f, err = os.Open(src)
	}
	if err != nil {
		return "", fmt.Errorf("open the box's bash: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("the box's bash is not a regular file")
	}
	key := fmt.Sprintf("%s\x00%s\x00%d\x00%d", rootfs, src, fi.Size(), fi.ModTime().UnixNano())
	sealed.mu.Lock()
	defer sealed.mu.Unlock()
	if p, ok := sealed.paths[key]; ok {
		// Put the mode back in case a run without the box (same uid, no
		// read-only bind) changed it; a dumpable shell is what this avoids.
		if err := os.Chmod(p, 0o111); err == nil {
			return p, nil
		}
	}
	if sealed.dir == "" {
		d, err := sealedDir()
		if err != nil {
			return "", err
		}
		sealed.dir, sealed.paths = d, map[string]string{}
	}
	tmp, err := os.CreateTemp(sealed.dir, ".bash-*")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(tmp, h), f)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o111)
	}
	p := filepath.Join(sealed.dir, "bash-"+hex.EncodeToString(h.Sum(nil))[:24])
	if err == nil {
		// Named by its content: another server's copy of the same bash is
		// this one, so the rename replaces it with the same bytes.
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("seal the box's bash: %w", err)
	}
	sealed.paths[key] = p
	return p, nil
}

// sealedDir is the directory of the sealed copies: one per user,
// <tmp>/quro-sealed-<euid>, shared by every server process of that user
// (the copies are named by their content), so that servers and test runs
// do not each leave a copy of bash behind. It is used only when it is a
// real directory (not a link) of this user that nobody else may write;
// otherwise, as before, a fresh one per process.
func sealedDir() (string, error) {
	d := filepath.Join(os.TempDir(), fmt.Sprintf("quro-sealed-%d", os.Geteuid()))
	if err := os.Mkdir(d, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return freshSealedDir()
	}
	fi, err := os.Lstat(d)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return freshSealedDir()
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return freshSealedDir()
	}
	// Traversable by the boxes' uids, listable by nobody else.
	if err := os.Chmod(d, 0o711); err != nil {
		return "", err
	}
	return d, nil
}

func freshSealedDir() (string, error) {
	d, err := os.MkdirTemp("", "quro-sealed-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(d, 0o711); err != nil {
		return "", err
	}
	return d, nil
}

// SealedInBox is where a box shows SealedDir (sandbox.Options.Places):
// the resident shell starts its copy of bash there, and nothing in the
// box names the host's temporary directory.
const SealedInBox = sandbox.RunDir + "/sealed"

// SealedDir is the directory of the sealed copies of bash (made now if
// need be): a session box binds it read-only (at SealedInBox, where the
// server's sandbox places it), so a shell started in the box later finds
// its copy there.
func SealedDir() (string, error) {
	sealed.mu.Lock()
	defer sealed.mu.Unlock()
	if sealed.dir == "" {
		d, err := sealedDir()
		if err != nil {
			return "", err
		}
		sealed.dir, sealed.paths = d, map[string]string{}
	}
	return sealed.dir, nil
}
