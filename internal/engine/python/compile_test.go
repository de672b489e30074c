//go:build !slim

package python

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCanceledCompileLeavesNoWorker: an interpreter that, like compileall
// -j 0, starts workers holding the output pipe and is then canceled
// mid-way: compileTree returns, and every process of its group is gone.
// Before, only the parent was killed and the call waited on the pipe for
// as long as the workers ran.
func TestCanceledCompileLeavesNoWorker(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "pids")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A stand-in interpreter: two workers in its process group (one of
	// them a grandchild), all holding stdout and stderr, then it reports
	// the pids and waits. It also checks its environment is the fixed one.
	fake := filepath.Join(dir, "python")
	os.WriteFile(fake, []byte(`#!/bin/sh
[ "$QURO_TEST_LEAK" = "" ] || { echo "server environment leaked" > `+fifo+`; exit 99; }
sleep 1000 &
w1=$!
sh -c 'sleep 1000 & echo $! > `+dir+`/w2; wait' &
w0=$!
while [ ! -s `+dir+`/w2 ]; do :; done
echo $$ $w1 $w0 $(cat `+dir+`/w2) > `+fifo+`
wait
`), 0o755)
	t.Setenv("QURO_TEST_LEAK", "x")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- compileTree(ctx, fake, dir, dir, dir, 1, func(string, int64, int64) {}) }()

	f, err := os.Open(fifo) // blocks until the script opens it
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	f.Close()
	if err != nil {
		t.Fatalf("the stand-in did not report its pids: %v", err)
	}
	if strings.Contains(line, "leaked") {
		t.Fatal("the server's environment reached the byte-compile")
	}
	var pidfds []int
	for _, s := range strings.Fields(line) {
		pid, _ := strconv.Atoi(s)
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatalf("pidfd %d: %v", pid, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		pidfds = append(pidfds, fd)
	}
	if len(pidfds) != 4 {
		t.Fatalf("pids %q", line)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("compileTree: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("compileTree did not return after its context was canceled")
	}
	// Each process has ended: its pidfd is readable (no sleep, no polling
	// loop; the bound is only a failure guard).
	for i, fd := range pidfds {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 60_000)
		for errors.Is(err, unix.EINTR) { // a signal to this thread (a child's SIGCHLD), not the exit
			n, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 60_000)
		}
		if err != nil || n != 1 {
			t.Errorf("process %d of the group (%s) survived: %v", i, strings.Fields(line)[i], err)
		}
	}
}

// TestPrecompiledMatchesInterpreter: the committed archive is the one of
// the embedded interpreter, and holds a .pyc for every module compileTree
// would compile. It fails after a go-embed-python upgrade until `make
// stdlib-pyc` is run (the server would still work: it compiles at
// extraction, as before, taking seconds).
func TestPrecompiledMatchesInterpreter(t *testing.T) {
	if precompiledArchive() == nil {
		t.Skip("this platform's build ships no precompiled standard library (only linux/amd64 does): it is compiled at extraction")
	}
	m := mustManifest(t)
	hdr, tr, closeFn, err := openPrecompiled(m, precompiledArchive())
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	_, short := pythonVersion(m)
	if want := compiledModules(m, short); int64(hdr.Files) != want {
		t.Errorf("the archive has %d .pyc files, the standard library %d modules to compile", hdr.Files, want)
	}
	if hdr.Excluded != noCompile.String() {
		t.Errorf("the archive excludes %q, noCompile is %q: run make stdlib-pyc", hdr.Excluded, noCompile.String())
	}
	th, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	if _, err := tr.Read(b); err != nil || b[4] != 1 {
		t.Errorf("%s: flags %v, want 1 (unchecked-hash): %v", th.Name, b[4:8], err)
	}
}

// treeState is every file of a tree with its size and modification time.
func treeState(t *testing.T, dir string) map[string]string {
	t.Helper()
	st := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st[path] = fi.Mode().String() + " " + strconv.FormatInt(fi.Size(), 10) + " " + fi.ModTime().String()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// stdlibImports are modules a session's code commonly imports, beyond the
// interpreter's and the worker's own.
const stdlibImports = "json, email.parser, asyncio, decimal, typing, dataclasses, argparse, http.client, urllib.request, csv, sqlite3, collections, re, datetime, pathlib, subprocess, textwrap, statistics, traceback"

// TestPrecompiledStdlibIsUsed: an interpreter extracted from scratch
// imports the standard library from the shipped .pyc files, without
// compiling or writing anything, even with the sources' times changed
// (unchecked-hash .pyc files do not look at them) and with bytecode writing
// on (no -B, no PYTHONDONTWRITEBYTECODE, a tree it could write: the test
// runs as the tree's owner). With the timestamp .pyc files of before, the
// touched sources were compiled again and their .pyc files rewritten.
func TestPrecompiledStdlibIsUsed(t *testing.T) {
	dir := t.TempDir()
	inst, err := ensureInstalled(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(inst.Dir, "lib", "python3.14")
	later := time.Now().Add(time.Hour)
	for _, name := range []string{"json/decoder.py", "email/parser.py", "decimal.py", "argparse.py", "typing.py"} {
		if err := os.Chtimes(filepath.Join(lib, name), later, later); err != nil {
			t.Fatal(err)
		}
	}
	before := treeState(t, inst.Dir)
	script := "import sys\nimport " + stdlibImports + "\n" +
		"for m in list(sys.modules.values()):\n" +
		"    o = getattr(getattr(m, '__spec__', None), 'origin', None) or ''\n" +
		"    if o.startswith(sys.prefix) and o.endswith('.py'): print(o)\n"
	cmd := exec.Command(inst.Python, "-I", "-v", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, lastLines(stderr.String(), 20))
	}
	origins := strings.Fields(stdout.String())
	if len(origins) < 50 {
		t.Fatalf("only %d standard-library modules from source files: %q", len(origins), origins)
	}
	for _, o := range origins {
		// "# .../__pycache__/decoder.cpython-314.pyc matches .../decoder.py"
		if !strings.Contains(stderr.String(), " matches "+o+"\n") {
			t.Errorf("%s was not loaded from its .pyc", o)
		}
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "# wrote ") || strings.HasPrefix(line, "# could not create") {
			t.Errorf("the import wrote bytecode: %s", line)
		}
	}
	after := treeState(t, inst.Dir)
	for path, st := range after {
		if before[path] != st {
			t.Errorf("the import changed %s: %q, was %q", path, st, before[path])
		}
	}
	for path := range before {
		if _, ok := after[path]; !ok {
			t.Errorf("the import removed %s", path)
		}
	}
}

// precompiledArchiveOf builds an archive with the interpreter's header
// and the given members (a name ending in "@" is a symlink).
func precompiledArchiveOf(t *testing.T, members map[string][]byte) []byte {
	t.Helper()
	m := mustManifest(t)
	var total int64
	for _, b := range members {
		total += int64(len(b))
	}
	hb, _ := json.Marshal(PrecompiledHeader{ContentHash: m.ContentHash, InvalidationMd: invalidation, Files: len(members), Bytes: total})
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: precompiledMeta, Mode: 0o644, Size: int64(len(hb)), Typeflag: tar.TypeReg})
	tw.Write(hb)
	for name, b := range members {
		if n, ok := strings.CutSuffix(name, "@"); ok {
			tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestPrecompiledRejectsStrayMembers: the archive is trusted build input,
// and still each member must be a regular .pyc in a __pycache__ directory
// of the standard library: anything else stops the extraction, and no
// tree is installed from it.
func TestPrecompiledRejectsStrayMembers(t *testing.T) {
	pyc := bytes.Repeat([]byte{1}, 32)
	for _, name := range []string{
		"lib/python3.14/__pycache__/../../../../evil.pyc",
		"/tmp/__pycache__/evil.pyc",
		"lib/python3.14/json/evil.pyc",
		"bin/__pycache__/evil.pyc",
		"lib/python3.14/__pycache__/evil.py",
		"lib/python3.14/__pycache__/evil.pyc@",
	} {
		t.Run(name, func(t *testing.T) {
			archive := precompiledArchiveOf(t, map[string][]byte{name: pyc})
			dir := t.TempDir()
			inst, err := installFrom(context.Background(), dir, func() []byte { return archive }, nil)
			if err == nil || !strings.Contains(err.Error(), "unexpected member") {
				t.Fatalf("installed %+v: %v", inst, err)
			}
			if entries, _ := os.ReadDir(filepath.Join(dir, "python")); len(entries) != 1 || entries[0].Name() != ".lock" {
				t.Errorf("left in the data directory: %v", entries)
			}
		})
	}
	// More bytes than the header says.
	archive := precompiledArchiveOf(t, map[string][]byte{"lib/python3.14/__pycache__/a.cpython-314.pyc": pyc})
	m := mustManifest(t)
	hdr, tr, closeFn, err := openPrecompiled(m, archive)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	hdr.Bytes--
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "lib", "python3.14"), 0o755)
	if _, err := extractPrecompiled(context.Background(), dir, "3.14", hdr, tr, func(int64) {}); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an archive larger than its header: %v", err)
	}
	// Another interpreter's archive is not used.
	hb := precompiledArchiveOf(t, nil)
	m2 := *m
	m2.ContentHash = strings.Repeat("0", 64)
	if _, _, _, err := openPrecompiled(&m2, hb); err == nil || !strings.Contains(err.Error(), "another interpreter build") {
		t.Errorf("another interpreter's archive: %v", err)
	}
}

// TestExtractionWithoutPrecompiled: a build without the archive (or with
// another interpreter's) compiles the standard library at extraction, as
// unchecked-hash .pyc files listed in the marker like the shipped ones.
func TestExtractionWithoutPrecompiled(t *testing.T) {
	dir := t.TempDir()
	compiled := false
	inst, err := installFrom(context.Background(), dir, func() []byte { return nil }, func(stage string, done, total int64) {
		compiled = compiled || (stage == stepCompiling && done == total && total > 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !compiled {
		t.Error("no compiling reported")
	}
	b, err := os.ReadFile(filepath.Join(inst.Dir, completeMarker))
	if err != nil {
		t.Fatal(err)
	}
	var mk markerData
	if err := json.Unmarshal(b, &mk); err != nil {
		t.Fatal(err)
	}
	m := mustManifest(t)
	_, short := pythonVersion(m)
	if int64(len(mk.Pycs)) != compiledModules(m, short) {
		t.Errorf("the marker lists %d .pyc files, want %d", len(mk.Pycs), compiledModules(m, short))
	}
	for _, p := range mk.Pycs {
		h := make([]byte, 8)
		f, err := os.Open(filepath.Join(inst.Dir, p.Name))
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Read(h)
		f.Close()
		if err != nil || h[4] != 1 {
			t.Fatalf("%s: flags %v, want unchecked-hash: %v", p.Name, h[4:], err)
		}
	}
	if err := intact(inst.Dir, m); err != nil {
		t.Fatal(err)
	}
}
