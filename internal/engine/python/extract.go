//go:build !slim

package python

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	_ "unsafe" // go:linkname

	// The package embeds the interpreter (python-build-standalone) in its
	// internal data package; importing it links that data in.
	_ "github.com/kluctl/go-embed-python/python"

	"github.com/quro-dev/quro/internal/flock"
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

type markerData struct {
	ContentHash string    `json:"content_hash"`
	Files       int       `json:"files"`
	Compiled    bool      `json:"compiled"`
	At          time.Time `json:"at"`
	// Pycs are the standard library's .pyc files (unchecked-hash: used
	// without a look at the source), checked like the manifest's files.
	// Trees made before they were listed have none here (and timestamp
	// .pyc files, which the interpreter checks itself).
	Pycs []pycEntry `json:"pycs,omitempty"`
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

// treeLayout ends the tree's name: what of the embedded tree it holds.
// "nolibpython": not lib/libpython3.X.so (unloaded). A tree of another
// layout is another directory, so that builds that extract more or less
// of the same interpreter never take each other's for damaged.
const treeLayout = "nolibpython"

// treeName is the name of the extracted tree of m (CPython full) in the
// install root's python/.
func treeName(m *manifest, full string) string {
	return full + "-" + m.ContentHash[:16] + "-" + treeLayout
}

// unloaded matches what of the embedded tree is not extracted, as no box
// loads it: the shared libpython3.X (20 MB; its soname and the link to
// it). bin/python3.X has the interpreter linked in and no extension
// module of the tree needs it; lib/libpython3.so, the stable ABI's, is
// kept.
var unloaded = regexp.MustCompile(`^lib/libpython[0-9]+\.[0-9]+t?\.so(\.[0-9.]+)?$`)

var srcdirVersion = regexp.MustCompile(`(?m)^abs_srcdir=\s*\S*/Python-([0-9]+\.[0-9]+\.[0-9]+)\s*$`)

// ensureInstalled returns the extracted interpreter under dataDir/python,
// extracting it first when it is missing, from another version, or damaged.
// It holds an exclusive flock on dataDir/python/.lock meanwhile, so that
// several quro processes sharing a data directory extract it once.
func ensureInstalled(ctx context.Context, dataDir string, step Step) (*installation, error) {
	inst, err := installFrom(ctx, dataDir, precompiledArchive, step)
	if err != nil {
		return nil, err
	}
	// pip and the box's python3/pip shims beside it (see pip.go).
	if err := ensurePip(ctx, dataDir, inst); err != nil {
		return nil, err
	}
	return inst, nil
}

// installFrom is ensureInstalled with the precompiled standard library
// given (archive returns nil: none, compiled at extraction). archive is
// called only to extract: a start that finds the tree intact (every start
// but a data directory's first) does not copy the 4.2 MB archive out of
// the binary.
func installFrom(ctx context.Context, dataDir string, archive func() []byte, step Step) (*installation, error) {
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
		Dir:     filepath.Join(root, treeName(m, full)),
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
	unlock, err := flock.Lock(filepath.Join(root, ".lock"), func() { step(stepWaiting, 0, 0) })
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
	pycs, err := extractAll(ctx, tmp, inst.Dir, m, short, archive(), step)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	mk, _ := json.Marshal(markerData{ContentHash: m.ContentHash, Files: len(m.Files), Compiled: true, At: time.Now().UTC(), Pycs: pycs})
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

// extractAll writes the tree into tmp (to be renamed to final): the
// embedded files and, beside them, the precompiled standard library when
// archive is the one of this interpreter, or else what compileTree
// compiles. It returns the .pyc files written, for the marker.
func extractAll(ctx context.Context, tmp, final string, m *manifest, short string, archive []byte, step Step) ([]pycEntry, error) {
	var jobs []treeJob
	var pycs []pycEntry
	hdr, tr, closePre, _ := openPrecompiled(m, archive) // without it: compiled below
	if hdr != nil {
		defer closePre()
		jobs = append(jobs, treeJob{bytes: hdr.Bytes, run: func(ctx context.Context, wrote func(int64)) (err error) {
			pycs, err = extractPrecompiled(ctx, tmp, short, hdr, tr, wrote)
			return err
		}})
	}
	if err := extractTree(ctx, tmp, m, step, jobs...); err != nil {
		return nil, fmt.Errorf("extracting the embedded interpreter: %w", err)
	}
	if hdr != nil {
		return pycs, nil
	}
	tmpPython := filepath.Join(tmp, "bin", "python"+short)
	if err := compileTree(ctx, tmpPython, filepath.Join(tmp, "lib", "python"+short), tmp, final, compiledModules(m, short), step); err != nil {
		return nil, err
	}
	return listPycs(tmp)
}

// intact checks a tree against the manifest without reading file contents:
// the completion marker names the same content hash, everything in the
// tree is the server's user's and writable by nobody else (trustedTree),
// every entry exists with its type and size, and so does every .pyc file
// the marker lists. One walk, its lstat of each entry serving both the
// ownership check and the types and sizes: 23 ms at a load of 57 with a
// second lstat of each entry (BenchmarkStartChecks).
func intact(dir string, m *manifest) error {
	b, err := os.ReadFile(filepath.Join(dir, completeMarker))
	if err != nil {
		return fmt.Errorf("not extracted: %w", err)
	}
	var mk markerData
	if err := json.Unmarshal(b, &mk); err != nil || mk.ContentHash != m.ContentHash || !mk.Compiled {
		return errors.New("extracted from another interpreter build")
	}
	// What a box runs: nobody but the server's user may have written it
	// (the tree may be the machine's cache, shared by data directories).
	seen := make(map[string]fs.FileInfo, len(m.Files)+len(mk.Pycs))
	if err := walkTrusted(dir, seen); err != nil {
		return fmt.Errorf("untrusted: %w", err)
	}
	lstat := func(name string) (fs.FileInfo, error) {
		if fi, ok := seen[filepath.Clean(filepath.FromSlash(name))]; ok {
			return fi, nil
		}
		return nil, &fs.PathError{Op: "lstat", Path: filepath.Join(dir, name), Err: syscall.ENOENT}
	}
	for _, e := range mk.Pycs {
		fi, err := lstat(e.Name)
		if err != nil {
			return fmt.Errorf("damaged: %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Size() != e.Size {
			return fmt.Errorf("damaged: %s has changed", e.Name)
		}
	}
	for _, e := range m.Files {
		if unloaded.MatchString(e.Name) {
			continue
		}
		fi, err := lstat(e.Name)
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

// treeJob is more work for extractTree's pool: writing files of its own
// into the tree once its directories exist (the precompiled standard
// library), counted in the progress by its bytes.
type treeJob struct {
	bytes int64
	run   func(ctx context.Context, wrote func(int64)) error
}

// extractTree writes the embedded tree into dir (which must not exist),
// keeping symlinks as links, and runs the jobs alongside. Directories and
// links come first; then the files, largest first, are decompressed and
// written by a few goroutines at once (the interpreter's two large
// binaries alone are ~50 MB of gzip), so that on two cores the extraction
// takes about half as long as one file after the other.
func extractTree(ctx context.Context, dir string, m *manifest, step Step, jobs ...treeJob) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	type task struct {
		e   *manifestEntry
		job *treeJob
		n   int64
	}
	var tasks []task
	var total int64
	for i := range m.Files {
		e := &m.Files[i]
		if !fs.ValidPath(e.Name) || e.Name == "." {
			return fmt.Errorf("bad name in files.json: %q", e.Name)
		}
		if unloaded.MatchString(e.Name) {
			continue
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
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(e.Symlink, path); err != nil {
				return err
			}
		case e.Mode.IsRegular():
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			tasks = append(tasks, task{e: e, n: e.Size})
			total += e.Size
		}
	}
	for i := range jobs {
		tasks = append(tasks, task{job: &jobs[i], n: jobs[i].bytes})
		total += jobs[i].bytes
	}
	slices.SortStableFunc(tasks, func(a, b task) int { return cmp.Compare(b.n, a.n) })

	var mu sync.Mutex // serialises step, which is not safe for concurrent use
	var done int64
	step(stepExtracting, 0, total)
	wrote := func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		done += n
		step(stepExtracting, min(done, total), total)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan task)
	var wg sync.WaitGroup
	for range max(2, min(runtime.GOMAXPROCS(0), 4)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range next {
				if ctx.Err() != nil {
					continue
				}
				var err error
				if t.job != nil {
					err = t.job.run(ctx, wrote)
				} else {
					var n int64
					n, err = extractFile(filepath.Join(dir, filepath.FromSlash(t.e.Name)), *t.e)
					wrote(n)
				}
				if err != nil {
					cancel(err)
				}
			}
		}()
	}
	for _, t := range tasks {
		if ctx.Err() != nil {
			break
		}
		next <- t
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
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
	// Writable by the server's user alone, whatever the umask: the
	// archive's modes are group-writable (0664, 0775), which trustedTree
	// refuses.
	perm := e.Mode.Perm()&^0o022 | 0o400
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
// interpreter's archive ships without .pyc): the fallback of a build
// without the precompiled one of its interpreter (see precompiled.go), as
// unchecked-hash .pyc files like those. Paths recorded in the .pyc files
// are those of the final directory, not the temporary one. Progress is
// counted from compileall's "Compiling '...'" lines, of total.
func compileTree(ctx context.Context, python, lib, tmpRoot, finalRoot string, total int64, step Step) error {
	// This runs Quro's own interpreter on its own standard library, not user
	// code, so it does not go through the sandbox. -B -f: the modules
	// compileall imports itself are compiled like the others, not left as
	// the timestamp .pyc files its imports would write.
	var done int64
	step(stepCompiling, 0, total)
	out, err := runHelper(ctx, func(line string) {
		if strings.HasPrefix(line, "Compiling ") {
			done++
			step(stepCompiling, min(done, total), total)
		}
	}, python, "-I", "-B", "-m", "compileall", "-f", "-j", "0", "--invalidation-mode", invalidation, "-x", noCompile.String(),
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
