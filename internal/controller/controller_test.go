package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/boxfs"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/proc"
	"github.com/quro-dev/quro/internal/project"
	"github.com/quro-dev/quro/internal/quota"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/terminal"
	"github.com/quro-dev/quro/internal/workspace"
)

type empty struct{}

type fails struct {
	Kind string `json:"kind"`
}

func newRegistry(t *testing.T, extra ...*capability.Capability) *capability.Registry {
	t.Helper()
	reg := capability.NewRegistry()
	reg.Register(capability.New("peek", "read something", capability.ScopeRead, func(ctx context.Context, in empty) (*controller.Reply, error) {
		c, _ := controller.CallerFrom(ctx)
		return &controller.Reply{Text: c.Tenant}, nil
	}))
	reg.Register(capability.New("destroy", "admin only", capability.ScopeAdmin, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	reg.Register(capability.New("install", "install only", capability.ScopeInstall, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	for _, c := range extra {
		reg.Register(c)
	}
	return reg
}

func code(t *testing.T, err error) capability.Code {
	t.Helper()
	if err == nil {
		return ""
	}
	var ce *capability.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%v (%T) is not a *capability.Error", err, err)
	}
	return ce.Code
}

func TestScope(t *testing.T) {
	ctl := controller.New(newRegistry(t), nil)
	ctx := context.Background()
	for _, tc := range []struct {
		scope capability.Scope
		name  string
		want  capability.Code
	}{
		{capability.ScopeRead, "peek", ""},
		{capability.ScopeRead, "destroy", capability.PermissionDenied},
		{capability.ScopeRead, "install", capability.PermissionDenied},
		{capability.ScopeExec, "peek", ""},
		{capability.ScopeExec, "destroy", capability.PermissionDenied},
		{capability.ScopeExec, "install", capability.PermissionDenied},
		{capability.ScopeInstall, "install", ""},
		{"exec,install", "install", ""},
		{capability.ScopeAdmin, "destroy", ""},
		{capability.ScopeAdmin, "install", ""},
		{"", "peek", capability.PermissionDenied},
		{capability.ScopeAdmin, "no_such_capability", capability.NotFound},
	} {
		_, err := ctl.Call(ctx, controller.Caller{Path: "rest", Scope: tc.scope}, tc.name, nil)
		if got := code(t, err); got != tc.want {
			t.Errorf("scope %q calling %s: got %q (%v), want %q", tc.scope, tc.name, got, err, tc.want)
		}
		if tc.want == capability.PermissionDenied && !strings.Contains(err.Error(), "needs scope") {
			t.Errorf("scope %q calling %s: %v does not say which scope it needs", tc.scope, tc.name, err)
		}
	}
	// The handler sees its caller.
	reply, err := ctl.Call(ctx, controller.Caller{Tenant: "alice", Scope: capability.ScopeRead}, "peek", nil)
	if err != nil || reply.Output.(*controller.Reply).Text != "alice" {
		t.Errorf("CallerFrom in the handler: %+v %v", reply, err)
	}
}

// runsCode marks c as a capability that runs code (capability.RunsCode),
// as internal/app's hints table does.
func runsCode(c *capability.Capability) *capability.Capability {
	c.Hints = capability.Hints{Destructive: true, OpenWorld: true}
	return c
}

// TestRunsPerTenant: a tenant at its limit of calls running code in
// flight is refused with ResourceExhausted, a Retry-After and a message
// naming the limit, its count and how to raise it; others are not; a
// finished call frees its place; read calls, and exec calls that run no
// code (a file write, a kill), are never refused for lack of a slot.
func TestRunsPerTenant(t *testing.T) {
	entered := make(chan string)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	hold := runsCode(capability.New("hold", "runs until released", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		c, _ := controller.CallerFrom(ctx)
		entered <- c.Tenant
		<-release
		return &controller.Reply{}, nil
	}))
	quick := runsCode(capability.New("quick", "runs at once", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	// write and kill need exec but run no code (hints: overwrites).
	write := capability.New("write", "writes a file", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	})
	write.Hints = capability.Hints{Destructive: true}
	kill := capability.New("kill", "kills", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	})
	kill.Hints = capability.Hints{Destructive: true}
	ctl := controller.New(newRegistry(t, hold, quick, write, kill), &controller.Options{Limits: controller.Limits{RunsPerTenant: 2,
		Raise: "the operator raises it with quro serve --runs-per-tenant"}})
	ctx := context.Background()
	alice := controller.Caller{Path: "rest", Tenant: "alice", Scope: capability.ScopeExec}
	bob := controller.Caller{Path: "mcp", Tenant: "bob", Scope: capability.ScopeExec}

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ctl.Call(ctx, alice, "hold", nil)
			errs <- err
		}()
		<-entered
	}
	if n := ctl.RunsInFlight("alice"); n != 2 {
		t.Errorf("RunsInFlight(alice) = %d, want 2", n)
	}
	_, err := ctl.Call(ctx, alice, "quick", nil)
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.ResourceExhausted || ce.RetryAfter <= 0 {
		t.Fatalf("a third call of alice: %#v, want resource_exhausted with a Retry-After", err)
	}
	for _, want := range []string{"runs in flight", "tenant alice", "already has 2", "its limit is 2", "quro serve --runs-per-tenant"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the refusal %q does not say %q", ce.Message, want)
		}
	}
	if _, err := ctl.Call(ctx, bob, "quick", nil); err != nil {
		t.Errorf("bob is refused because of alice: %v", err)
	}
	for _, name := range []string{"peek", "write", "kill"} {
		if _, err := ctl.Call(ctx, alice, name, nil); err != nil {
			t.Errorf("%s of alice at her run limit: %v", name, err)
		}
	}
	free()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a held call: %v", err)
		}
	}
	for range 3 {
		if _, err := ctl.Call(ctx, alice, "quick", nil); err != nil {
			t.Fatalf("alice after her calls finished: %v", err)
		}
	}
	if n := ctl.RunsInFlight("alice"); n != 0 {
		t.Errorf("RunsInFlight(alice) after every call = %d", n)
	}
}

// TestRunSlotDone: a call that goes on to only follow (a started
// background process) frees its run slot then, while it still streams;
// the tenant runs another call at once.
func TestRunSlotDone(t *testing.T) {
	following := make(chan struct{})
	stop := make(chan struct{})
	follow := runsCode(capability.New("follow", "starts, then follows", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		controller.RunSlotDone(ctx)
		controller.RunSlotDone(ctx) // twice frees one slot
		following <- struct{}{}
		<-stop
		return &controller.Reply{}, nil
	}))
	quick := runsCode(capability.New("quick", "runs at once", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	ctl := controller.New(newRegistry(t, follow, quick), &controller.Options{Limits: controller.Limits{RunsPerTenant: 1}})
	alice := controller.Caller{Path: "rest", Tenant: "alice", Scope: capability.ScopeExec}
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := ctl.Call(context.Background(), alice, "follow", nil)
			done <- err
		}()
		<-following
	}
	if _, err := ctl.Call(context.Background(), alice, "quick", nil); err != nil {
		t.Errorf("a run while three calls only follow, at a limit of 1: %v", err)
	}
	if n := ctl.RunsInFlight("alice"); n != 0 {
		t.Errorf("RunsInFlight while only following = %d, want 0", n)
	}
	close(stop)
	for range 3 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestRunsOf: a tenant's own cap (the operator's override) replaces the
// default, for that tenant alone; one of 0 or less is none; a tenant whose
// cap cannot be read runs nothing.
func TestRunsOf(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	hold := runsCode(capability.New("hold", "runs until released", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		entered <- struct{}{}
		<-release
		return &controller.Reply{}, nil
	}))
	quick := runsCode(capability.New("quick", "runs at once", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	broken := errors.New("its ceilings cannot be read")
	caps := map[string]int{"small": 1, "free": -1}
	ctl := controller.New(newRegistry(t, hold, quick), &controller.Options{Limits: controller.Limits{
		RunsOf: func(ctx context.Context, tenant string) (int, error) {
			if tenant == "broken" {
				return 0, broken
			}
			if n, ok := caps[tenant]; ok {
				return n, nil
			}
			return 16, nil
		}}})
	call := func(tenant, name string) error {
		_, err := ctl.Call(context.Background(), controller.Caller{Tenant: tenant, Scope: capability.ScopeExec}, name, nil)
		return err
	}
	done := make(chan error, 4)
	for _, tenant := range []string{"small", "free", "free", "other"} {
		go func() { done <- call(tenant, "hold") }()
		<-entered
	}
	if err := call("small", "quick"); code(t, err) != capability.ResourceExhausted || !strings.Contains(err.Error(), "its limit is 1") {
		t.Errorf("small's second call: %v, want its limit of 1", err)
	}
	if err := call("free", "quick"); err != nil {
		t.Errorf("a tenant without a cap: %v", err)
	}
	if err := call("other", "quick"); err != nil {
		t.Errorf("a tenant at the default: %v", err)
	}
	if err := call("broken", "quick"); err == nil {
		t.Errorf("a tenant whose cap cannot be read ran a call")
	}
	close(release)
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestClassify: every kind of domain error gets its code, keeps its text
// (which names what it is about) and its hint; a *capability.Error passes
// through as it is.
func TestClassify(t *testing.T) {
	own := capability.Errorf(capability.InvalidArgument, "depth must be between 1 and 16")
	covered := map[int]bool{}
	for _, tc := range []struct {
		err   error
		code  capability.Code
		texts []string
		retry bool
	}{
		{own, capability.InvalidArgument, []string{"depth must be"}, false},
		{fmt.Errorf("fork: %w", own), capability.InvalidArgument, []string{"depth must be"}, false},
		{fmt.Errorf("%w: %q (list sessions to see the names)", session.ErrNotFound, "work"), capability.NotFound, []string{`"work"`, "list sessions"}, false},
		{fmt.Errorf("%w: %q", session.ErrExists, "work"), capability.AlreadyExists, []string{`"work"`}, false},
		{fmt.Errorf("%w: network policy %q", session.ErrBadName, "x"), capability.InvalidArgument, []string{"network policy"}, false},
		{fmt.Errorf("%w: 65 pairs, at most 64", session.ErrBadMetadata), capability.InvalidArgument, []string{"at most 64"}, false},
		{fmt.Errorf("%w: on expiry %q", session.ErrBadLifetime, "x"), capability.InvalidArgument, []string{"on expiry"}, false},
		{fmt.Errorf("%w: 3 sessions of at most 3", session.ErrLimit), capability.ResourceExhausted, []string{"at most 3"}, true},
		{session.ErrConfined, capability.PermissionDenied, []string{"confined"}, false},
		{sandbox.ErrSessionEnded, capability.NotFound, []string{"destroyed"}, false},
		{fmt.Errorf("run: %w", sandbox.ErrPaused), capability.Busy, []string{"paused", "resume_session"}, false},
		{&sandbox.CeilingError{Ceiling: "memory", Message: "tenant memory ceiling of 1 GiB reached"}, capability.ResourceExhausted, []string{"1 GiB"}, true},
		{fmt.Errorf("tenant t1's stored ceilings cannot be read (bad JSON); an operator repairs them with quro tenant limits set --tenant t1: %w", sandbox.ErrTenantUnreadable), capability.Unavailable, []string{"quro tenant limits set"}, false},
		{fmt.Errorf("%q: %w", "f", workspace.ErrNoSpace), capability.ResourceExhausted, []string{`"f"`, "disk"}, false},
		{fmt.Errorf("%w (online resizing failed)", quota.ErrNotGrown), capability.Busy, []string{"idle"}, false},
		{fmt.Errorf("session disk: %w: other attaches took the 16 offered first", quota.ErrNoLoop), capability.Unavailable, []string{"loop device", "try again"}, true},
		{fmt.Errorf("watch %q: %w: inotify instances used up", "w", workspace.ErrWatchLimit), capability.ResourceExhausted, []string{`"w"`, "inotify"}, true},
		{fmt.Errorf("unknown language %q: %w", "cobol", runcode.ErrInvalid), capability.InvalidArgument, []string{"cobol"}, false},
		{fmt.Errorf("%w: session s1 has 4", js.ErrContextLimit), capability.ResourceExhausted, []string{"s1"}, true},
		{fmt.Errorf("/tmp/x: the session box's file helper ended during the operation; try again: %w", boxfs.ErrHelper), capability.Unavailable, []string{"/tmp/x", "try again"}, true},
		{fmt.Errorf("%q leads out of the session workspace: %w", "../x", workspace.ErrOutside), capability.PermissionDenied, []string{"../x"}, false},
		{fmt.Errorf("%q: %w", "x", workspace.ErrPermission), capability.PermissionDenied, []string{`"x"`}, false},
		{fmt.Errorf("%q: %w", "x", workspace.ErrNotFound), capability.NotFound, []string{`"x"`}, false},
		{fmt.Errorf("%q %w", "x", workspace.ErrExists), capability.AlreadyExists, []string{`"x"`}, false},
		{fmt.Errorf("%w: %q is a file", project.ErrNotEmpty, "p"), capability.AlreadyExists, []string{`"p"`}, false},
		{fmt.Errorf("%w: list_files lists a directory", fmt.Errorf("%q %w", "d", workspace.ErrIsDir)), capability.InvalidArgument, []string{"list_files"}, false},
		{fmt.Errorf("%q: %w", "f", workspace.ErrNotDir), capability.InvalidArgument, nil, false},
		{fmt.Errorf("%q: %w", "f", workspace.ErrTooLarge), capability.InvalidArgument, nil, false},
		{fmt.Errorf("%q: %w", "f", workspace.ErrInvalid), capability.InvalidArgument, nil, false},
		{fmt.Errorf("%w: the name is empty", project.ErrBadName), capability.InvalidArgument, []string{"empty"}, false},
		{fmt.Errorf("%w %q", project.ErrUnknownTemplate, "cobol"), capability.InvalidArgument, []string{"cobol"}, false},
		{&terminal.BusyError{Command: "`sleep 9`", Running: time.Second, Waited: time.Second}, capability.Busy, []string{"still running", "`sleep 9`", "ran nothing", "start_process"}, false},
		{&terminal.HeldError{Session: "s", For: time.Second}, capability.Busy, []string{"a person holds this session", "hand it back", "ran nothing"}, false},
		{&terminal.InputError{Command: "`read x`", Since: time.Second}, capability.Busy, []string{"`read x`", "waiting for input", "send_input"}, false},
		{terminal.ErrInvalid, capability.InvalidArgument, nil, false},
		{terminal.ErrNotRunning, capability.InvalidArgument, []string{"no command"}, false},
		{fmt.Errorf("%w (cannot start bash)", terminal.ErrNoBash), capability.Unavailable, []string{"apt-get install bash"}, false},
		{terminal.ErrClosed, capability.Unavailable, []string{"destroyed"}, false},
		{fmt.Errorf("%w: bash did not answer its setup within 2m0s of its start", terminal.ErrStart), capability.Unavailable, []string{"shell did not start", "within 2m0s"}, false},
		{fmt.Errorf("%w: no running process with pid 7", proc.ErrNotFound), capability.NotFound, []string{"pid 7"}, false},
		{fmt.Errorf("%w: the session already runs 64 processes", proc.ErrTooMany), capability.ResourceExhausted, []string{"64 processes"}, true},
		{fmt.Errorf("%w: process 7 has no stdin", proc.ErrInvalid), capability.InvalidArgument, []string{"no stdin"}, false},
		{fmt.Errorf("%w: cannot start nosuch: nosuch: executable file not found in $PATH", proc.ErrNoProgram), capability.InvalidArgument, []string{"cannot start nosuch"}, false},
		{fmt.Errorf("%w: detached 1024 KiB behind", proc.ErrLagged), capability.ResourceExhausted, []string{"1024 KiB"}, false},
		{proc.ErrClosed, capability.Unavailable, []string{"destroyed"}, false},
		{fmt.Errorf("%w: %q", rootfs.ErrBadName, "a b"), capability.InvalidArgument, nil, false},
		{fmt.Errorf("%w: %q", rootfs.ErrBadPackage, "-x"), capability.InvalidArgument, nil, false},
		{fmt.Errorf("%w: %q", rootfs.ErrNotInstalled, "r"), capability.NotFound, nil, false},
		{rootfs.ErrBusy, capability.Busy, []string{"try again"}, false},
		{fmt.Errorf("%w: sl (no such package)", rootfs.ErrRefused), capability.InvalidArgument, []string{"sl"}, false},
		{fmt.Errorf("%w: suite %q", rootfs.ErrBadOption, "../x"), capability.InvalidArgument, []string{"suite"}, false},
		{fmt.Errorf("%w: sl (unpacked)", rootfs.ErrUnsettled), capability.Unavailable, []string{"unpacked"}, false},
		{fmt.Errorf("%w (status)", rootfs.ErrUnreadable), capability.Unavailable, nil, false},
		{fmt.Errorf("%w: debootstrap: exit 1", rootfs.ErrInstallFailed), capability.Unavailable, []string{"debootstrap"}, false},
		{fmt.Errorf("pip needs the embedded Python's preparation (pip comes with it): %w", python.ErrNotInBuild), capability.Unavailable, []string{"no embedded Python", "-tags slim", "python3-pip"}, false},
		{&rootfs.WaitError{Name: "r", Canceled: true}, capability.Canceled, []string{"canceled"}, false},
		{&rootfs.WaitError{Name: "r", Timeout: time.Second}, capability.DeadlineExceeded, []string{"another install", "try again"}, false},
		{fmt.Errorf("wait: %w", context.Canceled), capability.Canceled, []string{"canceled"}, false},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), capability.DeadlineExceeded, []string{"out of time"}, false},
		{&sandbox.StartError{Program: "python3", Reason: "not found"}, capability.Unavailable, []string{"cannot start python3: not found"}, false},
		{&sandbox.LayerError{}, capability.Unavailable, []string{"isolation"}, false},
		// The cause decides before the kind: a start refused at a ceiling.
		{&sandbox.StartError{Program: "bash", Reason: "tasks ceiling", Err: &sandbox.CeilingError{Ceiling: "tasks", Message: "at most 32"}},
			capability.ResourceExhausted, []string{"cannot start bash"}, true},
	} {
		covered[controller.ClassOf(tc.err)] = true
		ce := controller.Classify(tc.err)
		if ce.Code != tc.code || (ce.RetryAfter > 0) != tc.retry {
			t.Errorf("%v: got %s (retry after %d), want %s (retry after: %v)", tc.err, ce.Code, ce.RetryAfter, tc.code, tc.retry)
		}
		for _, s := range tc.texts {
			if !strings.Contains(ce.Message, s) {
				t.Errorf("%v: message %q lacks %q", tc.err, ce.Message, s)
			}
		}
		// The cause stays reachable in the process (E2B's 507 tests
		// workspace.ErrNoSpace); a *capability.Error inside is itself.
		var inner *capability.Error
		if !errors.As(tc.err, &inner) && !errors.Is(ce, tc.err) {
			t.Errorf("%v: the classified error does not wrap its cause", tc.err)
		}
	}
	if cause := errors.Unwrap(controller.Classify(errors.New("secret"))); cause != nil {
		t.Errorf("an internal error wraps its cause (whose text may name internals): %v", cause)
	}
	if ce := controller.Classify(own); ce != own {
		t.Errorf("a *capability.Error is not passed through: %#v", ce)
	}
	for i := range controller.NumClasses() {
		if !covered[i] {
			t.Errorf("class %d of the table (internal/controller/errors.go) has no case here", i)
		}
	}
}

// TestClassifiedErrorNamesNoHostPath: an error marked as naming the host's
// paths (hostpath.Error) is cut where it is classified, the edge where a
// tenant reads it, and nowhere before: the cause keeps the whole text.
func TestClassifiedErrorNamesNoHostPath(t *testing.T) {
	const whole = "mkdir /var/lib/quro/rootfs/.default.partial: read-only file system"
	err := fmt.Errorf("%w: %w", rootfs.ErrInstallFailed, hostpath.Error(errors.New(whole)))
	ce := controller.Classify(err)
	if ce.Code != capability.Unavailable || strings.Contains(ce.Message, "/var/lib/quro") || !strings.Contains(ce.Message, "mkdir .default.partial: read-only file system") {
		t.Errorf("the tenant reads %s: %q", ce.Code, ce.Message)
	}
	if !errors.Is(ce, rootfs.ErrInstallFailed) || !strings.Contains(errors.Unwrap(ce).Error(), whole) {
		t.Errorf("the cause is not whole: %v", errors.Unwrap(ce))
	}
}

var idRE = regexp.MustCompile(`^internal error \(id ([0-9a-f]{8})\): the server failed, not the call; try again, and if it goes on, give the operator this id \(the server log has the details\)$`)

// TestInternalErrorIsLoggedNotLeaked: an error the table does not know
// reaches the client as an id only; the log has the id with the cause,
// the capability, the tenant and the access path.
// An error the table does not know, from a call whose context ended (a
// store query the cancel interrupted), is the call's cancel or timeout,
// not an internal error: at load a client's short deadline read as one.
func TestUnknownErrorOfAnEndedCallIsItsEnd(t *testing.T) {
	t.Parallel()
	for _, timeout := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		want := capability.Canceled
		if timeout {
			ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
			want = capability.DeadlineExceeded
		}
		boom := capability.New("boom", "fails", capability.ScopeRead, func(ctx context.Context, _ empty) (*controller.Reply, error) {
			if !timeout {
				cancel() // the client goes away while the call runs
			}
			<-ctx.Done()
			return nil, errors.New("interrupted (9)")
		})
		ctl := controller.New(newRegistry(t, boom), nil)
		_, err := ctl.Call(ctx, controller.Caller{Path: "mcp", Tenant: "alice", Scope: capability.ScopeRead}, "boom", nil)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != want {
			t.Errorf("timeout %v: got %v, want %s", timeout, err, want)
		}
		cancel()
	}
}

func TestInternalErrorIsLoggedNotLeaked(t *testing.T) {
	const secret = "open /var/lib/quro/store.db: disk I/O error"
	var causes = []error{
		errors.New(secret),
		fmt.Errorf("save: %w", errors.New(secret)),
		// A server file's fs.ErrNotExist is not a workspace's not found.
		fmt.Errorf("open /var/lib/quro/store.db: %w", fs.ErrNotExist),
		// An error marked as naming host paths (a failed preparation of
		// the embedded Python, which install_packages' pip needs): the
		// operator's log has it whole.
		fmt.Errorf("pip needs the embedded Python's preparation: %w", hostpath.Error(errors.New(secret))),
	}
	for i, cause := range causes {
		boom := capability.New("boom", "fails", capability.ScopeRead, func(ctx context.Context, in empty) (*controller.Reply, error) {
			return nil, cause
		})
		var logged bytes.Buffer
		var records []*controller.Record
		ctl := controller.New(newRegistry(t, boom), &controller.Options{
			Logger:    slog.New(slog.NewJSONHandler(&logged, nil)),
			Observers: []controller.Observer{func(_ context.Context, r *controller.Record) { records = append(records, r) }},
		})
		_, err := ctl.Call(context.Background(), controller.Caller{Path: "mcp", Tenant: "alice", Scope: capability.ScopeRead}, "boom", nil)
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code != capability.Internal {
			t.Fatalf("cause %d: got %v, want an internal error", i, err)
		}
		m := idRE.FindStringSubmatch(ce.Message)
		if m == nil || strings.Contains(err.Error(), "quro") {
			t.Fatalf("cause %d: the client reads %q", i, ce.Message)
		}
		if len(records) != 1 || records[0].Err != ce || records[0].Outcome != "internal" {
			t.Errorf("cause %d: the observer saw %+v", i, records)
		}
		var entry map[string]any
		for line := range strings.Lines(logged.String()) {
			var e map[string]any
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatal(err)
			}
			if e["id"] == m[1] {
				entry = e
			}
		}
		if entry == nil || entry["level"] != "ERROR" || entry["err"] != cause.Error() || !strings.Contains(cause.Error(), "/var/lib/quro/store.db") ||
			entry["capability"] != "boom" || entry["tenant"] != "alice" || entry["path"] != "mcp" {
			t.Errorf("cause %d: no log entry for id %s with the cause, capability, tenant and path:\n%s", i, m[1], logged.String())
		}
	}
	// Two internal errors get different ids.
	boom := capability.New("boom", "fails", capability.ScopeRead, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return nil, errors.New("x")
	})
	ctl := controller.New(newRegistry(t, boom), nil)
	caller := controller.Caller{Scope: capability.ScopeRead}
	_, a := ctl.Call(context.Background(), caller, "boom", nil)
	_, b := ctl.Call(context.Background(), caller, "boom", nil)
	if a.Error() == b.Error() {
		t.Errorf("two internal errors share an id: %v", a)
	}
}

type stopped string

func (s stopped) StoppedBy() string { return string(s) }

// TestObserversSeeEveryOutcome: every call, failed or not, reaches every
// observer in order with its outcome: ok, the code of its error, or
// timeout / canceled for a run that was stopped.
func TestObserversSeeEveryOutcome(t *testing.T) {
	outs := map[string]any{
		"ok":              &runcode.Result{ExitCode: 1},
		"run_timeout":     &runcode.Result{TimedOut: true},
		"run_canceled":    &runcode.Result{Interrupted: true},
		"term_timeout":    &terminal.Result{TimedOut: true},
		"term_interrupt":  &terminal.Result{Interrupted: true}, // by send_input, the call itself went on
		"stopper_timeout": stopped(controller.OutcomeTimeout),
		"stopper_ok":      stopped(""),
	}
	reg := newRegistry(t, capability.New("out", "returns an output", capability.ScopeExec, func(ctx context.Context, in fails) (any, error) {
		return outs[in.Kind], nil
	}), capability.New("fail", "fails", capability.ScopeExec, func(ctx context.Context, in fails) (any, error) {
		switch in.Kind {
		case "canceled":
			<-ctx.Done()
			return nil, ctx.Err()
		case "busy":
			return nil, terminal.ErrBusy
		}
		return nil, errors.New("boom")
	}), capability.New("term", "a terminal result under a canceled call", capability.ScopeExec, func(ctx context.Context, in empty) (*terminal.Result, error) {
		<-ctx.Done()
		return &terminal.Result{Interrupted: true}, nil
	}))
	type seen struct {
		observer int
		name     string
		outcome  string
		code     capability.Code
	}
	var got []seen
	observer := func(i int) controller.Observer {
		return func(_ context.Context, r *controller.Record) {
			s := seen{observer: i, name: r.Capability, outcome: r.Outcome}
			if r.Err != nil {
				s.code = r.Err.Code
			}
			if (r.Err == nil) == (r.Output == nil) {
				t.Errorf("%s: a record with output %v and error %v", r.Capability, r.Output, r.Err)
			}
			got = append(got, s)
		}
	}
	ctl := controller.New(reg, &controller.Options{Observers: []controller.Observer{observer(1), observer(2)}})
	caller := controller.Caller{Path: "ws", Scope: capability.ScopeExec}
	call := func(ctx context.Context, name string, args string) {
		ctl.Call(ctx, caller, name, json.RawMessage(args))
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()

	var want []seen
	expect := func(name, outcome string, code capability.Code) {
		want = append(want, seen{1, name, outcome, code}, seen{2, name, outcome, code})
	}
	for _, kind := range []string{"ok", "run_timeout", "run_canceled", "term_timeout", "term_interrupt", "stopper_timeout", "stopper_ok"} {
		call(ctx, "out", `{"kind":"`+kind+`"}`)
		outcome := map[string]string{"run_timeout": "timeout", "run_canceled": "canceled", "term_timeout": "timeout", "stopper_timeout": "timeout"}[kind]
		if outcome == "" {
			outcome = "ok"
		}
		expect("out", outcome, "")
	}
	call(canceled, "term", `{}`)
	expect("term", "canceled", "")
	call(canceled, "fail", `{"kind":"canceled"}`)
	expect("fail", "canceled", capability.Canceled)
	call(ctx, "fail", `{"kind":"busy"}`)
	expect("fail", "busy", capability.Busy)
	call(ctx, "fail", `{"kind":"other"}`)
	expect("fail", "internal", capability.Internal)
	call(ctx, "fail", `{"kind":1}`)
	expect("fail", "invalid_argument", capability.InvalidArgument)
	call(ctx, "destroy", `{}`)
	expect("destroy", "permission_denied", capability.PermissionDenied)
	call(ctx, "nothing", `{}`)
	expect("nothing", "not_found", capability.NotFound)

	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the observers saw\n%v\nwant\n%v", got, want)
	}
}

// TestBackgroundMarksReadsOnly: a caller's background flag marks the
// record of a read-scope call only; a call that acts (exec, admin), sent
// with the flag to hide it from the audit view, is recorded unmarked.
func TestBackgroundMarksReadsOnly(t *testing.T) {
	t.Parallel()
	reg := newRegistry(t, capability.New("act", "acts", capability.ScopeExec, func(ctx context.Context, in empty) (*controller.Reply, error) {
		return &controller.Reply{}, nil
	}))
	marked := map[string]bool{}
	ctl := controller.New(reg, &controller.Options{Observers: []controller.Observer{func(_ context.Context, r *controller.Record) {
		marked[r.Capability] = r.Background
	}}})
	caller := controller.Caller{Path: "rest", Scope: capability.ScopeAdmin, Background: true}
	for _, name := range []string{"peek", "act", "destroy"} {
		if _, err := ctl.Call(context.Background(), caller, name, json.RawMessage(`{}`)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if want := map[string]bool{"peek": true, "act": false, "destroy": false}; fmt.Sprint(marked) != fmt.Sprint(want) {
		t.Fatalf("marked %v, want %v", marked, want)
	}
	caller.Background = false
	ctl.Call(context.Background(), caller, "peek", json.RawMessage(`{}`))
	if marked["peek"] {
		t.Fatal("a read without the flag was marked")
	}
}
