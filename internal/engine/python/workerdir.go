package python

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	"github.com/quro-dev/quro/internal/flock"
)

// workerDir is the directory of the worker module, under the directory
// that also holds the embedded interpreter trees (root/python, of which a
// session box shows only this directory, the interpreter's tree and pip's:
// Embedded.BoxDirs): root/python/worker/<hash of the module>.
// It is the worker's own small tree, apart from any interpreter's, so that
// a box that does not show the embedded interpreter (a rootfs session) or
// a build without one (-tags slim) still has the module.
func workerDir(root string) string {
	sum := sha256.Sum256(workerSource)
	return filepath.Join(root, "python", "worker", hex.EncodeToString(sum[:6]))
}

// completeWorkerDir is workerDir(root) when it is complete (its marker
// written). ensureWorkerDir renames a directory into place only when it
// has no marker: a complete one is only ever added to in place (the
// compiled module a slim build's directory lacks), so a box's bind of it
// stays the directory at its path.
func completeWorkerDir(root string) (string, bool) {
	dir := workerDir(root)
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err != nil {
		return "", false
	}
	return dir, true
}

// ensureWorkerDir writes the worker module (embedded in the binary) into
// workerDir(root) once per data directory, under a lock shared with other
// quro processes, and returns the directory to put on sys.path (written
// again when others than the server's user could have changed it:
// trustedTree). compile,
// if set, byte-compiles the module in the directory given (before it is
// renamed into place, or into a finished directory that lacks its
// compiled form): a module whose compiled form is missing for an
// interpreter (the rootfs's python3) is compiled in memory at each start.
func ensureWorkerDir(ctx context.Context, root string, compile func(ctx context.Context, dir, final string) error, compiled func(dir string) bool) (string, error) {
	dir := workerDir(root)
	done := func() bool {
		if _, err := os.Stat(filepath.Join(dir, completeMarker)); err != nil || trustedTree(dir) != nil {
			return false
		}
		return compile == nil || compiled(dir)
	}
	if done() {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	unlock, err := flock.Lock(filepath.Join(filepath.Dir(dir), ".lock"), nil)
	if err != nil {
		return "", err
	}
	defer unlock()
	if done() {
		return dir, nil
	}
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err == nil && trustedTree(dir) == nil {
		// Written by a build without the compiler (-tags slim).
		return dir, compile(ctx, dir, dir)
	}
	os.RemoveAll(dir) // a half-written one, or one that others could write
	tmp := dir + ".tmp-" + randomHex(4)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, workerModule+".py"), workerSource, 0o644); err != nil {
		return "", err
	}
	if compile != nil {
		if err := compile(ctx, tmp, dir); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), []byte("ok\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}
