//go:build !slim

package python

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestExtraction(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()

	// Two extractors at once (separate flock descriptions, as two quro
	// processes would have): one extracts, the other waits and reuses.
	var wg sync.WaitGroup
	insts := make([]*installation, 2)
	errs := make([]error, 2)
	var progressed bool
	for i := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			insts[i], errs[i] = ensureInstalled(ctx, dir, func(done, total int64) {
				if done == total && total > 0 {
					progressed = true
				}
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if insts[0].Extracted == insts[1].Extracted || insts[0].Dir != insts[1].Dir {
		t.Fatalf("want exactly one extraction into one tree: %+v %+v", insts[0], insts[1])
	}
	if !progressed {
		t.Error("no progress reported")
	}
	inst := insts[0]
	if fi, err := os.Lstat(filepath.Join(inst.Dir, "bin", "python3")); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("bin/python3 should stay a symlink: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(inst.Dir, "lib", "python3.14", "__pycache__", "traceback.cpython-314.pyc")); err != nil {
		t.Errorf("the standard library is not byte-compiled: %v", err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, "python", ".extract-*")); len(leftovers) > 0 {
		t.Errorf("temporary trees left: %v", leftovers)
	}

	again, err := ensureInstalled(ctx, dir, nil)
	if err != nil || again.Extracted {
		t.Fatalf("an intact tree must be reused: %+v %v", again, err)
	}

	// Damage: a missing module and a truncated binary are both noticed.
	os.Remove(filepath.Join(inst.Dir, "lib", "python3.14", "json", "decoder.py"))
	fixed, err := ensureInstalled(ctx, dir, nil)
	if err != nil || !fixed.Extracted {
		t.Fatalf("a damaged tree must be re-extracted: %+v %v", fixed, err)
	}
	if _, err := os.Stat(filepath.Join(inst.Dir, "lib", "python3.14", "json", "decoder.py")); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(inst.Python, 10); err != nil {
		t.Fatal(err)
	}
	fixed, err = ensureInstalled(ctx, dir, nil)
	if err != nil || !fixed.Extracted {
		t.Fatalf("a truncated binary must be re-extracted: %+v %v", fixed, err)
	}
}

func TestPythonVersion(t *testing.T) {
	m, err := readManifest()
	if err != nil {
		t.Fatal(err)
	}
	full, short := pythonVersion(m)
	if short != "3.14" || full != "3.14.6" {
		t.Fatalf("version %q %q", full, short)
	}
}
