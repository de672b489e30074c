//go:build !slim

package python

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPipExtracted: preparing the interpreter also extracts the checked
// pip wheel (byte-compiled for 3.14 by compilePip, later), the .pth that lets `python3 -m pip`
// find it, and the shims (python3 is the embedded interpreter, pip its
// pip); a damaged pip directory is extracted again.
func TestPipExtracted(t *testing.T) {
	if err := checkPipWheel(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inst, err := ensureInstalled(ctx, testData, nil)
	if err != nil {
		t.Fatal(err)
	}
	pip := PipDir(testData)
	// Compiled after the preparation, in place (compilePip).
	if err := compilePip(ctx, inst, pip); err != nil || !pipCompiled(pip) {
		t.Fatalf("compiling pip: %v", err)
	}
	if _, err := os.Stat(filepath.Join(pip, "pip", "__pycache__", "__init__.cpython-314.pyc")); err != nil {
		t.Fatalf("pip not byte-compiled for 3.14: %v", err)
	}
	host, rootfsBin := ShimDirs(testData)
	out, err := exec.Command(filepath.Join(host, "python3"), "-c", "import sys; print(sys.executable)").Output()
	if err != nil || strings.TrimSpace(string(out)) != inst.Python {
		t.Fatalf("python3 shim: %q %v, want %s", out, err, inst.Python)
	}
	out, err = exec.Command(filepath.Join(host, "pip"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "pip "+PipVersion+" from "+filepath.Join(pip, "pip")) {
		t.Fatalf("pip shim: %q %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(rootfsBin, "pip3")); err != nil {
		t.Fatal(err)
	}
	// A pip directory without its marker is extracted again. The damage
	// is done to a copy of the data directory's python (a copy is
	// prepared in place, TestPipFollowsAMovedDataDir): the package's own
	// pip, damaged, had to be compiled again for the tests after this
	// one, two compileall runs (some 4 CPU-s) that check nothing.
	moved := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(testData, "python"), filepath.Join(moved, "python")).CombinedOutput(); err != nil {
		t.Fatalf("copying the data directory's python: %v %s", err, out)
	}
	os.Remove(filepath.Join(moved, "python", ".lock"))
	pip = PipDir(moved)
	os.Remove(filepath.Join(pip, completeMarker))
	os.RemoveAll(filepath.Join(pip, "pip", "_internal"))
	if _, err := ensureInstalled(ctx, moved, nil); err != nil {
		t.Fatal(err)
	}
	// The preparation does not compile pip: the first run does not wait
	// for it.
	if pipCompiled(pip) {
		t.Error("pip was compiled on the preparation's path")
	}
	host, _ = ShimDirs(moved)
	if out, err := exec.Command(filepath.Join(host, "python3"), "-m", "pip", "--version").Output(); err != nil || !strings.Contains(string(out), PipVersion) || !strings.Contains(string(out), pip) {
		t.Fatalf("pip after repair: %q %v", out, err)
	}
}

// TestPipFollowsAMovedDataDir: a data directory copied elsewhere (moved,
// restored from a backup) has shims and a .pth naming the old place, which
// a box does not show: preparing it writes them again for the new one.
func TestPipFollowsAMovedDataDir(t *testing.T) {
	ctx := context.Background()
	if _, err := ensureInstalled(ctx, testData, nil); err != nil {
		t.Fatal(err)
	}
	moved := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(testData, "python"), filepath.Join(moved, "python")).CombinedOutput(); err != nil {
		t.Fatalf("copying the data directory's python: %v %s", err, out)
	}
	os.Remove(filepath.Join(moved, "python", ".lock"))
	pipInit := filepath.Join(PipDir(moved), "pip", "__init__.py")
	before, err := os.Stat(pipInit)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := ensureInstalled(ctx, moved, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.Python, moved) {
		t.Fatalf("the interpreter of the copy is %s", inst.Python)
	}
	host, rootfsBin := ShimDirs(moved)
	for _, f := range []string{filepath.Join(host, "python3"), filepath.Join(host, "pip"), filepath.Join(rootfsBin, "pip")} {
		b, err := os.ReadFile(f)
		if err != nil || strings.Contains(string(b), testData) || !strings.Contains(string(b), moved) {
			t.Errorf("%s still names the old place (or not the new one): %v\n%s", f, err, b)
		}
	}
	// Only what names the place is written again, not pip itself.
	if after, err := os.Stat(pipInit); err != nil || !os.SameFile(before, after) {
		t.Errorf("pip was extracted again for the copy: %v", err)
	}
	out, err := exec.Command(filepath.Join(host, "python3"), "-c", "import pip, sys; print(sys.executable); print(pip.__file__)").Output()
	if err != nil || !strings.HasPrefix(string(out), inst.Python+"\n"+PipDir(moved)) {
		t.Fatalf("the copy's python3 and pip: %q %v", out, err)
	}
}
