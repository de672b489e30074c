// Package toolchain is run_code's engine for compiled and other languages
// whose compiler or interpreter comes from the session's userland (the
// host's, or the session's rootfs): c, cpp, go, rust, java, ruby, perl, ….
//
// A run has two stages, each a separate process in the session's box with
// its own deadline. The build stage (skipped when the session's build
// cache has the result) writes the source, read from stdin, into a fresh
// directory of the cache, compiles it there, and renames the directory
// into place; the run stage starts the program. The cache is
// $TMPDIR/.quro-build/<sha256 of language, source, compiler identity and
// flags>/ and is written by the box only: the server passes paths and
// checks, through os.Root and without following a symlink, whether an
// entry is there. It never reads, runs or trusts what the session's uid
// wrote there; a session that tampers with it only fools itself.
package toolchain

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/quro-dev/quro/internal/limitbuf"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
)

// CacheDir is the build cache, relative to the session's tmp directory.
const CacheDir = ".quro-build"

// MaxEntries bounds the build cache: after a build, the box removes the
// oldest entries beyond it.
const MaxEntries = 32

// buildScript is the build stage, run by sh in the box: $1 the cache
// directory, $2 the entry's name, $3 the source file's name, then the
// compile command (none for an interpreted language). The source comes
// on stdin. It builds in a fresh hidden directory and renames it into
// place, so that concurrent builds of the same source never see a half
// entry (the loser of the rename drops its copy); a build the deadline
// killed leaves a hidden directory that a later build removes after an
// hour. Exit 125: the cache directory could not be prepared.
var buildScript = `b=$1 h=$2 f=$3; shift 3
umask 077
mkdir -p "$b" || exit 125
find "$b" -maxdepth 1 -name '.*.tmp*' -mmin +60 -exec rm -rf {} + 2>/dev/null
st=$(mktemp -d "$b/.$h.tmpXXXXXX") || exit 125
cat > "$st/$f" || { rm -rf "$st"; exit 125; }
if [ $# -gt 0 ]; then
	(cd "$st" && exec "$@")
	rc=$?
	if [ $rc -ne 0 ]; then rm -rf "$st"; exit $rc; fi
fi
: > "$st/.ok"
mv -T "$st" "$b/$h" 2>/dev/null || rm -rf "$st"
ls -1t "$b" | tail -n +` + strconv.Itoa(MaxEntries+1) + ` | while IFS= read -r d; do rm -rf -- "$b/$d"; done
exit 0
`

// Engine runs one Tool's language.
type Engine struct {
	sb     *sandbox.Sandbox
	rootfs func(name string) (string, error)
	tool   *Tool

	mu       sync.Mutex
	versions map[string]string // userland and compiler file → version line
}

// New returns the engine of t. rootfs resolves a session's rootfs name to
// its directory (nil: sessions on a rootfs are refused).
func New(sb *sandbox.Sandbox, rootfs func(name string) (string, error), t *Tool) *Engine {
	return &Engine{sb: sb, rootfs: rootfs, tool: t, versions: map[string]string{}}
}

// Languages are run_code's toolchain languages, each with its toolchain
// engine first and then (when the userland has no toolchain) the
// renderer shown, which keeps the highlighted page.
func Languages(sb *sandbox.Sandbox, rootfs func(name string) (string, error), shown runcode.Engine) []runcode.Language {
	var out []runcode.Language
	for i := range Tools {
		t := &Tools[i]
		chain := []runcode.Engine{New(sb, rootfs, t)}
		if shown != nil {
			chain = append(chain, shown)
		}
		out = append(out, runcode.Language{Name: t.Lang, Aliases: t.Aliases, Runs: true, TakesInput: true, Chain: chain})
	}
	return out
}

// Name implements runcode.Engine.
func (e *Engine) Name() string { return "toolchain/" + e.tool.Prog }

// Probe implements runcode.Engine. The engine can always try: whether the
// toolchain is there depends on the session's userland, which Run looks
// at (HostProbe says whether the host's has it).
func (e *Engine) Probe(context.Context) error { return nil }

// Builds implements runcode.Builder: a run may first build, under the
// request's CompileTimeout.
func (e *Engine) Builds() {}

// HostProbe implements runcode.UserlandEngine: the host userland (that of
// sessions without a rootfs) has the toolchain.
func (e *Engine) HostProbe(context.Context) error {
	_, _, err := e.locate(userland{})
	return err
}

// locate finds, in the userland u, the tool's compiler or interpreter
// (prog) and its runner if it has one, and checks that what it requires
// is there; the error (missing) names the package that adds what is not.
func (e *Engine) locate(u userland) (prog, runner string, err error) {
	t := e.tool
	if prog, err = e.find(u, t.Prog, t.Alts); err != nil {
		return "", "", e.missing(u, t.Prog)
	}
	if !e.has(u, t.Requires) {
		return "", "", e.missing(u, t.RequiresName)
	}
	if t.Runner != "" {
		if runner, err = e.find(u, t.Runner, nil); err != nil {
			return "", "", e.missing(u, t.Runner)
		}
	}
	return prog, runner, nil
}

// userland is where a session's programs come from: the host ("" dir) or
// a rootfs directory.
type userland struct{ name, dir string }

func (u userland) key() string {
	if u.dir == "" {
		return "host"
	}
	return "rootfs:" + u.dir
}

// missing is the error of a userland without prog: it names the Debian
// package that adds it, so that the result (which falls through to the
// highlighted page) says how to make the code run.
func (e *Engine) missing(u userland, prog string) error {
	var how string
	switch {
	case e.tool.Missing != "":
		how = e.tool.Missing
	case u.dir == "":
		how = fmt.Sprintf("apt-get install %s on the host, or a session on a rootfs with install_packages %s", e.tool.Package, e.tool.Package)
	default:
		how = fmt.Sprintf("install_packages %s adds it", e.tool.Package)
	}
	where := "this server's userland"
	if u.dir != "" {
		where = fmt.Sprintf("the session's rootfs %q", u.name)
	}
	return fmt.Errorf("no %s in %s: %s", prog, where, how)
}

// find returns the path, as the box sees it, of the first of prog and
// alts that the userland has as an executable file.
func (e *Engine) find(u userland, prog string, alts []string) (string, error) {
	names := append([]string{prog}, alts...)
	if u.dir == "" {
		for _, n := range names {
			if path.IsAbs(n) {
				// Only under /usr, which every box shows.
				if fi, err := os.Stat(n); err == nil && strings.HasPrefix(n, "/usr/") && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
					return n, nil
				}
				continue
			}
			if p, err := e.sb.LookPath(n); err == nil && !strings.HasPrefix(p, sandbox.BinDir+"/") {
				return p, nil
			}
		}
		return "", errors.New("not found")
	}
	if p, ok := rootfs.LookPath(u.dir, names...); ok {
		return p, nil
	}
	return "", errors.New("not found")
}

// has reports whether the userland has a file matching the glob pattern
// (absolute, as the box sees it); an empty pattern is always there. In a
// rootfs the pattern is matched through os.Root.
func (e *Engine) has(u userland, pattern string) bool {
	if pattern == "" {
		return true
	}
	if u.dir == "" {
		m, _ := filepath.Glob(pattern)
		return len(m) > 0
	}
	root, err := os.OpenRoot(u.dir)
	if err != nil {
		return false
	}
	defer root.Close()
	m, _ := fs.Glob(root.FS(), strings.TrimPrefix(pattern, "/"))
	return len(m) > 0
}

// fileID identifies the compiler file for the version cache: a changed
// toolchain (install_packages, an upgrade) is probed again.
func fileID(u userland, p string) string {
	var fi fs.FileInfo
	var err error
	if u.dir == "" {
		fi, err = os.Stat(p)
	} else {
		fi, err = rootfs.Stat(u.dir, p)
	}
	if err != nil {
		return p
	}
	return fmt.Sprintf("%s:%d:%d", p, fi.Size(), fi.ModTime().UnixNano())
}

// maxVersions bounds the version cache (an entry per session and
// userland); past it the cache starts afresh.
const maxVersions = 4096

// version returns the toolchain's version line, probed once per session,
// userland and compiler file, in the session's box, without the session's
// variables (the version text comes from a program in the box, so it is
// cleaned and cut: it only goes into the session's result and cache key).
func (e *Engine) version(ctx context.Context, u userland, prog string, req *runcode.Request) string {
	// Per session: the probe runs in the session's box, so its answer is
	// the session's to shape (it could fake it); it must not reach another
	// session's results or cache keys.
	id := req.Session.ID + "\x00" + u.key() + "\x00" + fileID(u, prog)
	e.mu.Lock()
	v, ok := e.versions[id]
	e.mu.Unlock()
	if ok {
		return v
	}
	out := &limitbuf.Buffer{Max: 4096}
	spec := e.spec(req, u, append([]string{prog}, e.tool.Version...))
	spec.Env = nil
	spec.Stdout, spec.Stderr = out, out
	spec.Timeout = 30 * time.Second
	exit, err := e.sb.Run(ctx, spec)
	v = filepath.Base(prog)
	if err == nil && exit.Code == 0 && !exit.TimedOut && !exit.Canceled {
		for _, line := range strings.Split(out.String(), "\n") {
			if line = clean(line); line != "" {
				v = line
				break
			}
		}
		e.mu.Lock()
		if len(e.versions) >= maxVersions {
			clear(e.versions)
		}
		e.versions[id] = v
		e.mu.Unlock()
	}
	return v
}

// clean keeps the printable characters of s, at most 160.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > 160 {
		s = string(r[:160])
	}
	return s
}

// spec is the box spec of one stage: the session's, on its rootfs, with
// the toolchain's variables.
func (e *Engine) spec(req *runcode.Request, u userland, args []string) *sandbox.Spec {
	spec := runcode.ProcessSpec(req, args...)
	spec.Rootfs = u.dir
	if len(e.tool.Env) > 0 {
		env := make(map[string]string, len(spec.Env)+len(e.tool.Env))
		for k, v := range spec.Env {
			env[k] = v
		}
		for k, v := range e.tool.Env {
			if _, set := env[k]; !set {
				env[k] = strings.ReplaceAll(v, "{tmp}", e.boxTmp(req, req.Session.TmpDir()))
			}
		}
		spec.Env = env
	}
	return spec
}

func expand(tmpl []string, vars map[string]string) []string {
	out := make([]string, len(tmpl))
	for i, a := range tmpl {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "{"+k+"}", v)
		}
		out[i] = a
	}
	return out
}

// entryKey is the cache entry's name: the SHA-256 of everything the build
// depends on.
func entryKey(t *Tool, file, class, prog, version, code string) string {
	h := sha256.New()
	for _, s := range []string{t.Lang, file, class, prog, version, strings.Join(t.Compile, "\x00"), code} {
		fmt.Fprintf(h, "%d:%s\x00", len(s), s)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// built reports whether the session's cache has entry key: a regular
// .ok file in a directory of that name, looked at through os.Root in the
// session's tmp directory without following a symlink at the end. A
// session that fakes one only makes its own run fail.
func built(tmp, key string) bool {
	root, err := os.OpenRoot(tmp)
	if err != nil {
		return false
	}
	defer root.Close()
	fi, err := root.Lstat(CacheDir + "/" + key + "/.ok")
	return err == nil && fi.Mode().IsRegular()
}

// Run implements runcode.Engine.
func (e *Engine) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	t := e.tool
	u := userland{}
	if name := req.Session.Rootfs; name != "" {
		if e.rootfs == nil {
			return nil, rootfs.ErrNoEngineRootfs(name)
		}
		dir, err := e.rootfs(name)
		if err != nil {
			return nil, err
		}
		u = userland{name: name, dir: dir}
	}
	prog, runner, err := e.locate(u)
	if err != nil {
		return nil, err
	}
	version := e.version(ctx, u, prog, req)
	file, class := t.File, ""
	if t.Class != nil {
		file, class = t.Class(req.Code)
	}
	key := entryKey(t, file, class, prog, version, req.Code)
	tmp := req.Session.TmpDir()
	// The entry's paths as the box names them: a compiler's message never
	// shows the host path of the session's tmp.
	dir := e.boxTmp(req, filepath.Join(tmp, CacheDir, key))
	vars := map[string]string{"prog": prog, "runner": runner, "file": file, "class": class, "dir": dir, "src": filepath.Join(dir, file)}

	cached := built(tmp, key)
	var compileMS float64
	var warned bool
	for attempt := 0; ; attempt++ {
		if !cached {
			ms, said, r := e.build(ctx, req, u, version, key, file, expand(t.Compile, vars))
			if r != nil {
				return r, nil
			}
			compileMS, warned = ms, said
		}
		args := append(expand(t.Run, vars), req.Args...)
		spec := e.spec(req, u, args)
		if req.Stdin != "" {
			spec.Stdin = strings.NewReader(req.Stdin)
		}
		// spec.Timeout is req.Timeout (ProcessSpec), counted from the
		// program's start.
		exit, err := e.sb.Run(ctx, spec)
		var se *sandbox.StartError
		if err != nil && cached && attempt == 0 && errors.As(err, &se) {
			// The entry went away between the check and the run
			// (evicted by a concurrent build, removed by the session):
			// build it again.
			cached = false
			continue
		}
		if err != nil {
			return nil, err
		}
		r := runcode.ExitResult(exit, req.Timeout)
		r.Toolchain, r.Stage, r.Cached = version, "run", cached
		if t.Compiled() {
			r.CompileMS = compileMS
		}
		if t.Compiled() && warned {
			r.Notes = append(r.Notes, fmt.Sprintf("the compiler's messages are on stderr; the code was compiled as %s, whose line N is line N of the code", file))
		}
		return r, nil
	}
}

// counter passes writes on to w and counts them.
type counter struct {
	mu sync.Mutex
	w  io.Writer
	n  int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += int64(len(p))
	return c.w.Write(p)
}

func (c *counter) written() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// build runs the build stage and says how long it took and whether the
// compiler said anything (warnings). It returns a nil result when the
// entry is in place, else the result to return: the compile failed or timed out (stage
// "compile"), the program did not run.
func (e *Engine) build(ctx context.Context, req *runcode.Request, u userland, version, key, file string, compile []string) (float64, bool, *runcode.Result) {
	args := append([]string{"sh", "-c", buildScript, "sh", e.boxTmp(req, filepath.Join(req.Session.TmpDir(), CacheDir)), key, file}, compile...)
	spec := e.spec(req, u, args)
	spec.Stdin = strings.NewReader(req.Code)
	// The compiler's output is diagnostics, whichever stream it uses:
	// stdout stays the program's.
	diag := &counter{w: req.Stderr}
	spec.Stdout, spec.Stderr = diag, diag
	timeout := req.CompileTimeout
	if timeout <= 0 {
		timeout = runcode.DefaultCompileTimeout
	}
	spec.Timeout = timeout // from the compiler's start, not its box's
	start := time.Now()
	exit, err := e.sb.Run(ctx, spec)
	ms := float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		return ms, false, &runcode.Result{ExitCode: -1, Stage: "compile", Toolchain: version, CompileMS: ms,
			Error: "the build could not start: " + err.Error()}
	}
	switch {
	case exit.TimedOut:
		return ms, false, &runcode.Result{ExitCode: exit.Code, Stage: "compile", Toolchain: version, CompileMS: ms, TimedOut: true, Interrupted: true,
			Error: fmt.Sprintf("the compile timed out after %s (compile_timeout_ms); the compiler was killed and the program did not run", timeout.Round(time.Millisecond))}
	case exit.Canceled:
		return ms, false, &runcode.Result{ExitCode: exit.Code, Stage: "compile", Toolchain: version, CompileMS: ms, Interrupted: true,
			Error: "canceled by the caller during the compile; the compiler was killed"}
	case exit.Code == 125:
		return ms, false, &runcode.Result{ExitCode: exit.Code, Stage: "compile", Toolchain: version, CompileMS: ms,
			Error: "the build directory " + CacheDir + " in the session's tmp directory could not be prepared (see stderr)"}
	case exit.Code != 0:
		r := &runcode.Result{ExitCode: exit.Code, Stage: "compile", Toolchain: version, CompileMS: ms}
		r.Notes = append(r.Notes, fmt.Sprintf("the compile failed; the code was compiled as %s, whose line N is line N of the code", file))
		if exit.OOMKilled {
			r.OOMKilled = true
			r.Notes = append(r.Notes, "the compiler was killed: "+exit.OOM.Reason())
		}
		return ms, false, r
	}
	return ms, diag.written() > 0, nil
}

// boxTmp is where req's run sees p, a path in its session's tmp
// (sandbox.BoxTmp in a box).
func (e *Engine) boxTmp(req *runcode.Request, p string) string {
	return e.sb.TmpPath(req.Session.TmpDir(), p)
}
