// Package project creates small, runnable starter projects in a session
// workspace from templates embedded in the binary.
package project

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/quro-dev/quro/internal/workspace"
)

//go:embed templates
var templates embed.FS

// Errors, to test with errors.Is.
var (
	ErrUnknownTemplate = errors.New("unknown template")
	ErrBadName         = errors.New("invalid project name")
	ErrNotEmpty        = errors.New("target exists and is not empty")
)

// Run is one way to run a created project.
type Run struct {
	What       string         `json:"what" jsonschema:"what this runs: the program or its tests"`
	Capability string         `json:"capability" jsonschema:"the capability to call"`
	Args       map[string]any `json:"args" jsonschema:"its arguments"`
	Expect     string         `json:"expect,omitempty" jsonschema:"what the output should contain"`
}

type template struct {
	files []string // the template's files, in order
	// runs says how to run the project in directory n (workspace-relative)
	// whose shell word is abs ("~/'n'": HOME is the workspace, /home/user
	// in a box): terminal commands cd there first, since the terminal's
	// directory is wherever the last command left it.
	runs func(n, abs string) []Run
}

func sh(cmd string) map[string]any { return map[string]any{"command": cmd} }

func hello(name string) string { return "Hello, " + name + "!" }

// quote makes s one word for sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

var byName = map[string]template{
	"python": {runs: func(n, abs string) []Run {
		return []Run{
			{What: "the program", Capability: "terminal_exec", Args: sh("cd " + abs + " && python3 main.py"), Expect: hello(n)},
			{What: "the program, in the session's Python", Capability: "run_code", Args: map[string]any{
				"lang": "python", "code": "import runpy; runpy.run_path('" + n + "/main.py', run_name='__main__')",
			}, Expect: hello(n)},
			{What: "the tests", Capability: "terminal_exec", Args: sh("cd " + abs + " && python3 -m unittest -v"), Expect: "OK"},
		}
	}},
	"node": {runs: func(n, abs string) []Run {
		return []Run{
			{What: "the program, in the embedded JS engine (no node needed)", Capability: "run_js_file", Args: map[string]any{"path": n + "/index.js"}, Expect: hello(n)},
			{What: "the program, with node (where installed)", Capability: "terminal_exec", Args: sh("cd " + abs + " && node index.js"), Expect: hello(n)},
			{What: "the tests", Capability: "run_js_file", Args: map[string]any{"path": n + "/test.js"}, Expect: "ok: greet"},
		}
	}},
	"shell": {runs: func(n, abs string) []Run {
		return []Run{
			{What: "the script", Capability: "terminal_exec", Args: sh("cd " + abs + " && ./run.sh"), Expect: hello(n)},
			{What: "the script with an argument", Capability: "run_code", Args: map[string]any{"lang": "sh", "code": "sh " + n + "/run.sh you"}, Expect: hello("you")},
		}
	}},
}

func init() {
	for name, t := range byName {
		err := fs.WalkDir(templates, "templates/"+name, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				t.files = append(t.files, strings.TrimPrefix(p, "templates/"+name+"/"))
			}
			return err
		})
		if err != nil || len(t.files) == 0 {
			panic(fmt.Sprintf("project template %s: %v", name, err))
		}
		byName[name] = t
	}
}

// Templates lists the template names.
func Templates() []string {
	var out []string
	for name := range byName {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Project describes a created project.
type Project struct {
	Template string   `json:"template"`
	Path     string   `json:"path" jsonschema:"the project's directory, workspace-relative"`
	Files    []string `json:"files" jsonschema:"the files created, workspace-relative"`
	Run      []Run    `json:"run" jsonschema:"how to run it, each a capability call"`
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// CheckName validates a project name: a workspace-relative directory whose
// parts are letters, digits, '.', '_' and '-' (not starting with '.' or
// '-'), so that it can be typed into a shell command unquoted.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: the name is empty", ErrBadName)
	}
	if len(name) > 128 {
		return fmt.Errorf("%w: %q is longer than 128 characters", ErrBadName, name)
	}
	for part := range strings.SplitSeq(name, "/") {
		if !nameRE.MatchString(part) {
			return fmt.Errorf("%w: %q: each part of the path must be letters, digits, '.', '_' or '-', not starting with '.' or '-'", ErrBadName, name)
		}
	}
	return nil
}

// Create makes the project template called name in the workspace, in a new
// directory (or an empty existing one) named name. Files the session may
// run are executable; everything belongs to the workspace's owner.
func Create(w *workspace.FS, tmpl, name string) (*Project, error) {
	t, ok := byName[tmpl]
	if !ok {
		return nil, fmt.Errorf("%w %q: choose one of %s", ErrUnknownTemplate, tmpl, strings.Join(Templates(), ", "))
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	rel, fi, err := w.Stat(name)
	switch {
	case errors.Is(err, workspace.ErrNotFound):
	case err != nil:
		return nil, err
	case !fi.IsDir():
		return nil, fmt.Errorf("%w: %q is a file", ErrNotEmpty, rel)
	default:
		l, err := w.List(rel, workspace.ListOptions{MaxEntries: 1})
		if err != nil {
			return nil, err
		}
		if len(l.Entries) > 0 {
			return nil, fmt.Errorf("%w: %q already holds %s; choose another name, or remove it first", ErrNotEmpty, rel, l.Entries[0].Name)
		}
	}
	if _, err := w.MkdirAll(rel); err != nil {
		return nil, err
	}
	p := &Project{Template: tmpl, Path: rel}
	for _, f := range t.files {
		b, err := templates.ReadFile("templates/" + tmpl + "/" + f)
		if err != nil {
			return nil, err
		}
		mode := fs.FileMode(0o644)
		if strings.HasSuffix(f, ".sh") {
			mode = 0o755
		}
		target := path.Join(rel, f)
		if err := w.WriteNew(target, fill(b, rel), mode); err != nil {
			return nil, err
		}
		p.Files = append(p.Files, target)
	}
	p.Run = t.runs(rel, "~/"+quote(rel))
	return p, nil
}

// InSession puts the session into every run's arguments, so that each call
// runs the project where it was created even when copied by a client whose
// default session is another one (the capabilities' session argument
// defaults to the default session).
func (p *Project) InSession(session string) {
	for i, r := range p.Run {
		args := make(map[string]any, len(r.Args)+1)
		for k, v := range r.Args {
			args[k] = v
		}
		args["session"] = session
		p.Run[i].Args = args
	}
}

// fill puts the project's name into a template file: __NAME__ is the name
// as given, __PKG__ its last part in lower case (an npm package name).
func fill(b []byte, name string) []byte {
	s := strings.ReplaceAll(string(b), "__NAME__", name)
	s = strings.ReplaceAll(s, "__PKG__", strings.ToLower(path.Base(name)))
	return []byte(s)
}
