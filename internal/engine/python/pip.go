//go:build !slim

package python

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/quro-dev/quro/internal/flock"
	"github.com/quro-dev/quro/internal/sandbox"
)

// pip for the sessions' Python: the wheel of pip 25.1.1 (Debian trixie's
// python3-pip-whl, fetched and checked by `make pip-wheel`) is embedded and
// extracted once per data directory, beside the interpreter tree, into
// PIPDIR = <root>/python/pip-<version>-<sha12> (read-only to every box
// made after the preparation; see Embedded.BoxDirs):
//
//   - PIPDIR/pip, PIPDIR/pip-*.dist-info: pip itself, byte-compiled for the
//     embedded 3.14 in the background once the preparation is done
//     (compilePip: unchecked-hash .pyc), and for the
//     host's /usr/bin/python3 when it has one (Debian 12: 3.11, the
//     python3 of a Debian 12 rootfs too): the server's own interpreter on
//     pip's files, like the standard library's compileall. A rootfs whose
//     python3 is another version finds no .pyc of its own and, the
//     directory being read-only, writes none: it compiles what it imports
//     from pip on each run (~0.4 s more per pip install).
//   - the interpreter tree's lib/pythonX.Y/site-packages/quro-pip.pth names
//     PIPDIR, and quro-pip-box.pth its box path BoxPip (pipBoxPth):
//     `python3 -m pip` finds pip (site-packages only: code run with
//     -S/-I, like the worker, does not see it; a user site comes first, so a
//     pip the session installs itself wins).
//   - TREE/quro-bin: python3, python, pip, pip3 for a box on the host
//     userland, first on its PATH (see ShimDirs): the embedded interpreter,
//     so the shell's python3 is run_code's.
//   - PIPDIR/bin: pip, pip3 for a box on a rootfs: the same pip run by the
//     rootfs's /usr/bin/python3; and python, python3: that python3 (the
//     resident worker's), so `python` exists where Debian has none.
//
// The pip shims end a failed run with a hint when Quro set PIP_NO_INDEX for a
// session without network (QURO_PIP_OFFLINE=1 in the box's environment).

//go:embed pipwheel/pip-25.1.1-py3-none-any.whl
var pipWheel []byte

//go:embed pipwheel/pip-25.1.1-py3-none-any.whl.sha256
var pipWheelSum string

// PipVersion is the version of the pip sessions get.
const PipVersion = "25.1.1"

// OfflineHint is the line a failed pip run ends with in a session without
// network.
const OfflineHint = "quro: this session has no network (policy none): pip can install only wheels already in the tenant's cache; fetch them with install_packages {manager: pip, packages: [...]} or use a session with network internet"

// unreachableLog matches what pip logs when no index answered (pip.Diagnose's marks).
const unreachableLog = "NewConnectionError|Failed to establish a new connection|Name or service not known|Temporary failure in name resolution|" +
	"Connection refused|Network is unreachable|No route to host|ConnectTimeoutError|ReadTimeoutError|ProxyError|" +
	"Tunnel connection failed|SSLError|Max retries exceeded"

// hostPython3 is the host's python3, whose .pyc of pip serve a rootfs of
// the same Python version.
const hostPython3 = "/usr/bin/python3"

// rootfsPython3 is a rootfs's python3, which its sessions' run_code runs
// (the rootfs worker) and its shims name.
const rootfsPython3 = "/usr/bin/python3"

// pipLayout is the marker of a complete pip directory: another layout
// (an older Quro's) is extracted again.
const pipLayout = "pip layout 3: pyc for 3.14 and the host's python3, shims asking quro __pip offline\n"

// pipDirName is the directory name of the extracted pip: its version and
// the wheel's hash.
//
// Every box's start asks for it (BoxDirs): the wheel's hash is taken once.
var pipDirName = sync.OnceValue(func() string {
	sum := sha256.Sum256(pipWheel)
	return "pip-" + PipVersion + "-" + hex.EncodeToString(sum[:6])
})

// PipDir is where pip is extracted for the install root (the data
// directory, or EmbeddedOptions.InstallRoot): the directory holding the pip
// package. Empty when the build has no pip.
func PipDir(root string) string {
	return filepath.Join(root, "python", pipDirName())
}

// ShimDirs are the directories to put first on a box's PATH: host for a
// box on the host userland (python3, python, pip, pip3 of the embedded
// interpreter), rootfs for a box on a rootfs (python3 and python: its
// /usr/bin/python3; pip, pip3 run by it). They exist once the
// interpreter was prepared. They are the one place a session's python3,
// python, pip and pip3 are named: every run of a session has the one of
// its userland first on PATH (app's RunEnv), and a login shell keeps it
// there (the box's /etc/profile, see sandbox).
func ShimDirs(root string) (host, rootfs string) {
	m, err := readManifest()
	if err != nil {
		return "", ""
	}
	full, _ := pythonVersion(m)
	host = filepath.Join(root, "python", treeName(m, full), "quro-bin")
	return host, filepath.Join(PipDir(root), "bin")
}

// BoxPlaces are where every box shows the interpreter's directories
// under root (sandbox.Options.Places): the tree at BoxTree, pip's
// directory at BoxPip, the worker module's at BoxWorker.
func BoxPlaces(root string) []sandbox.Bind {
	host, _ := ShimDirs(root)
	if host == "" {
		return nil
	}
	return []sandbox.Bind{{Src: filepath.Dir(host), Dst: BoxTree}, {Src: PipDir(root), Dst: BoxPip}, {Src: workerDir(root), Dst: BoxWorker}}
}

// checkPipWheel checks the embedded wheel against its recorded sha256.
func checkPipWheel() error {
	want, _, _ := strings.Cut(strings.TrimSpace(pipWheelSum), " ")
	sum := sha256.Sum256(pipWheel)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("the embedded pip wheel has sha256 %s, its .sha256 file says %s", got, want)
	}
	return nil
}

// ensurePip extracts pip and writes the shims for inst (extracted under
// root), once: a marker in each says it is complete. It holds the flock of
// root/python while it writes.
func ensurePip(ctx context.Context, root string, inst *installation) error {
	pipDir := PipDir(root)
	shims := filepath.Join(inst.Dir, "quro-bin")
	site := filepath.Join(inst.Dir, "lib", "python"+shortVersion(inst), "site-packages")
	pth, boxPth := filepath.Join(site, "quro-pip.pth"), filepath.Join(site, pipBoxPth)
	// Each marker names the paths its files were written for: a data
	// directory moved (or copied) elsewhere has shims and a .pth naming the
	// old place, which a box does not show; they are written again.
	has := func(p, want string) bool {
		b, err := os.ReadFile(p)
		return err == nil && string(b) == want
	}
	pipMarkerFile := filepath.Join(pipDir, completeMarker)
	// A pip directory of this layout made before the rootfs shims had
	// python and python3 gets them added (not a new layout: a Quro
	// sharing the directory that knows only pip and pip3 keeps it).
	// So does one whose rootfs pip shim is another script (one that
	// knew only the host path): the marker is unchanged, so that a Quro
	// sharing the directory that writes the older script keeps this one,
	// which serves it too.
	rootfsShimsDone := func() bool {
		_, err := os.Stat(filepath.Join(pipDir, "bin", "python"))
		return err == nil && has(filepath.Join(pipDir, "bin", "pip"), rootfsPipShim(pipDir))
	}
	// A pip directory that others than the server's user could have
	// changed is extracted again, whole (the install root may be the
	// machine's cache, shared by data directories).
	pipTrusted := func() bool { return trustedTree(pipDir) == nil }
	pipDone := func() bool { return has(pipMarkerFile, pipMarker(pipDir)) && rootfsShimsDone() && pipTrusted() }
	done := func() bool {
		return pipDone() && has(filepath.Join(shims, completeMarker), shimsMarker(inst.Python, pipDir)) && has(pth, pipDir+"\n") && has(boxPth, BoxPip+"\n")
	}
	if done() {
		return nil
	}
	unlock, err := flock.Lock(filepath.Join(root, "python", ".lock"), nil)
	if err != nil {
		return err
	}
	defer unlock()
	if done() {
		return nil
	}
	if b, err := os.ReadFile(pipMarkerFile); err == nil && strings.HasPrefix(string(b), pipLayout) && !pipDone() && pipTrusted() {
		// This layout, extracted for another place (only the rootfs shims
		// name it), or before they had python and python3.
		if err := writeRootfsShims(pipDir, pipDir); err != nil {
			return err
		}
		if err := writeAtomic(pipMarkerFile, []byte(pipMarker(pipDir)), 0o644); err != nil {
			return err
		}
	}
	if !pipDone() {
		if err := extractPip(ctx, inst, pipDir); err != nil {
			return fmt.Errorf("extracting pip: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(pth), 0o755); err != nil {
		return err
	}
	if err := writeAtomic(pth, []byte(pipDir+"\n"), 0o644); err != nil {
		return err
	}
	if err := writeAtomic(boxPth, []byte(BoxPip+"\n"), 0o644); err != nil {
		return err
	}
	return writeShims(shims, inst.Python, pipDir)
}

// pipBoxPth names pip's directory at its box path (BoxPip) in the
// interpreter's site-packages, beside quro-pip.pth naming its host path:
// site adds the line of each that names a directory there, in a box the
// box path (a box does not show the host path), without one (minimal
// isolation) the host path. Two files, not two lines of one, so that a
// Quro sharing the install root that writes only quro-pip.pth leaves it.
const pipBoxPth = "quro-pip-box.pth"

func shortVersion(inst *installation) string {
	return strings.TrimPrefix(filepath.Base(inst.Python), "python")
}

// extractPip writes the wheel's files into a temporary directory beside
// final, adds the rootfs shims and renames it into place; compilePip
// byte-compiles them later, off the first run's path.
func extractPip(ctx context.Context, inst *installation, final string) error {
	if err := checkPipWheel(); err != nil {
		return err
	}
	zr, err := zip.NewReader(bytes.NewReader(pipWheel), int64(len(pipWheel)))
	if err != nil {
		return err
	}
	tmp := final + ".tmp-" + randomHex(4)
	defer os.RemoveAll(tmp)
	for _, f := range zr.File {
		name := path.Clean(f.Name)
		if strings.HasSuffix(f.Name, "/") {
			continue
		}
		if path.IsAbs(name) || name == "." || strings.HasPrefix(name, "../") || !(strings.HasPrefix(name, "pip/") || strings.HasPrefix(name, "pip-")) {
			return fmt.Errorf("unexpected file in the pip wheel: %q", f.Name)
		}
		dst := filepath.Join(tmp, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyZipFile(f, dst); err != nil {
			return err
		}
	}
	if err := writeRootfsShims(tmp, final); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), []byte(pipMarker(final)), 0o644); err != nil {
		return err
	}
	// A damaged one, or of another layout, is renamed aside before it is
	// removed: compilePip (this process's or another's sharing the install
	// root) may be writing its .pyc files there, and a RemoveAll racing
	// it left a non-empty directory the rename could not replace.
	if _, err := os.Lstat(final); err == nil {
		old := final + ".old-" + randomHex(4)
		if err := os.Rename(final, old); err != nil {
			return err
		}
		defer os.RemoveAll(old)
	}
	return os.Rename(tmp, final)
}

// pipCompiledMarker is written in a pip directory once compilePip
// finished there.
const pipCompiledMarker = ".quro-compiled"

// pipCompiled reports whether compilePip finished in pipDir.
func pipCompiled(pipDir string) bool {
	_, err := os.Stat(filepath.Join(pipDir, pipCompiledMarker))
	return err == nil
}

// compilePip byte-compiles the extracted pip in place, for the embedded
// interpreter and (best effort: without them a 3.11 rootfs compiles pip
// on each run) the host's python3, as unchecked-hash .pyc files, then
// writes pipCompiledMarker. It is not part of the preparation: no first
// run imports pip, and the two compileall runs were most of a fresh data
// directory's first result (seconds of CPU on two cores). The engine runs
// it in the background once its preparation is done (Embedded's
// afterFirstWorker); until it has run, pip compiles what it imports in
// memory (the directory is read-only in every box). compileall writes
// each file to a temporary name and renames it, so a box importing pip
// meanwhile reads a whole .pyc or none, and two quro processes sharing
// the directory may both run it.
func compilePip(ctx context.Context, inst *installation, pipDir string) error {
	if pipCompiled(pipDir) {
		return nil
	}
	// The directory compiled is the one marked: extractPip may replace it
	// meanwhile (a damaged or untrusted one, by this process or another
	// sharing the install root), and the new one has no .pyc yet.
	before, err := os.Stat(pipDir)
	if err != nil {
		return err
	}
	if out, err := runHelper(ctx, nil, inst.Python, "-I", "-B", "-m", "compileall", "-q",
		"--invalidation-mode", invalidation, filepath.Join(pipDir, "pip")); err != nil {
		return fmt.Errorf("byte-compiling pip: %v: %s", err, strings.TrimSpace(lastLines(string(out), 10)))
	}
	if fi, err := os.Stat(hostPython3); err == nil && fi.Mode().IsRegular() {
		_, _ = runHelper(ctx, nil, hostPython3, "-I", "-B", "-m", "compileall", "-q",
			"--invalidation-mode", invalidation, filepath.Join(pipDir, "pip"))
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if after, serr := os.Stat(pipDir); serr == nil && os.SameFile(before, after) {
		return writeAtomic(filepath.Join(pipDir, pipCompiledMarker), []byte("ok\n"), 0o644)
	}
	return nil // replaced while compiling: left unmarked, compiled by a later start
}

func copyZipFile(f *zip.File, dst string) error {
	r, err := f.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.LimitReader(r, 64<<20))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// pipShim is a pip script running run (a command line) with the script's
// arguments, which adds the offline hint to a failure in a session without
// network. In such a session (QURO_PIP_OFFLINE=1) it first asks the quro
// binary (`quro __pip ARGS…`), which has the server fetch and install
// plain requirements over the in-session socket; its PipFallback status
// (another command, options the server does not take, no socket) runs
// the local pip.
func pipShim(run string) string {
	return "#!/bin/sh\n" +
		"# quro: pip " + PipVersion + " of the session's Python\n" +
		"if [ \"$QURO_PIP_OFFLINE\" = 1 ] && [ -S " + PipStandInSocket + " ] && [ -x " + PipStandIn + " ]; then\n" +
		"\t" + PipStandIn + " __pip \"$@\"\n" +
		"\trc=$?\n" +
		"\t[ $rc -eq " + fmt.Sprint(PipFallback) + " ] || exit $rc\n" +
		"fi\n" +
		"log=\"${TMPDIR:-/tmp}/.quro-pip-$$.log\"\n" +
		"[ -z \"$PIP_LOG\" ] || log=\"$PIP_LOG\" keep=1\n" +
		"PIP_LOG=\"$log\" " + run + " \"$@\"\n" +
		"rc=$?\n" +
		"if [ $rc -ne 0 ] && [ \"$QURO_PIP_OFFLINE\" = 1 ]; then\n" +
		"\techo " + shellQuote(OfflineHint) + " >&2\n" +
		"elif [ $rc -ne 0 ] && [ -z \"$keep\" ] && [ -f \"$log\" ]; then\n" +
		"\tif grep -qE " + shellQuote(unreachableLog) + " \"$log\" 2>/dev/null; then\n" +
		"\t\techo " + shellQuote(UnreachableHint) + " >&2\n" +
		"\telif grep -q 'No matching distribution found' \"$log\" 2>/dev/null; then\n" +
		"\t\techo " + shellQuote(NotOnIndexHint) + " >&2\n" +
		"\tfi\n" +
		"fi\n" +
		"[ -n \"$keep\" ] || rm -f \"$log\"\n" +
		"exit $rc\n"
}

// pickPython is the shell line of a host-userland shim that sets
// quro_py to the interpreter python (a host path in the tree), or to its
// box path under BoxTree when the box shows the tree there (the server's
// boxes show their own server's: BoxPlaces): the interpreter's
// sys.executable and sys.prefix are then box paths. No process is
// started for the choice.
func pickPython(python string) string {
	boxPy := BoxTree + "/bin/" + filepath.Base(python)
	return "quro_py=" + boxPy + "; [ -x " + boxPy + " ] || quro_py=" + shellQuote(python) + "\n"
}

// hostShims are the scripts of the host userland's shims: python3 and
// python exec the embedded interpreter, pip and pip3 run its pip.
func hostShims(python string) (py, pip string) {
	py = "#!/bin/sh\n" + pickPython(python) + "exec \"$quro_py\" \"$@\"\n"
	pip = strings.Replace(pipShim("\"$quro_py\" -m pip"), "#!/bin/sh\n", "#!/bin/sh\n"+pickPython(python), 1)
	return py, pip
}

// writeShims writes the host userland's shims into dir (hostShims).
func writeShims(dir, python, pipDir string) error {
	tmp := dir + ".tmp-" + randomHex(4)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	py, pip := hostShims(python)
	for name, s := range map[string]string{"python3": py, "python": py, "pip": pip, "pip3": pip} {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(s), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, completeMarker), []byte(shimsMarker(python, pipDir)), 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Rename(tmp, dir)
}

func writeAtomic(p string, b []byte, mode os.FileMode) error {
	tmp := p + ".tmp-" + randomHex(4)
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pipMarker is what the complete marker of a pip directory at dir says:
// its layout, and where its rootfs shims think it is.
func pipMarker(dir string) string { return pipLayout + "\n" + dir + "\n" }

// rootfsPipShim is the rootfs's pip shim for the pip directory at final:
// the rootfs's python3 runs pip from its box path BoxPip (a rootfs
// session always has a box), or from final when the box does not show
// it there.
func rootfsPipShim(final string) string {
	pick := "quro_pip=" + BoxPip + "/pip; [ -d \"$quro_pip\" ] || quro_pip=" + shellQuote(filepath.Join(final, "pip")) + "\n"
	return strings.Replace(pipShim(rootfsPython3+" \"$quro_pip\""), "#!/bin/sh\n", "#!/bin/sh\n"+pick, 1)
}

// shimsMarker is what the complete marker of a shim directory says: the
// interpreter and the pip directory its shims run.
// The shims' script is in it: a changed script is written again.
func shimsMarker(python, pipDir string) string {
	py, pip := hostShims(python)
	sum := sha256.Sum256([]byte(py + pip))
	return python + "\n" + pipDir + "\n" + hex.EncodeToString(sum[:8]) + "\n"
}

// writeRootfsShims writes dir/bin/pip and pip3, which run the pip of the
// pip directory at final with a rootfs's python3 (pip/__main__.py puts
// PIPDIR on sys.path: the rootfs's own pip, if it has one, is not used),
// and python and python3, which exec that python3 (the one run_code's
// rootfs worker runs).
// Each is replaced whole (a hard-linked copy of a data directory keeps
// the other's).
func writeRootfsShims(dir, final string) error {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	pip := rootfsPipShim(final)
	py := "#!/bin/sh\nexec " + rootfsPython3 + " \"$@\"\n"
	for n, script := range map[string]string{"pip": pip, "pip3": pip, "python": py, "python3": py} {
		if err := writeAtomic(filepath.Join(bin, n), []byte(script), 0o755); err != nil {
			return err
		}
	}
	return nil
}
