package main

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The one place that starts and kills processes: a program the server
// runs for itself (a disk tool, a probe of the host's python3,
// debootstrap) goes through sandbox.RunHelper, and user code through the
// sandbox. Starting one any other way loses what those give (a process
// group of its own killed as a whole, a parent-death signal, a bounded
// drain of the output, the box).

// processStarts are the calls and types that start a process outside
// those two, by import path: os/exec's constructors (and a Cmd made by
// hand), and the calls below them.
var processStarts = map[string][]string{
	"os/exec": {"Command", "CommandContext", "Cmd{}"},
	"os":      {"StartProcess"},
	"syscall": {"ForkExec", "StartProcess"},
}

// processStarters are where the module's non-test code may start a
// process directly, by path from the module root (a directory ends in
// "/" and covers what is beneath it), each with why. Every entry must
// still start one: a stale entry fails the test.
var processStarters = map[string]string{
	// The helper runner itself.
	"internal/sandbox/helper.go": "sandbox.RunHelper, the one way the server runs a program of its own",
	// The sandbox's own launch of a box: the one bubblewrap launcher,
	// for one-shot runs and session boxes alike.
	"internal/sandbox/launch.go": "starts bwrap (or, without the box, the init child) for a one-shot run's box or a session's box",
	"internal/sandbox/probe.go":  "starts the box's init to probe the isolation layers",
	// Inside the box.
	"internal/sandbox/boxinit/": "the box's init and spawners: they run inside the box and fork the user's program there",
	// Code that is never part of the server (checked below: no non-test
	// code outside them imports them).
	"internal/rootfs/rootfstest/": "a test helper package (cp -a of the shared test rootfs); only tests import it",
	"internal/k8stest/":           "a test helper package (etcd and kube-apiserver for the tests built with -tags k8s); only tests import it",
	"bench/":                      "measurement programs, main packages of their own that start the quro binary, compilers and node as a user would",
}

// outsideServer are the allowlisted trees whose packages the server must
// never import (their entry in processStarters says why they may start
// processes: they are not the server).
var outsideServer = []string{"internal/rootfs/rootfstest/", "internal/k8stest/", "bench/"}

// TestBypassNoProcessStartOutsideTheHelper scans every non-test Go file
// of the module (whatever its build tags) and fails on a direct process
// start outside processStarters.
func TestBypassNoProcessStartOutsideTheHelper(t *testing.T) {
	root := moduleRoot(t)
	const module = "github.com/quro-dev/quro/"
	fset := gotoken.NewFileSet()
	used := map[string]int{}
	files := 0
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			name := e.Name()
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return fs.SkipDir
			}
			if p != root {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return fs.SkipDir // another module (tools/golangci…)
				}
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		entry := allowedStarter(rel)
		for _, s := range findProcessStarts(fset, f) {
			if entry == "" {
				t.Errorf("%s:%s starts a process directly: run a program of the server's own with sandbox.RunHelper, user code with the sandbox "+
					"(or, if it must, add the file to processStarters with the reason)", rel, s)
				continue
			}
			used[entry]++
		}
		if !slices.ContainsFunc(outsideServer, func(dir string) bool { return strings.HasPrefix(rel, dir) }) {
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, dir := range outsideServer {
					if strings.HasPrefix(path+"/", module+dir) {
						t.Errorf("%s imports %s, which processStarters lets start processes only because the server never imports it", rel, path)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d non-test Go files found under %s; the scan is broken", files, root)
	}
	for entry, why := range processStarters {
		if used[entry] == 0 {
			t.Errorf("processStarters lists %s (%s), which starts no process any more: remove it", entry, why)
		}
	}
}

// allowedStarter is the processStarters entry covering rel, or "".
func allowedStarter(rel string) string {
	for entry := range processStarters {
		if rel == entry || (strings.HasSuffix(entry, "/") && strings.HasPrefix(rel, entry)) {
			return entry
		}
	}
	return ""
}

// findProcessStarts returns the positions (line:column, with what) of
// the process starts in f: the processStarts names used through f's
// imports however they are named; a dot import of one of those packages
// counts as a start, since its uses cannot be told apart here.
func findProcessStarts(fset *gotoken.FileSet, f *ast.File) []string {
	local := map[string]string{} // local name → import path
	var out []string
	at := func(n ast.Node, what string) {
		pos := fset.Position(n.Pos())
		out = append(out, strconv.Itoa(pos.Line)+":"+strconv.Itoa(pos.Column)+": "+what)
	}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if _, ok := processStarts[path]; !ok {
			continue
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		switch name {
		case "_":
			continue
		case ".":
			at(imp, "dot import of "+path)
			continue
		}
		local[name] = path
	}
	if len(local) == 0 {
		return out
	}
	// sel is the import path and name of a selector on an imported
	// package (exec.Command), or "".
	sel := func(x ast.Expr) (string, string) {
		s, ok := x.(*ast.SelectorExpr)
		if !ok {
			return "", ""
		}
		id, ok := s.X.(*ast.Ident)
		if !ok {
			return "", ""
		}
		return local[id.Name], s.Sel.Name
	}
	lits := map[ast.Expr]bool{} // the types of composite literals and new() calls
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			if n.Type != nil {
				lits[n.Type] = true
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 {
				lits[n.Args[0]] = true
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		x, ok := n.(ast.Expr)
		if !ok {
			return true
		}
		path, name := sel(x)
		if path == "" {
			return true
		}
		if lits[x] {
			name += "{}"
		}
		if slices.Contains(processStarts[path], name) {
			at(x, path+"."+name)
		}
		return true
	})
	return out
}

// moduleRoot is the directory of the module's go.mod, above this
// package's directory.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/quro-dev/quro\n") {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod of github.com/quro-dev/quro above the test's directory")
		}
		dir = up
	}
}

// The scan itself finds a start however the package is named, a Cmd made
// by hand, and the calls below os/exec, and nothing else: a check that
// found nothing would otherwise pass unnoticed.
func TestBypassProcessStartScanFindsEveryForm(t *testing.T) {
	src := `package p

import (
	"os"
	x "os/exec"
	"syscall"
	"os/exec"
	. "os/exec"
)

func f() {
	_ = x.Command("a")
	c := exec.CommandContext(nil, "b")
	_ = &exec.Cmd{Path: "c"}
	_ = new(x.Cmd)
	var fn = x.Command
	_, _ = os.StartProcess("d", nil, nil)
	_, _ = syscall.ForkExec("e", nil, nil)
	_ = exec.LookPath
	var cmd *exec.Cmd = c
	_ = cmd
	_ = fn
}
`
	fset := gotoken.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	got := findProcessStarts(fset, f)
	want := []string{
		"8:2: dot import of os/exec",
		"12:6: os/exec.Command",
		"13:7: os/exec.CommandContext",
		"14:7: os/exec.Cmd{}",
		"15:10: os/exec.Cmd{}",
		"16:11: os/exec.Command",
		"17:9: os.StartProcess",
		"18:9: syscall.ForkExec",
	}
	if !slices.Equal(got, want) {
		t.Errorf("found\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
