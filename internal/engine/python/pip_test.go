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
// pip wheel, byte-compiled for 3.14, the .pth that lets `python3 -m pip`
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
	// A pip directory without its marker is extracted again.
	os.Remove(filepath.Join(pip, completeMarker))
	os.RemoveAll(filepath.Join(pip, "pip", "_internal"))
	if _, err := ensureInstalled(ctx, testData, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(host, "python3"), "-m", "pip", "--version").Output(); err != nil || !strings.Contains(string(out), PipVersion) {
		t.Fatalf("pip after repair: %q %v", out, err)
	}
}
