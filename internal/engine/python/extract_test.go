//go:build !slim

package python

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	// Each extractor's steps: the stages it reached, whole.
	finished := make([]map[string]bool, 2)
	for i := range insts {
		wg.Add(1)
		finished[i] = map[string]bool{}
		go func() {
			defer wg.Done()
			insts[i], errs[i] = ensureInstalled(ctx, dir, func(stage string, done, total int64) {
				if done > total {
					t.Errorf("%s: %d of %d", stage, done, total)
				}
				finished[i][stage] = finished[i][stage] || (done == total && total > 0)
				if stage == stepWaiting {
					finished[i][stage] = true
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
	// What no box loads is not extracted (the shared libpython3.X, its
	// soname and link), the stable ABI's libpython3.so is.
	if m, _ := filepath.Glob(filepath.Join(insts[0].Dir, "lib", "libpython3.1*")); len(m) > 0 {
		t.Errorf("extracted though no box loads it: %v", m)
	}
	if _, err := os.Stat(filepath.Join(insts[0].Dir, "lib", "libpython3.so")); err != nil {
		t.Error(err)
	}
	// The extractor reported the extraction to its end, and no compiling
	// (the standard library ships compiled); the other, if it found the
	// lock held, that it waited, and nothing else.
	for i, inst := range insts {
		switch {
		case inst.Extracted && (!finished[i][stepExtracting] || finished[i][stepCompiling]):
			t.Errorf("extractor's progress: %v", finished[i])
		case !inst.Extracted && (finished[i][stepExtracting] || finished[i][stepCompiling]):
			t.Errorf("the waiter reported work: %v", finished[i])
		}
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
	// Reusing it does not read the precompiled archive out of the binary
	// (a 4.2 MB copy every start paid).
	read := false
	if again, err := installFrom(ctx, dir, func() []byte { read = true; return precompiledArchive() }, nil); err != nil || again.Extracted || read {
		t.Fatalf("an intact tree's reuse read the archive (%v) or extracted: %+v %v", read, again, err)
	}

	// Damage: a missing module, a truncated binary, and a truncated and a
	// missing .pyc (which the interpreter would use without looking at the
	// source: unchecked-hash) are each noticed, one at a time; then, all
	// four at once, one call re-extracts the tree and each is whole again.
	// A damaged tree is re-extracted whole, whatever the damage (intact
	// decides, installFrom extracts), so one re-extraction proves the
	// repair of each; an extraction is seconds of CPU, and four of them
	// proved nothing more.
	lib := filepath.Join(inst.Dir, "lib", "python3.14")
	pyc := filepath.Join(lib, "json", "__pycache__", "decoder.cpython-314.pyc")
	damages := []struct {
		what, path string
		damage     func(string) error
	}{
		{"a missing module", filepath.Join(lib, "json", "decoder.py"), os.Remove},
		{"a truncated binary", inst.Python, func(p string) error { return os.Truncate(p, 10) }},
		{"a truncated .pyc", pyc, func(p string) error { return os.Truncate(p, 20) }},
		{"a missing .pyc", pyc, os.Remove},
	}
	m := mustManifest(t)
	type file struct {
		b    []byte
		mode os.FileMode
	}
	whole := map[string]file{}
	for _, d := range damages {
		b, err := os.ReadFile(d.path)
		fi, err2 := os.Stat(d.path)
		if err != nil || err2 != nil || len(b) < 100 {
			t.Fatalf("%s: %d bytes, %v %v", d.path, len(b), err, err2)
		}
		whole[d.path] = file{b, fi.Mode()}
	}
	for _, d := range damages {
		if err := d.damage(d.path); err != nil {
			t.Fatal(err)
		}
		if err := intact(inst.Dir, m); err == nil || !strings.Contains(err.Error(), filepath.Base(d.path)) {
			t.Errorf("%s: intact says %v", d.what, err)
		}
		f := whole[d.path]
		if err := os.WriteFile(d.path, f.b, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := intact(inst.Dir, m); err != nil {
			t.Fatalf("%s, restored: %v", d.what, err)
		}
	}
	for _, d := range damages { // the .pyc truncated, then removed
		if err := d.damage(d.path); err != nil {
			t.Fatal(err)
		}
	}
	fixed, err := ensureInstalled(ctx, dir, nil)
	if err != nil || !fixed.Extracted {
		t.Fatalf("a damaged tree must be re-extracted: %+v %v", fixed, err)
	}
	for path, f := range whole {
		got, err := os.ReadFile(path)
		fi, err2 := os.Stat(path)
		if err != nil || err2 != nil || !bytes.Equal(got, f.b) || fi.Mode() != f.mode {
			t.Errorf("%s is not whole again: %d bytes of %d, mode %v of %v: %v %v", path, len(got), len(f.b), fi.Mode(), f.mode, err, err2)
		}
	}
}

func mustManifest(t *testing.T) *manifest {
	t.Helper()
	m, err := readManifest()
	if err != nil {
		t.Fatal(err)
	}
	return m
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

// TestExtractionTwoProcesses: two processes (this test binary again) start
// the engine's whole preparation (prepareOnce: the interpreter, pip, the
// shims and the compiled worker module) on one fresh install root at the
// same moment (released together from a pipe), as test processes sharing
// one install root do: the flocks let one extract while the other waits,
// and both then run the interpreter they got, importing from the shipped
// .pyc files, and find the worker module compiled.
func TestExtractionTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	type proc struct {
		cmd  *exec.Cmd
		gate io.WriteCloser
		out  bytes.Buffer
	}
	procs := make([]*proc, 2)
	for i := range procs {
		p := &proc{cmd: exec.Command(os.Args[0], "-test.run=^TestExtractionHelperProcess$", "-test.count=1")}
		p.cmd.Env = append(os.Environ(), "QURO_TEST_EXTRACT_DIR="+dir)
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		var err error
		if p.gate, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = p
	}
	for _, p := range procs {
		p.gate.Close()
	}
	extracted := 0
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v\n%s", i, err, p.out.String())
		}
		if !strings.Contains(p.out.String(), "imported 1\n") {
			t.Fatalf("process %d did not run the interpreter:\n%s", i, p.out.String())
		}
		if strings.Contains(p.out.String(), "extracted true\n") {
			extracted++
		}
	}
	if extracted != 1 {
		t.Fatalf("%d processes extracted:\n%s\n%s", extracted, procs[0].out.String(), procs[1].out.String())
	}
}

// TestExtractionHelperProcess is one process of TestExtractionTwoProcesses
// (it does nothing when run otherwise): it waits for its stdin to close,
// prepares the interpreter in the given directory, and imports a few
// modules with it, bytecode writing on (-v shows the .pyc used).
func TestExtractionHelperProcess(t *testing.T) {
	dir := os.Getenv("QURO_TEST_EXTRACT_DIR")
	if dir == "" {
		t.Skip("a helper of TestExtractionTwoProcesses")
	}
	io.Copy(io.Discard, os.Stdin)
	e := &Embedded{dataDir: dir}
	cfg, inst, err := e.prepareOnce(context.Background(), newPreparation())
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.workerDir, "__pycache__", workerModule+".cpython-*.pyc")); len(m) == 0 {
		t.Fatalf("the worker module in %s is not compiled", cfg.workerDir)
	}
	if _, err := os.Stat(filepath.Join(inst.Dir, "quro-bin", completeMarker)); err != nil {
		t.Fatalf("the shims: %v", err)
	}
	cmd := exec.Command(inst.Python, "-I", "-v", "-c", "import json, decimal, pip; print('imported', json.loads('1'))")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, lastLines(stderr.String(), 10))
	}
	if !strings.Contains(stderr.String(), "decimal.cpython-314.pyc matches") {
		t.Fatalf("decimal not from its .pyc: %s", lastLines(stderr.String(), 10))
	}
	os.Stdout.Write(out)
	if inst.Extracted {
		os.Stdout.WriteString("extracted true\n")
	}
}

// TestCanceledExtraction: the parallel extraction stops when its context
// ends (here at its first progress): the error says so, no tree is
// installed and no temporary one is left behind; the next call extracts.
func TestCanceledExtraction(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := ensureInstalled(ctx, dir, func(stage string, done, total int64) {
		if stage == stepExtracting && done > 0 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled extraction: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "python"))
	if len(entries) != 1 || entries[0].Name() != ".lock" {
		t.Fatalf("left in the data directory: %v", entries)
	}
	inst, err := ensureInstalled(context.Background(), dir, nil)
	if err != nil || !inst.Extracted {
		t.Fatalf("after a canceled extraction: %+v %v", inst, err)
	}
}
