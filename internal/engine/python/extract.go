//go:build !slim

package python

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	_ "unsafe" // go:linkname

	// The package embeds the interpreter (python-build-standalone) in its
	// internal data package; importing it links that data in.
	_ "github.com/kluctl/go-embed-python/python"
	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
)

// embeddedFS is the interpreter tree of github.com/kluctl/go-embed-python
// for this platform: files.json (names, sizes, modes, symlinks, a content
// hash) and the files, large binaries gzip-compressed as NAME.gz. The module
// exposes it only through an extractor that writes symlinked binaries as
// copies, in place and without a rename, so Quro reads the data itself.
//
//go:linkname embeddedFS github.com/kluctl/go-embed-python/python/internal/data.Data
var embeddedFS fs.FS

// manifest is files.json of the embedded tree.
type manifest struct {
	ContentHash string          `json:"contentHash"`
	Files       []manifestEntry `json:"files"`
}

type manifestEntry struct {
	Name       string      `json:"name"`
	Size       int64       `json:"size"`
	Mode       fs.FileMode `json:"perm"`
	Symlink    string      `json:"symlink,omitempty"`
	Compressed bool        `json:"compressed,omitempty"`
}

// Step reports how the one-time preparation of the interpreter goes:
// stage stepWaiting (for another process preparing it; done and total 0),
// stepExtracting (done of total bytes written) or stepCompiling (done of
// total standard-library modules byte-compiled).
type Step func(stage string, done, total int64)

const (
	stepWaiting    = "waiting for another quro process preparing it"
	stepExtracting = "extracting"
	stepCompiling  = "compiling the standard library"
)

// installation is an extracted interpreter tree.
type installation struct {
	Dir     string // $DATA/python/<version>-<hash>
	Python  string // Dir/bin/python3.X
	Version string // e.g. 3.14.6
	// Extracted is true when this call wrote the tree (false: reused).
	Extracted bool
}

// completeMarker is written last into a finished tree, before the rename.
const completeMarker = ".quro-complete"

type markerData struct {
	ContentHash string    `json:"content_hash"`
	Files       int       `json:"files"`
	Compiled    bool      `json:"compiled"`
	At          time.Time `json:"at"`
}

func readManifest() (*manifest, error) {
	if embeddedFS == nil {
		return nil, errors.New("the embedded interpreter data is not linked into this binary")
	}
	b, err := fs.ReadFile(embeddedFS, "files.json")
	if err != nil {
		return nil, fmt.Errorf("embedded interpreter: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("embedded interpreter: files.json: %w", err)
	}
	if m.ContentHash == "" || len(m.Files) == 0 {
		return nil, errors.New("embedded interpreter: empty files.json")
	}
	return &m, nil
}

// pythonVersion is the CPython version of the embedded tree: X.Y from
// lib/pythonX.Y, X.Y.Z from the build directory named in its config
// Makefile (abs_srcdir=/build/Python-3.14.6).
func pythonVersion(m *manifest) (full, short string) {
	for _, e := range m.Files {
		if rest, ok := strings.CutPrefix(e.Name, "lib/python"); ok && e.Mode.IsDir() && !strings.Contains(rest, "/") {
			short = rest
			break
		}
	}
	full = short
	for _, e := range m.Files {
		if !strings.HasPrefix(e.Name, "lib/python"+short+"/config-") || !strings.HasSuffix(e.Name, "/Makefile") || e.Compressed {
			continue
		}
		b, err := fs.ReadFile(embeddedFS, e.Name)
		if err != nil {
			break
		}
		if m := srcdirVersion.FindSubmatch(b); len(m) > 1 && strings.HasPrefix(string(m[1]), short+".") {
			full = string(m[1])
		}
		break
	}
	return full, short
}

var srcdirVersion = regexp.MustCompile(`(?m)^abs_srcdir=\s*\S*/Python-([0-9]+\.[0-9]+\.[0-9]+)\s*$`)

// ensureInstalled returns the extracted interpreter under dataDir/python,
// extracting it first when it is missing, from another version, or damaged.
// It holds an exclusive flock on dataDir/python/.lock meanwhile, so that
// several quro processes sharing a data directory extract it once.
func ensureInstalled(ctx context.Context, dataDir string, step Step) (*installation, error) {
	if step == nil {
		step = func(string, int64, int64) {}
	}
	m, err := readManifest()
	if err != nil {
		return nil, err
	}
	full, short := pythonVersion(m)
	if short == "" {
		return nil, errors.New("embedded interpreter: no lib/python3.X in the tree")
	}
	root := filepath.Join(dataDir, "python")
	inst := &installation{
		Dir:     filepath.Join(root, full+"-"+m.ContentHash[:16]),
		Version: full,
	}
	inst.Python = filepath.Join(inst.Dir, "bin", "python"+short)

	// Fast path without the lock: an intact tree is only ever renamed into
	// place whole, so checking it is safe.
	if intact(inst.Dir, m) == nil {
		return inst, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("python data directory: %w", err)
	}
	unlock, err := lockFile(filepath.Join(root, ".lock"), func() { step(stepWaiting, 0, 0) })
	if err != nil {
		return nil, err
	}
	defer unlock()
	why := intact(inst.Dir, m)
	if why == nil { // another process finished it while we waited
		return inst, nil
	}
	// Leftovers of interrupted extractions are ours to remove: we hold the lock.
	if olds, _ := filepath.Glob(filepath.Join(root, ".extract-*")); len(olds) > 0 {
		for _, o := range olds {
			os.RemoveAll(o)
		}
	}
	tmp := filepath.Join(root, ".extract-"+randomHex(6))
	if err := extractTree(ctx, tmp, m, step); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("extracting the embedded interpreter: %w", err)
	}
	tmpPython := filepath.Join(tmp, "bin", "python"+short)
	if err := compileTree(ctx, tmpPython, filepath.Join(tmp, "lib", "python"+short), tmp, inst.Dir, compiledModules(m, short), step); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	mk, _ := json.Marshal(markerData{ContentHash: m.ContentHash, Files: len(m.Files), Compiled: true, At: time.Now().UTC()})
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), mk, 0o644); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if _, err := os.Lstat(inst.Dir); err == nil {
		// A damaged or half-written tree: move it aside, then drop it.
		old := filepath.Join(root, ".extract-old-"+randomHex(6))
		if err := os.Rename(inst.Dir, old); err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("replacing the damaged interpreter tree (%v): %w", why, err)
		}
		defer os.RemoveAll(old)
	}
	if err := os.Rename(tmp, inst.Dir); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	inst.Extracted = true
	return inst, nil
}

// intact checks a tree against the manifest without reading file contents:
// the completion marker names the same content hash, and every entry exists
// with its type and size. About 700 lstat calls: a millisecond or two.
func intact(dir string, m *manifest) error {
	b, err := os.ReadFile(filepath.Join(dir, completeMarker))
	if err != nil {
		return fmt.Errorf("not extracted: %w", err)
	}
	var mk markerData
	if err := json.Unmarshal(b, &mk); err != nil || mk.ContentHash != m.ContentHash || !mk.Compiled {
		return errors.New("extracted from another interpreter build")
	}
	for _, e := range m.Files {
		fi, err := os.Lstat(filepath.Join(dir, e.Name))
		switch {
		case err != nil:
			return fmt.Errorf("damaged: %w", err)
		case e.Mode.Type() == fs.ModeSymlink:
			if fi.Mode().Type() != fs.ModeSymlink {
				return fmt.Errorf("damaged: %s is not a symlink", e.Name)
			}
		case e.Mode.IsDir():
			if !fi.IsDir() {
				return fmt.Errorf("damaged: %s is not a directory", e.Name)
			}
		default:
			if !fi.Mode().IsRegular() || fi.Size() != e.Size {
				return fmt.Errorf("damaged: %s has changed", e.Name)
			}
		}
	}
	return nil
}

// extractTree writes the embedded tree into dir (which must not exist),
// keeping symlinks as links.
func extractTree(ctx context.Context, dir string, m *manifest, step Step) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	var total, done int64
	for _, e := range m.Files {
		if e.Mode.IsRegular() {
			total += e.Size
		}
	}
	step(stepExtracting, 0, total)
	for _, e := range m.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !fs.ValidPath(e.Name) || e.Name == "." {
			return fmt.Errorf("bad name in files.json: %q", e.Name)
		}
		path := filepath.Join(dir, filepath.FromSlash(e.Name))
		switch {
		case e.Mode.IsDir():
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case e.Mode.Type() == fs.ModeSymlink:
			target := filepath.Clean(filepath.Join(filepath.Dir(e.Name), e.Symlink))
			if filepath.IsAbs(e.Symlink) || strings.HasPrefix(target, "..") {
				return fmt.Errorf("symlink %s -> %s leaves the tree", e.Name, e.Symlink)
			}
			if err := os.Symlink(e.Symlink, path); err != nil {
				return err
			}
		case e.Mode.IsRegular():
			n, err := extractFile(path, e)
			done += n
			if err != nil {
				return err
			}
			step(stepExtracting, done, total)
		}
	}
	return nil
}

func extractFile(path string, e manifestEntry) (int64, error) {
	name := e.Name
	if e.Compressed {
		name += ".gz"
	}
	src, err := embeddedFS.Open(name)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	var r io.Reader = src
	if e.Compressed {
		gz, err := gzip.NewReader(src)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		defer gz.Close()
		r = gz
	}
	perm := e.Mode.Perm() | 0o400
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != e.Size {
		err = fmt.Errorf("%s: %d bytes, files.json says %d", e.Name, n, e.Size)
	}
	return n, err
}

// noCompile matches the standard-library paths compileTree skips: GUI and
// packaging modules that code in a box never imports (no display, no
// ensurepip: packages come through the install scope) and tests. They
// still work, compiled on import as without a cache.
var noCompile = regexp.MustCompile(`/(tkinter|turtledemo|idlelib|lib2to3|ensurepip|test|tests|idle_test)/|/turtle\.py$`)

// compiledModules counts the .py files compileTree compiles: the total of
// its progress.
func compiledModules(m *manifest, short string) int64 {
	var n int64
	lib := "lib/python" + short + "/"
	for _, e := range m.Files {
		if e.Mode.IsRegular() && strings.HasPrefix(e.Name, lib) && strings.HasSuffix(e.Name, ".py") && !noCompile.MatchString("/"+e.Name) {
			n++
		}
	}
	return n
}

// compileTree byte-compiles the standard library once, so that a fresh
// interpreter does not spend ~100 ms compiling what it imports (the
// archive ships without .pyc). Paths recorded in the .pyc files are those
// of the final directory, not the temporary one. Progress is counted from
// compileall's "Compiling '...'" lines, of total.
func compileTree(ctx context.Context, python, lib, tmpRoot, finalRoot string, total int64, step Step) error {
	// This runs Quro's own interpreter on its own standard library, not user
	// code, so it does not go through the sandbox.
	var done int64
	step(stepCompiling, 0, total)
	out, err := runHelper(ctx, func(line string) {
		if strings.HasPrefix(line, "Compiling ") {
			done++
			step(stepCompiling, min(done, total), total)
		}
	}, python, "-I", "-m", "compileall", "-j", "0", "-x", noCompile.String(),
		"-s", tmpRoot, "-p", finalRoot, lib)
	if err != nil {
		return fmt.Errorf("byte-compiling the standard library: %w: %s", err, strings.TrimSpace(lastLines(string(out), 10)))
	}
	step(stepCompiling, total, total)
	return nil
}

// helperEnv is the whole environment of the interpreter runs above: fixed,
// nothing of the server's or of a session's (PYTHON* variables would steer
// them).
var helperEnv = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}

// helperWaitDelay bounds how long a helper's output is read once it was
// killed or has exited: a process that left its group may hold the pipe.
const helperWaitDelay = 5 * time.Second

// runHelper runs the interpreter for the server's own work (compileall) and
// returns its combined output. compileall -j 0 starts a worker per core:
// the run gets a process group of its own, killed as a whole when ctx
// ends, so no worker outlives it holding the output pipe (which once kept
// the first run waiting for minutes after the parent alone was killed).
//
// Each line of the output goes to onLine as it comes, when set.
func runHelper(ctx context.Context, onLine func(string), python string, args ...string) ([]byte, error) {
	lw := &lineWriter{onLine: onLine}
	err := sandbox.RunHelper(ctx, &sandbox.Helper{Path: python, Args: args, Env: helperEnv,
		Stdout: lw, Stderr: lw, WaitDelay: helperWaitDelay})
	return lw.buf.Bytes(), err
}

// installWorker writes the worker module (worker.py, embedded in the
// binary) into the interpreter tree and byte-compiles it, keyed by its hash
// so that a changed worker gets a directory of its own. It returns the
// directory to put on sys.path.
func installWorker(ctx context.Context, inst *installation, source []byte) (string, error) {
	sum := sha256.Sum256(source)
	dir := filepath.Join(inst.Dir, "quro", hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err == nil {
		return dir, nil
	}
	unlock, err := lockFile(filepath.Join(filepath.Dir(inst.Dir), ".lock"), nil)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err == nil {
		return dir, nil
	}
	os.RemoveAll(dir) // a half-written one, from before the marker existed
	tmp := dir + ".tmp-" + randomHex(4)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, workerModule+".py"), source, 0o644); err != nil {
		return "", err
	}
	if out, err := runHelper(ctx, nil, inst.Python, "-I", "-m", "compileall", "-q", "-s", tmp, "-p", dir, tmp); err != nil {
		return "", fmt.Errorf("byte-compiling the worker: %v: %s", err, strings.TrimSpace(lastLines(string(out), 10)))
	}
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), []byte("ok\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// lineWriter keeps a helper's output and hands each complete line to
// onLine.
type lineWriter struct {
	buf     bytes.Buffer
	onLine  func(string)
	scanned int // bytes of buf already handed out
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if w.onLine == nil {
		return len(p), nil
	}
	for {
		rest := w.buf.Bytes()[w.scanned:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.onLine(string(rest[:i]))
		w.scanned += i + 1
	}
}

// lockFile takes an exclusive flock on path, creating it. waiting, if
// set, is called first when another holds the lock.
func lockFile(path string, waiting func()) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if waiting != nil && errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK) {
		waiting()
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN) // and if not, the Close releases it
		f.Close()
	}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
