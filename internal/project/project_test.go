package project

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/workspace"
)

func open(t *testing.T) (*workspace.FS, string) {
	t.Helper()
	dir := t.TempDir()
	w, err := workspace.Open(dir, workspace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, dir
}

func TestCreate(t *testing.T) {
	w, dir := open(t)
	want := map[string][]string{
		"python": {"README.md", "main.py", "test_main.py"},
		"node":   {"README.md", "greet.js", "index.js", "package.json", "test.js"},
		"shell":  {"README.md", "run.sh"},
	}
	if got := strings.Join(Templates(), ","); got != "node,python,shell" {
		t.Fatalf("templates %s", got)
	}
	for tmpl, files := range want {
		name := "apps/My-" + tmpl
		p, err := Create(w, tmpl, name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Path != name || len(p.Files) != len(files) || len(p.Run) == 0 {
			t.Fatalf("%+v", p)
		}
		for i, f := range files {
			if p.Files[i] != name+"/"+f {
				t.Errorf("file %d: %s, want %s", i, p.Files[i], f)
			}
			b, err := os.ReadFile(filepath.Join(dir, name, f))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "__NAME__") || strings.Contains(string(b), "__PKG__") {
				t.Errorf("%s/%s: placeholder left: %s", name, f, b)
			}
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, "apps/My-shell/run.sh")); fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh mode %v", fi.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "apps/My-node/package.json")); !strings.Contains(string(b), `"name": "my-node"`) {
		t.Errorf("package.json: %s", b)
	}
	// An empty existing directory is fine.
	os.Mkdir(filepath.Join(dir, "empty"), 0o755)
	if _, err := Create(w, "shell", "empty"); err != nil {
		t.Fatal(err)
	}
}

func TestCreateRefusals(t *testing.T) {
	w, dir := open(t)
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(dir, "out"))
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(dir, "full/x"), 0o755)
	for _, tc := range []struct {
		tmpl, name string
		err        error
		msg        string
	}{
		{"cobol", "p", ErrUnknownTemplate, "choose one of node, python, shell"},
		{"python", "", ErrBadName, "empty"},
		{"python", "../p", ErrBadName, "each part"},
		{"python", "/etc/p", ErrBadName, "each part"},
		{"python", "a b", ErrBadName, "each part"},
		{"python", ".hidden", ErrBadName, "each part"},
		{"python", "-rf", ErrBadName, "each part"},
		{"python", "p;rm", ErrBadName, "each part"},
		{"python", strings.Repeat("p", 129), ErrBadName, "longer than 128"},
		{"python", "full", ErrNotEmpty, `"full" already holds x`},
		{"python", "file", ErrNotEmpty, `"file" is a file`},
		{"python", "out/p", workspace.ErrOutside, "symbolic link"},
		{"python", "file/p", workspace.ErrNotDir, "not a directory"},
	} {
		_, err := Create(w, tc.tmpl, tc.name)
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Create(%q, %q): %v, want %v saying %q", tc.tmpl, tc.name, err, tc.err, tc.msg)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("created outside: %v", ents)
	}
}

// The runs name the session they were created in, without touching the
// template's own argument maps (shared by every Create).
func TestInSession(t *testing.T) {
	w, _ := open(t)
	p, err := Create(w, "node", "n")
	if err != nil {
		t.Fatal(err)
	}
	p.InSession("s-1")
	for _, r := range p.Run {
		if r.Args["session"] != "s-1" {
			t.Fatalf("%+v", r)
		}
	}
	q, err := Create(w, "node", "m")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range q.Run {
		if _, ok := r.Args["session"]; ok {
			t.Fatalf("a fresh project inherited a session: %+v", r)
		}
	}
}
