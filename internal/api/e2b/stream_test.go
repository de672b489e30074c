package e2b_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem/filesystemconnect"
	"github.com/quro-dev/quro/internal/api/e2b/gen/process"
)

// TestAccessPathImportsNoDomainPackage: internal/api/e2b reaches the
// domain only through the controller (capability calls). It imports the
// controller, the capability types, the REST error table, runcode's
// context hooks (WithOutput, WithStarted), version and streamcap (the
// access paths' one count of streams per token, not a domain package);
// and, for their types only, internal/app and the packages whose types
// its capabilities' inputs and outputs are made of (workspace, proc): it
// calls capabilities
// with their input structs and reads their outputs as the handlers return
// them (controller.Invoke). The package is type-checked, and every use of
// an identifier declared in such a package must be a type, a constant or a
// field of a struct: never a function, a method (a call on an output
// value, or on an *app.App), nor a variable; and app.App itself is not
// named.
func TestAccessPathImportsNoDomainPackage(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const internal = "github.com/quro-dev/quro/internal/"
	allowed := map[string]bool{"capability": true, "controller": true, "runcode": true, "api/rest": true, "api/streamcap": true, "version": true}
	typesOnly := map[string]bool{"app": true, "workspace": true, "proc": true}
	for _, imp := range pkg.Imports {
		rest, ok := strings.CutPrefix(imp, internal)
		if !ok || allowed[rest] || typesOnly[rest] || strings.HasPrefix(rest, "api/e2b/") {
			continue
		}
		t.Errorf("internal/api/e2b imports %s: an access path calls capabilities through the controller, never a domain package", imp)
	}

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
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range pkg.GoFiles {
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
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	if _, err := conf.Check(pkg.ImportPath, fset, files, info); err != nil {
		t.Fatal(err)
	}
	typeUses := 0
	for id, obj := range info.Uses {
		if obj.Pkg() == nil {
			continue
		}
		rest, ok := strings.CutPrefix(obj.Pkg().Path(), internal)
		if !ok || allowed[rest] || rest == "api/e2b" || strings.HasPrefix(rest, "api/e2b/") {
			continue
		}
		// Any other package of Quro's is the domain's, whether this
		// package imports it or reaches it through a field.
		what := obj.Pkg().Name() + "." + obj.Name()
		if f, ok := obj.(*types.Func); ok {
			if recv := f.Signature().Recv(); recv != nil {
				what = "the method " + obj.Name() + " of " + types.TypeString(recv.Type(), (*types.Package).Name)
			}
		}
		switch o := obj.(type) {
		case *types.TypeName:
			if what == "app.App" {
				t.Errorf("%s: %s: the E2B access path holds no App; it calls capabilities through the controller", fset.Position(id.Pos()), what)
			}
			typeUses++
			continue
		case *types.Const:
			continue
		case *types.Var:
			if o.IsField() {
				continue
			}
		}
		t.Errorf("%s: %s is a %T of a domain package: the E2B access path uses internal/app and the packages of its capabilities' types for their types, constants and fields only; call a capability (invoke) instead",
			fset.Position(id.Pos()), what, obj)
	}
	if typeUses < 20 {
		t.Fatalf("only %d uses of internal/app's types found; the check is broken", typeUses)
	}
}

// The attack: a Keepalive-Ping-Interval so large that seconds of it
// overflow a time.Duration (negative: a timer that fires at once, for
// ever) would have the server flood the stream with keepalives. It is
// capped (3600 s): a quick command sees none.
func TestEnvdKeepaliveIntervalOverflow(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	c := e.procClient(id)
	for _, every := range []string{"10000000000", "9223372036854775807", "99999999999999999999999"} {
		ev := e.start(t, id, bash("read x; echo done", true), map[string]string{"Keepalive-Ping-Interval": every})
		pid := ev.startPid(t)
		if _, err := c.SendInput(context.Background(), connect.NewRequest(&process.SendInputRequest{Process: pidSel(pid),
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("\n")}}})); err != nil {
			t.Fatal(err)
		}
		n := 0
		for e := range ev.c {
			if e.GetKeepalive() != nil {
				n++
			}
		}
		if n != 0 || ev.err != nil {
			t.Errorf("Keepalive-Ping-Interval %s: %d keepalives from a command that ran at once (stream error %v)", every, n, ev.err)
		}
	}
}

// One parser reads Keepalive-Ping-Interval for every envd stream: whole
// seconds, at most an hour, else envd's default (90 s).
func TestKeepaliveInterval(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"": 90 * time.Second, "50": 50 * time.Second, "1": time.Second, "3600": time.Hour, "3601": time.Hour,
		"10000000000": time.Hour, "99999999999999999999999": time.Hour, "0": 90 * time.Second, "-5": 90 * time.Second,
		"x": 90 * time.Second, "1.5": 90 * time.Second,
	} {
		h := http.Header{}
		if in != "" {
			h.Set("Keepalive-Ping-Interval", in)
		}
		if got := e2b.KeepaliveInterval(h); got != want {
			t.Errorf("Keepalive-Ping-Interval %q: %v, want %v", in, got, want)
		}
	}
}

// The end event is the last of a stream: a keepalive due at the moment
// the process ends never follows it (the SDK stops reading at the end).
// Keepalives every millisecond make one due at every end.
func TestEnvdNothingAfterEnd(t *testing.T) {
	old := *e2b.KeepaliveUnit
	*e2b.KeepaliveUnit = time.Millisecond
	t.Cleanup(func() { *e2b.KeepaliveUnit = old })
	e := newEnv(t, nil)
	id := e.newSession(t)
	for range 20 {
		ev := e.start(t, id, bash("echo x", false), map[string]string{"Keepalive-Ping-Interval": "1"})
		ev.startPid(t)
		ev.end(t) // fails on any event after the end
	}
}

// One user check for every envd service, with one message that names
// Quro's version; the user's name is quoted in it, never read as a format
// (a Basic user "%d%s%s" would print "%!d(...)" and leak the version into
// the wrong place).
func TestEnvdUserCheck(t *testing.T) {
	e := newEnv(t, nil)
	id := e.newSession(t)
	const evil = "%d%s%s"
	const want = `user "%d%s%s": a Quro sandbox has one user, "user"`
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte(evil+":"))
	check := func(where string, msg string) {
		t.Helper()
		if !strings.Contains(msg, want) || !strings.Contains(msg, "Quro test ") || strings.Contains(msg, "%!") {
			t.Errorf("%s: %q, want it to quote the user (%q) and name Quro's version", where, msg, want)
		}
	}
	connectMsg := func(where string, err error) string {
		t.Helper()
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated {
			t.Fatalf("%s: %v, want unauthenticated (envd's answer to a user it has not)", where, err)
		}
		check(where, ce.Message())
		return ce.Message()
	}

	r := connect.NewRequest(bash("id", false))
	r.Header().Set("Authorization", basic)
	s, err := e.procClient(id).Start(context.Background(), r)
	if err == nil {
		for s.Receive() {
			t.Fatalf("an event as %q: %v", evil, s.Msg())
		}
		err = s.Err()
	}
	fromProcess := connectMsg("process.Start", err)

	sr := connect.NewRequest(&filesystem.StatRequest{Path: "."})
	sr.Header().Set("Authorization", basic)
	_, err = filesystemconnect.NewFilesystemClient(e.sandboxClient(id, e2b.EnvdPort), e.URL, connect.WithProtoJSON()).Stat(context.Background(), sr)
	if fromFS := connectMsg("filesystem.Stat", err); fromFS != fromProcess {
		t.Errorf("two messages for one check:\nprocess:    %s\nfilesystem: %s", fromProcess, fromFS)
	}

	for name, hdr := range map[string]map[string]string{"Basic user": {"Authorization": basic}, "username": nil} {
		query := "path=."
		if hdr == nil {
			query += "&username=" + url.QueryEscape(evil)
		}
		res, body := e.filesReq(t, id, "GET", query, "", nil, hdr)
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(body, &eb); err != nil || res.StatusCode != http.StatusUnauthorized || eb.Code != http.StatusUnauthorized {
			t.Fatalf("GET /files as %s %q: %d %s", name, evil, res.StatusCode, body)
		}
		check("GET /files ("+name+")", eb.Message)
		if eb.Message != fromProcess {
			t.Errorf("two messages for one check:\nprocess: %s\n/files:  %s", fromProcess, eb.Message)
		}
	}
}
