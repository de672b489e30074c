package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python/pythontest"
	"github.com/quro-dev/quro/internal/rootfs"
)

// testPython shares one extracted interpreter between the test data
// directories, as in internal/app's tests.
var testPython = pythontest.Options()

// testRootfs is the ready Debian rootfs that internal/app's tests build
// once per machine ($QURO_TEST_ROOTFS, default /var/cache/quro-test-rootfs),
// or "" when there is none (these tests never install one).
func testRootfs() string {
	dir := os.Getenv("QURO_TEST_ROOTFS")
	if dir == "" {
		dir = "/var/cache/quro-test-rootfs"
	}
	if _, err := exec.LookPath("bwrap"); err != nil || !rootfs.New(dir).Ready(rootfs.DefaultName) {
		return ""
	}
	return dir
}

// dataDir returns a fresh data directory that sees the test rootfs, if any.
func dataDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if rfs := testRootfs(); rfs != "" {
		if err := os.Symlink(rfs, rootfs.DirIn(dir)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newApp(t *testing.T, observers ...controller.Observer) *app.App {
	t.Helper()
	a, err := app.New(context.Background(), dataDir(t), &app.Options{Python: testPython, Observers: observers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// call is one tool call of a plan.
type call struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
}

// plan is what every client (Go over HTTP and stdio, TypeScript over both)
// does: the setup calls, then every listed tool once with its arguments.
type plan struct {
	Setup []call                    `json:"setup"`
	Calls map[string]map[string]any `json:"calls"`
}

// toolCase is how one tool is called and what its result must show.
type toolCase struct {
	args  map[string]any
	check func(o *outcome) error
}

// cases is the table of every capability, keyed by tool name. A capability
// that is registered but missing here fails the tests: add its row.
func cases() (setup []call, table map[string]toolCase) {
	setup = []call{
		{"create_session", map[string]any{"name": "s1"}},
		{"create_session", map[string]any{"name": "doomed"}},
		{"set_session_env", map[string]any{"session": "s1", "env": map[string]any{"QURO_T": "1"}}},
		{"terminal_exec", map[string]any{"session": "s1", "command": `printf 'exports.add = (a, b) => a + b;\n' > mod.js && printf 'console.log("hi from js")\n' > main.js`}},
		{"write_file", map[string]any{"session": "s1", "path": "tomove.txt", "content": "m"}},
		{"write_file", map[string]any{"session": "s1", "path": "toremove.txt", "content": "r"}},
		{"write_file", map[string]any{"session": "s1", "path": "edit.txt", "content": "alpha\nbeta\n"}},
		{"read_screen", map[string]any{"session": "s1"}}, // starts the PTY that send_input types into
		{"snapshot_session", map[string]any{"session": "s1", "name": "snap"}},
		{"snapshot_session", map[string]any{"session": "s1", "name": "gone"}},
	}
	pyRun := toolCase{
		args:  map[string]any{"session": "s1", "code": "print(6*7)"},
		check: field("stdout", "42\n"),
	}
	if testRootfs() == "" {
		// Without a ready rootfs a valid call would start a debootstrap;
		// the call still goes through MCP and comes back as a tool error.
		pyRun = toolCase{
			args:  map[string]any{"session": "s1", "code": "print(6*7)", "timeout_ms": 999},
			check: toolError("invalid_argument"),
		}
	}
	table = map[string]toolCase{
		"call_js_function": {map[string]any{"session": "s1", "path": "mod.js", "function": "add", "args": []any{20, 22}}, text("42")},
		"create_session":   {map[string]any{"name": "fresh"}, field("name", "fresh")},
		"destroy_session":  {map[string]any{"session": "doomed"}, text("destroyed")},
		"export_session_log": {map[string]any{"session": "s1"}, func(o *outcome) error {
			if !strings.HasPrefix(fmt.Sprint(o.Structured["message"]), ".quro/logs/") {
				return fmt.Errorf("message %v", o.Structured["message"])
			}
			return nil
		}},
		"get_service_status": {map[string]any{}, func(o *outcome) error {
			if pid, _ := o.Structured["pid"].(float64); pid <= 0 {
				return fmt.Errorf("pid %v", o.Structured["pid"])
			}
			return nil
		}},
		"get_session_env":    {map[string]any{"session": "s1"}, text("QURO_T=1")},
		"get_session_status": {map[string]any{"session": "s1"}, field("name", "s1")},
		"help":               {map[string]any{}, text("run_code")},
		"list_capabilities": {map[string]any{}, func(o *outcome) error {
			if caps, _ := o.Structured["capabilities"].([]any); len(caps) < 2 {
				return fmt.Errorf("capabilities %v", o.Structured["capabilities"])
			}
			return nil
		}},
		"list_sessions": {map[string]any{}, text(" s1")},
		"python_run":    pyRun,
		"read_screen": {map[string]any{"session": "s1"}, func(o *outcome) error {
			if rows, _ := o.Structured["rows"].(float64); rows <= 0 {
				return fmt.Errorf("rows %v", o.Structured["rows"])
			}
			return nil
		}},
		"reset_python": {map[string]any{"session": "s1"}, text("reset")},
		// Whatever order the table runs in, s1 is paused (or has no box
		// yet) and the next call on it resumes it.
		"pause_session":       {map[string]any{"session": "s1"}, text("session ")},
		"resume_session":      {map[string]any{"session": "s1"}, text("session ")},
		"run_code":            {map[string]any{"session": "s1", "code": "print(6*7)"}, all(text("42"), field("stdout", "42\n"))},
		"run_js_file":         {map[string]any{"session": "s1", "path": "main.js"}, field("stdout", "hi from js\n")},
		"send_input":          {map[string]any{"session": "s1", "data": "echo typed\n"}, text("interactive terminal")},
		"set_default_session": {map[string]any{"session": "s1"}, field("default", "true")},
		"set_session_env":     {map[string]any{"session": "s1", "env": map[string]any{"B": "2"}}, text("B=2")},
		"set_session_timeout": {map[string]any{"session": "s1", "timeout_s": 3600}, text(" expires=")},
		// s1 keeps network none (the other rows need nothing else).
		"set_session_network": {map[string]any{"session": "s1", "network": "none"}, text("network=none")},
		"get_egress_log":      {map[string]any{"session": "s1"}, text("no network connections")},
		"set_session_secret":  {map[string]any{"session": "s1", "name": "API_KEY", "value": "v", "hosts": []string{"api.example.com"}}, text("API_KEY=quro-secret-")},
		"get_preview_url":     {map[string]any{"session": "s1", "port": 8080}, text("/ports/8080/")},
		"list_ports": {map[string]any{"session": "s1"}, func(o *outcome) error {
			if _, ok := o.Structured["ports"].([]any); !ok {
				return fmt.Errorf("ports %v", o.Structured["ports"])
			}
			return nil
		}},
		"terminal_exec": {map[string]any{"session": "s1", "command": "echo $((6*7))"}, all(field("output", "42\n"), field("exit_code", "0"))},
		"read_file":     {map[string]any{"session": "s1", "path": "main.js"}, text("hi from js")},
		// s1 runs on the host userland: the call is refused before apt,
		// and comes back as a tool error (real installs: internal/app).
		"install_packages": {map[string]any{"session": "s1", "packages": []string{"jq"}}, toolError("invalid_argument")},
		"repair_rootfs":    {map[string]any{"rootfs": "none-here"}, toolError("not_found")},
		"write_file":       {map[string]any{"session": "s1", "path": "notes/w.txt", "content": "written"}, field("path", "notes/w.txt")},
		"snapshot_session": {map[string]any{"session": "s1", "name": "snap2"}, text("NOT included: running processes")},
		"fork_session":     {map[string]any{"snapshot": "snap", "name_prefix": "forked"}, text("forked-1")},
		"list_snapshots":   {map[string]any{}, text("snapshot snap ")},
		"delete_snapshot":  {map[string]any{"snapshot": "gone"}, text("deleted")},
		"list_files":       {map[string]any{"session": "s1"}, text("mod.js")},
		"edit_file":        {map[string]any{"session": "s1", "command": "str_replace", "path": "/home/user/edit.txt", "old_str": "beta", "new_str": "gamma"}, all(text("     2\tgamma"), field("path", "edit.txt"))},
		"stat_file":        {map[string]any{"session": "s1", "path": "main.js"}, text("main.js: file -rw-r--r--")},
		"make_dir":         {map[string]any{"session": "s1", "path": "made/dir"}, text("made/dir: dir drwxr-xr-x")},
		"move_file":        {map[string]any{"session": "s1", "source": "tomove.txt", "destination": "moved/m.txt"}, text("moved/m.txt: file")},
		"remove_file":      {map[string]any{"session": "s1", "path": "toremove.txt"}, text("removed toremove.txt")},
		"watch_dir":        {map[string]any{"session": "s1", "timeout_ms": 1}, text("change(s)")},
		"create_project":   {map[string]any{"session": "s1", "template": "shell", "name": "proj"}, text("run.sh")},
		"open_terminal":    {map[string]any{"session": "s1"}, field("open", "true")},
		// Background processes: one that ends within the call; the
		// others name a pid that runs nowhere.
		"start_process":       {map[string]any{"session": "s1", "command": "echo $((6*7))"}, all(field("exit_code", "0"), field("stdout", "42\n"))},
		"connect_process":     {map[string]any{"session": "s1", "pid": 999999}, toolError("not_found")},
		"read_process_output": {map[string]any{"session": "s1", "pid": 999999}, toolError("not_found")},
		"list_processes":      {map[string]any{"session": "s1"}, text("process")},
		"send_process_input":  {map[string]any{"session": "s1", "pid": 999999, "data": "x"}, toolError("not_found")},
		"close_process_stdin": {map[string]any{"session": "s1", "pid": 999999}, toolError("not_found")},
		"signal_process":      {map[string]any{"session": "s1", "pid": 999999, "signal": "SIGKILL"}, toolError("not_found")},
		"resize_process":      {map[string]any{"session": "s1", "pid": 999999, "cols": 80, "rows": 24}, toolError("not_found")},
		// Code contexts (the runs in them: internal/app, internal/api/e2b).
		"create_code_context":  {map[string]any{"session": "s1", "language": "js"}, all(field("language", "javascript"), field("cwd", "/home/user"))},
		"list_code_contexts":   {map[string]any{"session": "s1"}, all(text("python"), text("(default)"))},
		"restart_code_context": {map[string]any{"session": "s1", "id": "no-such-context"}, toolError("not_found")},
		"remove_code_context":  {map[string]any{"session": "s1", "id": "no-such-context"}, toolError("not_found")},
		// Tokens: the plan's caller is the local admin (the operator).
		"create_token": {map[string]any{"tenant": "plan", "scopes": []string{"read"}, "label": "plan"}, all(text("quro_"), field("tenant", "plan"))},
		"list_tokens": {map[string]any{"tenant": "*"}, func(o *outcome) error {
			if _, ok := o.Structured["tokens"].([]any); !ok {
				return fmt.Errorf("tokens %v", o.Structured["tokens"])
			}
			if strings.Contains(o.text(), "quro_") {
				return fmt.Errorf("list_tokens shows a secret: %s", o.text())
			}
			return nil
		}},
		"revoke_token":      {map[string]any{"id": "0123456789ab"}, toolError("not_found")},
		"get_tenant_limits": {map[string]any{}, text("memory")},
		"set_tenant_limits": {map[string]any{"tenant": "plan", "tasks": 64}, text("tasks 64")},
		// No rootfs is built or changed here: a bad name, and one that is
		// not installed, come back as tool errors.
		"install_rootfs":          {map[string]any{"rootfs": "a.b"}, toolError("invalid_argument")},
		"remove_rootfs":           {map[string]any{"rootfs": "none-here"}, toolError("not_found")},
		"install_rootfs_packages": {map[string]any{"rootfs": "none-here", "packages": []string{"jq"}}, toolError("not_found")},
		"get_audit_log": {map[string]any{"limit": 1000}, func(o *outcome) error {
			entries, _ := o.Structured["entries"].([]any)
			for _, e := range entries {
				if m, _ := e.(map[string]any); m["path"] == "mcp" && m["capability"] == "create_session" {
					return nil
				}
			}
			return fmt.Errorf("no create_session entry from mcp in %d entries", len(entries))
		}},
	}
	return setup, table
}

func (p *plan) fromTable(setup []call, table map[string]toolCase) {
	p.Setup = setup
	p.Calls = map[string]map[string]any{}
	for name, c := range table {
		p.Calls[name] = c.args
	}
}

func text(sub string) func(o *outcome) error {
	return func(o *outcome) error {
		if !strings.Contains(o.text(), sub) {
			return fmt.Errorf("text %q does not contain %q", o.text(), sub)
		}
		return nil
	}
}

func field(name, want string) func(o *outcome) error {
	return func(o *outcome) error {
		if got := fmt.Sprint(o.Structured[name]); got != want {
			return fmt.Errorf("structured %s = %q, want %q", name, got, want)
		}
		return nil
	}
}

func all(checks ...func(o *outcome) error) func(o *outcome) error {
	return func(o *outcome) error {
		for _, c := range checks {
			if err := c(o); err != nil {
				return err
			}
		}
		return nil
	}
}

// toolError expects a tool execution error naming code.
func toolError(code string) func(o *outcome) error {
	return func(o *outcome) error {
		if !o.IsError || !strings.Contains(o.text(), "error "+code+":") {
			return fmt.Errorf("want a tool error %s, got isError=%v %q", code, o.IsError, o.text())
		}
		return nil
	}
}

// outcome is a tool result as it came over the wire, whichever client got it.
type outcome struct {
	IsError    bool           `json:"isError"`
	Content    []content      `json:"content"`
	Structured map[string]any `json:"structuredContent"`
	// Protocol is set when the call failed as a protocol error (the
	// TypeScript client reports those instead of a result).
	Protocol string `json:"protocolError"`
}

type content struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	MIMEType string `json:"mimeType"`
	Data     string `json:"data"`
	Resource *struct {
		URI      string `json:"uri"`
		MIMEType string `json:"mimeType"`
		Text     string `json:"text"`
	} `json:"resource"`
}

func (o *outcome) text() string {
	var parts []string
	for _, c := range o.Content {
		if c.Type == "text" {
			parts = append(parts, c.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// listedTool is a tool as tools/list showed it.
type listedTool struct {
	Name         string          `json:"name"`
	OutputSchema json.RawMessage `json:"outputSchema"`
}

// run is what a client saw when it carried out a plan.
type run struct {
	Tools   []listedTool        `json:"tools"`
	Missing []string            `json:"missing"` // listed tools the plan had no arguments for
	Setup   []*outcome          `json:"setup"`
	Results map[string]*outcome `json:"results"`
}

// checkRun checks what a client saw against the registry and the table:
// the tools listed are exactly the registered capabilities, every one has a
// row in the table, and every call's result passes its row's check and
// agrees with the tool's output schema.
func checkRun(t *testing.T, registered []string, r *run) {
	t.Helper()
	_, table := cases()
	var listed []string
	for _, tl := range r.Tools {
		listed = append(listed, tl.Name)
	}
	slices.Sort(listed)
	if !slices.Equal(listed, registered) {
		t.Errorf("tools listed %v\nregistered     %v", listed, registered)
	}
	for _, name := range registered {
		if _, ok := table[name]; !ok {
			t.Errorf("capability %s has no row in the MCP test table (cases in plan_test.go): add one", name)
		}
	}
	if len(r.Missing) > 0 {
		t.Errorf("the client had no arguments for %v", r.Missing)
	}
	for i, o := range r.Setup {
		if o.IsError || o.Protocol != "" {
			t.Errorf("setup call %d failed: %s %s", i, o.Protocol, o.text())
		}
	}
	for _, tl := range r.Tools {
		o, c := r.Results[tl.Name], table[tl.Name]
		if o == nil || c.check == nil {
			if c.check != nil {
				t.Errorf("%s: no result", tl.Name)
			}
			continue
		}
		if o.Protocol != "" {
			t.Errorf("%s: protocol error: %s", tl.Name, o.Protocol)
			continue
		}
		if err := c.check(o); err != nil {
			t.Errorf("%s: %v", tl.Name, err)
		}
		if o.IsError {
			continue
		}
		if o.text() == "" {
			t.Errorf("%s: no text content", tl.Name)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(tl.OutputSchema, &s); err != nil {
			t.Errorf("%s: output schema: %v", tl.Name, err)
			continue
		}
		if s.Type != "object" {
			t.Errorf("%s: output schema root type %q %v, MCP wants object", tl.Name, s.Type, s.Types)
		}
		rs, err := s.Resolve(nil)
		if err != nil {
			t.Errorf("%s: output schema: %v", tl.Name, err)
			continue
		}
		if o.Structured == nil {
			t.Errorf("%s: no structured content", tl.Name)
		} else if err := rs.Validate(o.Structured); err != nil {
			t.Errorf("%s: structured content does not match the output schema: %v", tl.Name, err)
		} else if ss, err := compileStrict(tl.OutputSchema); err != nil {
			t.Errorf("%s: output schema: %v", tl.Name, err)
		} else if err := ss.Validate(o.Structured); err != nil {
			// A second, independent validator, as a strict client has.
			t.Errorf("%s: structured content does not match the output schema (strict validator): %v", tl.Name, err)
		}
	}
}

// pngCode shows an object whose _repr_png_ is a 1×1 PNG built by hand.
const pngCode = `import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
class Dot:
    def _repr_png_(self):
        return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(b'\x00\x00')) + chunk(b'IEND', b''))
Dot()
`
