package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	gotoken "go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/creack/pty"
	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/store"
)

// commands returns every runnable command of the CLI, by path ("quro
// token create").
func commands() map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() {
			out[c.CommandPath()] = c
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(strings.NewReader(""), io.Discard, io.Discard))
	return out
}

// annotatedCapabilities are the capabilities cmd says it calls (nil when
// it is local).
func annotatedCapabilities(cmd *cobra.Command) []string {
	v, ok := cmd.Annotations[annCapabilities]
	if !ok {
		return nil
	}
	return strings.Split(v, ",")
}

// TestBypassEveryCommandIsClassified: every runnable command names the
// capabilities it calls through the controller, or says why it needs none
// (it changes nothing, or it is an access path) — not both, not neither —
// and every capability it names exists.
func TestBypassEveryCommandIsClassified(t *testing.T) {
	a, err := app.New(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	reg := a.Controller.Registry()
	cmds := commands()
	if len(cmds) < 30 {
		t.Fatalf("found only %d runnable commands; the walk is broken", len(cmds))
	}
	for path, cmd := range cmds {
		caps, isCaps := cmd.Annotations[annCapabilities]
		reason, isLocal := cmd.Annotations[annLocal]
		switch {
		case isCaps && isLocal:
			t.Errorf("%s is annotated both as calling %q and as local (%q): which is it?", path, caps, reason)
		case !isCaps && !isLocal:
			t.Errorf("%s is not classified: annotate it with the capabilities it calls through the controller (annotate), "+
				"or say why it changes no state (local)", path)
		case isLocal && strings.TrimSpace(reason) == "":
			t.Errorf("%s is local without a reason", path)
		case isCaps:
			for _, name := range strings.Split(caps, ",") {
				if name == "*" && path == "quro call" {
					continue
				}
				if _, ok := reg.Get(name); !ok {
					t.Errorf("%s names capability %q, which is not registered", path, name)
				}
			}
		}
	}
}

// run is one command the audit test runs, and what its audit entries must
// show.
type bypassRun struct {
	args []string
	// calls are the capabilities the run must leave an audit entry for
	// (default: the command's annotation).
	calls []string
	// fails names the error code the run ends with ("": it succeeds);
	// a failed call is audited too.
	fails string
	// check, when set, checks the state the run changed.
	check func(t *testing.T, data, stdout string)
}

// TestBypassStateChangesAreAudited runs, in-process on a fresh data
// directory, every command that names capabilities, and requires an
// audit entry with path "cli" for each of them: a command that is
// annotated but changes state behind the controller's back leaves none.
// A command cannot be added without a row here (the test says so).
func TestBypassStateChangesAreAudited(t *testing.T) {
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	data := t.TempDir()
	var tokenID string
	runs := []bypassRun{
		{args: []string{"token", "create", "--tenant", "acme", "--scopes", "read,exec", "--label", "bypass"},
			check: func(t *testing.T, _, stdout string) {
				tok := strings.TrimSpace(stdout)
				if !strings.HasPrefix(tok, "quro_") {
					t.Fatalf("token create printed %q", stdout)
				}
				tokenID = strings.SplitN(strings.TrimPrefix(tok, "quro_"), "_", 2)[0]
			}},
		{args: []string{"token", "list", "--json"}, check: func(t *testing.T, _, stdout string) {
			if !strings.Contains(stdout, `"tenant":"acme"`) || strings.Contains(stdout, `"token"`) {
				t.Fatalf("token list: %s", stdout)
			}
		}},
		{args: []string{"token", "revoke", "<id>"}},
		{args: []string{"token", "revoke", "0123456789ab"}, fails: "not_found"},
		{args: []string{"tenant", "limits", "set", "--tenant", "acme", "--tasks", "64"}, check: func(t *testing.T, data, _ string) {
			st, err := store.Open(context.Background(), filepath.Join(data, "quro.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if got, err := app.TenantOverrides(context.Background(), st, "acme"); err != nil || got.Tasks != 64 {
				t.Fatalf("acme's ceilings after set: %+v %v", got, err)
			}
		}},
		{args: []string{"tenant", "limits", "set", "--tenant", "acme", "--tasks", "3"}, calls: []string{"set_tenant_limits"}, fails: "invalid_argument"},
		{args: []string{"tenant", "limits", "show", "--tenant", "acme", "--json"}},
		{args: []string{"session", "create", "w1"}},
		{args: []string{"session", "list"}},
		{args: []string{"session", "status", "w1"}},
		{args: []string{"session", "env", "w1", "A=1"}, calls: []string{"set_session_env"}},
		{args: []string{"session", "env", "w1"}, calls: []string{"get_session_env"}},
		{args: []string{"session", "default", "w1"}},
		{args: []string{"session", "pause", "w1"}},
		{args: []string{"session", "resume", "w1"}},
		{args: []string{"session", "snapshot", "--name", "snap", "w1"}},
		{args: []string{"session", "snapshots"}},
		{args: []string{"session", "fork", "--prefix", "f", "snap"}},
		{args: []string{"session", "snapshot-delete", "snap"}},
		{args: []string{"exec", "-s", "w1", "--", "true"}},
		{args: []string{"run", "--lang", "sh", "-s", "w1", "-c", "echo hi"}},
		{args: []string{"call", "set_session_env", `{"session":"w1","env":{"B":"2"}}`}, calls: []string{"set_session_env"}},
		{args: []string{"session", "destroy", "f-1"}},
		{args: []string{"audit", "-n", "1"}},
		// The rootfs commands change a rootfs every session on it shares:
		// each fails fast here (no rootfs is installed, or the name is
		// bad), and the failed call is audited like any other.
		{args: []string{"rootfs", "install", "a.b"}, fails: "invalid_argument"},
		{args: []string{"rootfs", "remove", "nope"}, fails: "not_found"},
		{args: []string{"rootfs", "install-packages", "nope", "jq"}, fails: "not_found"},
		{args: []string{"rootfs", "repair", "nope"}, fails: "not_found"},
	}
	covered := map[string]bool{"quro term": true} // TestTermInProcessIsAudited
	cmds := commands()
	for _, r := range runs {
		args := slices.Clone(r.args)
		for i, a := range args {
			if a == "<id>" {
				args[i] = tokenID
			}
		}
		cmd, _, err := newRoot(nil, io.Discard, io.Discard).Find(args)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		path := cmd.CommandPath()
		covered[path] = true
		calls := r.calls
		if calls == nil {
			calls = annotatedCapabilities(cmds[path])
		}
		before := lastSeq(t, data)
		out, errs, code := quro(t, "", append([]string{"--data", data}, args...)...)
		if r.fails == "" && code != 0 {
			t.Errorf("%s: exit %d: %s", strings.Join(args, " "), code, errs)
			continue
		}
		if r.fails != "" && (code == 0 || !strings.Contains(errs, r.fails)) {
			t.Errorf("%s: want a %s error, got exit %d: %s", strings.Join(args, " "), r.fails, code, errs)
			continue
		}
		entries := auditSince(t, data, before)
		for _, name := range calls {
			i := slices.IndexFunc(entries, func(e store.AuditEntry) bool { return e.Capability == name && e.Path == "cli" })
			if i < 0 {
				t.Errorf("%s called %s without an audit entry (path cli): it bypasses the controller; entries: %+v",
					strings.Join(args, " "), name, entries)
				continue
			}
			if want := r.fails; want != "" && entries[i].Outcome != want && name == calls[len(calls)-1] {
				t.Errorf("%s: audited outcome %q, want %q", strings.Join(args, " "), entries[i].Outcome, want)
			}
		}
		if r.check != nil && !t.Failed() {
			r.check(t, data, out)
		}
	}
	for path, cmd := range cmds {
		if _, ok := cmd.Annotations[annCapabilities]; ok && !covered[path] {
			t.Errorf("%s calls capabilities but is not run by this test: add a row", path)
		}
	}
}

// TestTermInProcessIsAudited: quro term without a server opens the
// terminal through open_terminal (audited, path cli), on a real PTY as its
// standard input; Ctrl-] detaches.
func TestTermInProcessIsAudited(t *testing.T) {
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	data := t.TempDir()
	ptm, pts, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptm.Close()
	go io.Copy(io.Discard, ptm) // nothing is written to the tty, but keep it drained
	banner := newWatch("[quro: session")
	var out bytes.Buffer
	root := newRoot(pts, &out, banner)
	root.SetArgs([]string{"term", "--data", data})
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()
	select {
	case <-banner.seen:
	case err := <-done:
		t.Fatalf("quro term ended before attaching: %v; stderr %s", err, banner.String())
	}
	if _, err := ptm.Write([]byte{detachKey}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("quro term: %v; stderr %s", err, banner.String())
	}
	pts.Close()
	entries := auditSince(t, data, 0)
	if !slices.ContainsFunc(entries, func(e store.AuditEntry) bool {
		return e.Capability == "open_terminal" && e.Path == "cli" && e.Outcome == "ok"
	}) {
		t.Fatalf("quro term left no open_terminal entry: %+v", entries)
	}
}

// watch is a writer that closes seen once what it was written contains
// want.
type watch struct {
	mu   sync.Mutex
	b    bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newWatch(want string) *watch { return &watch{want: want, seen: make(chan struct{})} }

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Contains(w.b.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// lastSeq is the sequence number of the local tenant's latest audit
// entry (0: none).
func lastSeq(t *testing.T, data string) int64 {
	t.Helper()
	e := auditSince(t, data, 0)
	if len(e) == 0 {
		return 0
	}
	return e[len(e)-1].Seq
}

// auditSince reads the local tenant's audit entries after seq from the
// store itself.
func auditSince(t *testing.T, data string, seq int64) []store.AuditEntry {
	t.Helper()
	db := filepath.Join(data, "quro.db")
	if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	st, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	all, err := st.Audit(context.Background(), store.AuditFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var out []store.AuditEntry
	for _, e := range all {
		if e.Seq > seq {
			out = append(out, e)
		}
	}
	return out
}

// parts are the types below the controller: a command that reaches one
// changes state unaudited. Only an access path's wiring (serve.go) may
// hold them; rootfs.Manager is read (status) where named in partReads.
var parts = map[string]bool{
	"github.com/quro-dev/quro/internal/store.Store":            true,
	"github.com/quro-dev/quro/internal/session.Manager":        true,
	"github.com/quro-dev/quro/internal/auth.Tokens":            true,
	"github.com/quro-dev/quro/internal/terminal.Manager":       true,
	"github.com/quro-dev/quro/internal/sandbox.Sandbox":        true,
	"github.com/quro-dev/quro/internal/runcode.Runner":         true,
	"github.com/quro-dev/quro/internal/engine/python.Embedded": true,
	"github.com/quro-dev/quro/internal/rootfs.Manager":         true,
	"github.com/quro-dev/quro/internal/rootfs.Apt":             true,
	"github.com/quro-dev/quro/internal/quota.Disks":            true,
	"github.com/quro-dev/quro/internal/workspace.FS":           true,
}

// partReads are the methods of parts that only read.
var partReads = map[string]bool{
	"rootfs.Manager.Status": true, "rootfs.Manager.List": true, "rootfs.Manager.Ready": true,
	"rootfs.Manager.Path": true, "rootfs.Manager.Info": true, "rootfs.Manager.Dir": true,
	"quota.Disks.Enforced": true, "quota.Disks.Method": true, "quota.Disks.Has": true, "quota.Disks.Usage": true, "quota.Disks.Note": true,
	// Not a read, but no session's state either: doctor's check undoes
	// what its own quota.Open mounted (the shared filesystem, the bind).
	"quota.Disks.Close": true,
	// E2B's sandbox plane looks a sandbox's tenant up, and the owners of
	// every sandbox for a signed URL that names none (serve_e2b.go).
	"session.Manager.ByIDAnyTenant": true, "session.Manager.Owners": true,
	// A cluster node publishes the sessions it holds, every tenant's, to
	// the Kubernetes API (servecluster.go).
	"session.Manager.AllTenants": true,
}

// appUses are the members of app.App a command may use, by file ("*":
// any file): the controller and what only reads or runs the process.
var appUses = map[string]map[string]bool{
	"*": {"Controller": true, "Close": true, "DataDir": true, "Log": true, "Started": true, "Status": true, "Supervise": true},
	// The server wires its access paths: the token check, the WebSocket
	// terminal and the take-over of a shell (after the controller resolved
	// the session), the live events the controller publishes, the tokens of
	// --tokens-file (a cluster's shared Secret), metrics (the
	// in-session sockets' connection counts among them) and the log line.
	// A server that is no cluster node keeps the tenants' ceilings in its
	// store (UseStoreTenantLimits drops a former node's mark).
	"serve.go": {"Sessions": true, "Authenticate": true, "EnsureAdminToken": true, "ImportTokens": true, "OpenPTY": true, "Events": true, "TakeShell": true, "HandBackShell": true, "Metrics": true, "Sandbox": true, "PreparePython": true, "InSession": true, "UseStoreTenantLimits": true},
	// A cluster node lists the sessions it holds (to publish them), and
	// moves them to other nodes when drained (app.Mover: the session's
	// life owner quiesces and releases; no caller's call, the operator's
	// token on the drain route and the cluster's key on the move route),
	// and records each drain and move in the audit log (AuditAction: an
	// entry, no state changed). The tenants' ceilings are the cluster's:
	// the app's tenant-limit layer reads and writes them through the
	// cluster (UseTenantLimitsSource; set_tenant_limits stays the one way
	// to set them), applies another node's change (TenantLimitsChanged)
	// and gives placement a tenant's session ceiling (TenantOwnLimits, a
	// read).
	"servecluster.go": {"Sessions": true, "Mover": true, "AuditAction": true, "UseTenantLimitsSource": true, "TenantLimitsChanged": true, "TenantOwnLimits": true},
	// quro term attaches to the PTY open_terminal started.
	"term.go": {"OpenPTY": true},
	// The E2B access path's wiring: API keys are tokens (and an access
	// token lives as long as the key that obtained it), a sandbox's tenant
	// comes from its session.
	"serve_e2b.go": {"Sessions": true, "VerifyToken": true, "LiveToken": true, "LiveTokenIDs": true},
}

// TestBypassNoPartsOutsideTheController type-checks the CLI's own code
// and fails on a use of a part below the controller (the store, the
// session or terminal manager, the token table, the sandbox, the rootfs
// manager's changes…) or of an App member other than the controller,
// outside the access paths' wiring in serve.go.
func TestBypassNoPartsOutsideTheController(t *testing.T) {
	// -trimpath, as make build and make test compile: the export data is
	// then the build cache's. Without it, go list compiled every package
	// of the module again in a fresh clone (the cache key of an untrimmed
	// package holds its directory): 183 s at a load of 37 on 2 cores, which
	// this serial test held every other test of its package behind.
	out, err := exec.Command("go", "list", "-trimpath", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	export := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if p, f, ok := strings.Cut(l, "="); ok && f != "" {
			export[p] = f
		}
	}
	fset := gotoken.NewFileSet()
	names, _ := filepath.Glob("*.go")
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		// The files of this build only (serve_python_slim.go is -tags slim's).
		if ok, err := build.Default.MatchFile(".", n); err != nil || !ok {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := export[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	if _, err := conf.Check("main", fset, files, info); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for sel, s := range info.Selections {
		recv := s.Recv()
		if p, ok := recv.(*types.Pointer); ok {
			recv = p.Elem()
		}
		named, ok := recv.(*types.Named)
		if !ok || named.Obj().Pkg() == nil {
			continue
		}
		typ := named.Obj().Pkg().Path() + "." + named.Obj().Name()
		pos := fset.Position(sel.Pos())
		file := filepath.Base(pos.Filename)
		member := s.Obj().Name()
		switch {
		case typ == "github.com/quro-dev/quro/internal/app.App":
			checked++
			if !appUses["*"][member] && !appUses[file][member] {
				t.Errorf("%s: App.%s reaches a part below the controller: call a capability through the backend (Controller.Call) instead", pos, member)
			}
		case parts[typ]:
			checked++
			short := named.Obj().Pkg().Name() + "." + named.Obj().Name() + "." + member
			if file != "serve.go" && !partReads[short] {
				t.Errorf("%s: %s changes state behind the controller: call a capability instead", pos, short)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d uses of App and its parts found; the check is broken", checked)
	}
}
