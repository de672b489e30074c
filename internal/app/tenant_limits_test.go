package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/terminal"
)

// The attack of the report: a tenant leaves background processes running
// in one session's terminal (they outlive the call) and starts more from
// another session. The tenant's process ceiling holds across sessions:
// the next exec call is refused with resource_exhausted and a message
// naming the ceiling, get_service_status shows the tenant its usage, the
// metrics count it without naming it, and another tenant runs as before.
func TestTenantCeilingAcrossSessionsThroughTheController(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Limits: Limits{Tenant: TenantLimits{Disk: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, ok := a.Sandbox.TenantUsage(""); !ok {
		t.Skip("no cgroups layer here")
	}
	acmeName := fmt.Sprintf("acme-%d", os.Getpid())
	acme := controller.Caller{Path: "test", Tenant: acmeName, Scope: capability.ScopeAdmin, TokenID: "ta"}
	bob := controller.Caller{Path: "test", Tenant: fmt.Sprintf("bob-%d", os.Getpid()), Scope: capability.ScopeAdmin, TokenID: "tb"}
	for _, name := range []string{"s1", "s2"} {
		if _, err := callAs(t, a, acme, "create_session", CreateSessionInput{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	// s1's box and shell first (bubblewrap, the box's init and its
	// spawner, the resident bash).
	if _, err := callAs(t, a, acme, "terminal_exec", TerminalExecInput{Session: "s1", Command: "true"}); err != nil {
		t.Fatal(err)
	}
	// 60 background processes stay in s1's persistent shell. The ceiling
	// is set once they run, one above what the tenant holds then, and
	// admission keeps a margin of 8, so the next box is refused, also
	// once the spawner has been let go (4 threads fewer). (Set
	// from the count before them, it depended on that count: a process
	// of the box still ending or starting as it was read, such as the
	// box's spawner's next child, moved it by a few and let the next box in.)
	// Its own timeout, not the default 30 s: 60 forks took longer at a
	// load of 100, and the ceiling was then read while they went on.
	if reply, err := callAs(t, a, acme, "terminal_exec", TerminalExecInput{Session: "s1", TimeoutMS: 300_000,
		Command: "for i in $(seq 60); do sleep 1000 & done; echo held"}); err != nil {
		t.Fatal(err)
	} else if r := reply.Output.(*terminal.Result); r.TimedOut || !strings.Contains(r.Output, "held") {
		t.Fatalf("60 background processes: %+v", r)
	}
	held, _ := a.Sandbox.TenantUsage(acmeName)
	ceiling := int64(held.Tasks) + 1
	if err := a.setTenantLimits(context.Background(), acmeName, TenantLimits{Tasks: ceiling}); err != nil {
		t.Fatal(err)
	}
	ceilingText := fmt.Sprintf("process ceiling of %d", ceiling)
	_, err = callAs(t, a, acme, "run_code", RunCodeInput{Session: "s2", Lang: "shell", Code: "echo hi"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	for _, want := range []string{"tenant " + acmeName, ceilingText, "quro tenant limits set"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("the refusal %q does not say %q", ce.Message, want)
		}
	}
	// Every path that starts a box says the same, as a 429: s2's shell
	// cannot start either.
	_, err = callAs(t, a, acme, "terminal_exec", TerminalExecInput{Session: "s2", Command: "echo hi"})
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, ceilingText) {
		t.Errorf("terminal_exec's refusal %q does not name the ceiling", ce.Message)
	}
	reply, err := callAs(t, a, acme, "get_service_status", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	st := reply.Output.(*Status)
	// The usage shown holds at least the 60 background processes and the
	// shell whose jobs they are: they last until the destroy. Not base+60:
	// the box's spawner, started by s1's first command and counted in
	// base, is let go after 30 s unused (its 4 threads leave the count),
	// and at a load of 50 the test reached this call after that.
	if st.Tenant == nil || st.Tenant.Tenant != acmeName || st.Tenant.Limits.Tasks != ceiling || st.Tenant.Tasks < 61 || !strings.Contains(reply.Text, "processes") {
		t.Errorf("status does not show acme's ceiling and usage: %+v\n%s", st.Tenant, reply.Text)
	}
	f := metricstest.Scrape(t, a.Metrics.Handler())
	if v, _ := f.Value("quro_tenants_at_ceiling", "ceiling", "tasks"); v != 1 {
		t.Errorf("quro_tenants_at_ceiling{tasks} = %v, want 1", v)
	}
	if v, _ := f.Value("quro_tenant_ceiling_refusals_total", "ceiling", "tasks"); v != 1 {
		t.Errorf("quro_tenant_ceiling_refusals_total{tasks} = %v, want 1", v)
	}
	// Bob is not charged for acme's processes.
	reply, err = callAs(t, a, bob, "run_code", RunCodeInput{Lang: "shell", TimeoutMS: -1, Code: "for i in $(seq 60); do sleep 1 & done; echo bob-ok"})
	if err != nil || !strings.Contains(reply.Output.(*runcode.Result).Stdout, "bob-ok") {
		t.Fatalf("bob: %v %+v", err, reply)
	}
	// Destroying the busy session frees acme.
	if _, err := callAs(t, a, acme, "destroy_session", SessionRef{Session: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, acme, "run_code", RunCodeInput{Session: "s2", Lang: "shell", Code: "echo hi"}); err != nil {
		t.Fatalf("after destroying s1, acme is still refused: %v", err)
	}
}

// Outputs the server spills count against the session's disk quota, and a
// run that fills it reads what filled it.
func TestSpilledOutputsCountAgainstTheDiskQuota(t *testing.T) {
	t.Parallel()
	for _, images := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "images"}[images], func(t *testing.T) {
			t.Parallel()
			spilledOutputsCountAgainstTheDiskQuota(t, images)
		})
	}
}

func spilledOutputsCountAgainstTheDiskQuota(t *testing.T, images bool) {
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, diskImages: images,
		Limits: Limits{Tenant: TenantLimits{Disk: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.tenants.disks.Enforced(); err != nil {
		t.Skipf("no kernel disk quota here: %v", err)
	}
	full := "No space left on device"
	if a.tenants.disks.Shared() {
		full = "Disk quota exceeded"
	}
	// 40 MiB of stdout: cut in the result, saved whole in the workspace.
	res := runCode(t, a, RunCodeInput{Lang: "shell", Code: "head -c 40M /dev/zero | tr '\\0' x"})
	if res.StdoutFile == "" {
		t.Fatalf("the output was not saved: %+v", res.Notes)
	}
	res = runCode(t, a, RunCodeInput{Lang: "shell", Code: "head -c 40M /dev/zero > fill; echo rc=$?"})
	for _, want := range []string{full, "disk quota of 64 MiB is full", "workspace/.quro/outputs"} {
		if !strings.Contains(res.Stderr+res.Stdout, want) {
			t.Errorf("the run that filled the quota does not read %q:\nstdout %q\nstderr %q", want, res.Stdout, res.Stderr)
		}
	}
	// The server's own write into the full workspace is the tenant's to
	// fix (resource_exhausted, saying so), not a server failure.
	_, err = call(t, a, "write_file", WriteFileInput{Path: "more", Content: strings.Repeat("x", 1<<20)})
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "no space left on the session's disk") {
		t.Errorf("write_file into the full disk: %q", ce.Message)
	}
	reply, err := call(t, a, "get_service_status", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if st := reply.Output.(*Status).Tenant; len(st.DiskFullIn) != 1 || st.DiskUsedBytes < 50<<20 {
		t.Errorf("status does not show the full disk: %+v", st)
	}
	f := metricstest.Scrape(t, a.Metrics.Handler())
	if v, _ := f.Value("quro_session_disks", "state", "full"); v != 1 {
		t.Errorf("quro_session_disks{full} = %v, want 1", v)
	}
}

// BenchmarkTenantOfRun measures what the tenant layer adds to each run
// before the box starts: finding the session's tenant and ceilings, the
// mount check, and the admission read of the tenant's cgroup.
func BenchmarkTenantOfRun(b *testing.B) {
	a := newApp(b, nil)
	s, err := a.Sessions.Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t, ok := a.tenants.forRun(s.Workspace())
		if !ok {
			b.Fatal("no tenant")
		}
		a.Sandbox.Admit(t)
	}
}

// A run that allocates past its tenant's memory ceiling (below the
// session's own limit of 1 GiB) reads that the tenant's ceiling killed it:
// a shell run, and the session's resident Python worker.
func TestTenantMemoryCeilingOOMIsNamedInTheResult(t *testing.T) {
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython,
		Limits: Limits{Tenant: TenantLimits{Disk: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if _, ok := a.Sandbox.TenantUsage(""); !ok {
		t.Skip("no cgroups layer here")
	}
	name := fmt.Sprintf("oom-%d", os.Getpid())
	caller := controller.Caller{Path: "test", Tenant: name, Scope: capability.ScopeAdmin, TokenID: "to"}
	if err := a.setTenantLimits(context.Background(), name, TenantLimits{Memory: 160 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := callAs(t, a, caller, "create_session", CreateSessionInput{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	const want = "the tenant's memory ceiling (160 MiB, all of its sessions together) was reached"
	for _, tc := range []struct{ lang, code, note string }{
		{"shell", `python3 -c "b = bytearray(400 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('ALLOCATED')"`, "killed: " + want},
		{"python", "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ALLOCATED')", "the Python worker was killed: " + want},
	} {
		reply, err := callAs(t, a, caller, "run_code", RunCodeInput{Session: "s1", Lang: tc.lang, Code: tc.code})
		if err != nil {
			t.Fatalf("%s: %v", tc.lang, err)
		}
		res := reply.Output.(*runcode.Result)
		if strings.Contains(res.Stdout, "ALLOCATED") || !res.OOMKilled || !strings.Contains(strings.Join(res.Notes, "\n"), tc.note) {
			t.Errorf("%s: the run that passed the ceiling does not read %q: stdout %q, error %q, notes %q, oom_killed %v", tc.lang, tc.note, res.Stdout, res.Error, res.Notes, res.OOMKilled)
		}
	}
	// The terminal: the command reads it, and the next one runs.
	reply, err := callAs(t, a, caller, "terminal_exec", TerminalExecInput{Session: "s1",
		Command: `python3 -c "b = bytearray(400 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('ALLOCATED')"`})
	if err != nil {
		t.Fatal(err)
	}
	if res := reply.Output.(*terminal.Result); strings.Contains(res.Output, "ALLOCATED") || !res.OOMKilled || !strings.Contains(res.Text(), "killed: out of memory: "+want) {
		t.Errorf("terminal_exec past the ceiling:\n%s", res.Text())
	}
	if reply, err := callAs(t, a, caller, "terminal_exec", TerminalExecInput{Session: "s1", Command: "echo next"}); err != nil || reply.Output.(*terminal.Result).Output != "next\n" {
		t.Errorf("the next command: %v %+v", err, reply)
	}
}

// A run past its session's memory limit (below the tenant's ceiling)
// reads that limit, in run_code and in terminal_exec.
func TestSessionMemoryLimitOOMIsNamedInTheResult(t *testing.T) {
	lim := sandbox.DefaultLimits()
	lim.Memory = 128 << 20
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Sandbox: &sandbox.Options{Limits: &lim}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	needBoxes(t, a)
	if _, ok := a.Sandbox.TenantUsage(""); !ok {
		t.Skip("no cgroups layer here")
	}
	s := newSession(t, a, "s1", "")
	const want = "the session's memory limit (128 MiB) was reached"
	alloc := `python3 -c "b = bytearray(400 << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; print('ALLOCATED')"`
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "bash", Code: alloc})
	if strings.Contains(res.Stdout, "ALLOCATED") || !res.OOMKilled || !strings.Contains(res.Text(), want) {
		t.Errorf("run_code past the session's limit:\n%s", res.Text())
	}
	tr := texec(t, a, s.ID, alloc)
	if strings.Contains(tr.Output, "ALLOCATED") || !tr.OOMKilled || tr.ExitCode != 137 || !strings.Contains(tr.Text(), "killed: out of memory: "+want) {
		t.Errorf("terminal_exec past the session's limit:\n%s", tr.Text())
	}
	if tr := texec(t, a, s.ID, "echo next"); tr.Output != "next\n" || tr.OOMKilled {
		t.Errorf("the next command: %+v", tr)
	}
}

// get_service_status names no host path to anyone but the operator: not
// the data directory, nor the cgroups or programs the isolation features
// name; the operator's (and quro doctor's) status keeps them.
func TestServiceStatusNamesNoHostPathToATenant(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	for _, c := range []controller.Caller{
		{Path: "test", Scope: capability.ScopeRead, TokenID: "tr"},
		{Path: "test", Tenant: fmt.Sprintf("bob-%d", os.Getpid()), Scope: capability.ScopeAdmin, TokenID: "tb"},
	} {
		reply, err := callAs(t, a, c, "get_service_status", Empty{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(reply.Output)
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range []string{reply.Text, string(b)} {
			for _, host := range []string{a.DataDir, "/sys/fs/cgroup", "data_dir"} {
				if strings.Contains(text, host) {
					t.Errorf("%s (tenant %q) reads %s in the status:\n%s", c.Scope, c.Tenant, host, text)
				}
			}
		}
	}
	reply, err := call(t, a, "get_service_status", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if st := reply.Output.(*Status); st.DataDir != a.DataDir || !strings.Contains(reply.Text, a.DataDir) {
		t.Errorf("the operator's status lacks the data directory: %+v", st)
	}
}

// The sessions' disk images are loop devices of the host's, one pool for
// every tenant: the server holds at most Limits.SessionDisks and each
// tenant its share (a quarter, at least one). A tenant at its share is
// refused with resource_exhausted naming the share and the flag; another
// tenant still gets its own; past the cap, everyone is refused until a
// session is destroyed.
func TestSessionDisksHaveTenantShares(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The images method's: the shared filesystem's subvolumes hold no
	// loop device, and no cap applies to them
	// (TestSharedDisksHaveNoLoopDeviceCap).
	opts := &Options{Python: testPython, diskImages: true, Limits: Limits{SessionDisks: 3, Tenant: TenantLimits{Disk: 16 << 20}}}
	a, err := New(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.tenants.disks.Enforced(); err != nil {
		t.Skipf("no kernel disk quota here: %v", err)
	}
	if n := a.tenants.diskShares.Held(""); n != 1 { // the default session's image, adopted at start
		t.Fatalf("the local tenant holds %d disks, want 1", n)
	}
	as := func(tenant string) controller.Caller {
		return controller.Caller{Path: "test", Tenant: tenant, Scope: capability.ScopeExec, TokenID: "t-" + tenant}
	}
	alice, bob, carol := as("alice"), as("bob"), as("carol")
	a1 := mustCallAs(t, a, alice, "create_session", CreateSessionInput{Name: "a1"}).(*SessionInfo)
	_, err = callAs(t, a, alice, "create_session", CreateSessionInput{Name: "a2"})
	ce := wantCode(t, err, capability.ResourceExhausted)
	for _, want := range []string{"tenant's share of the session disks", "1 of 1 (of the server's 3)", "--max-session-disks"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("alice at her share: %q does not say %q", ce.Message, want)
		}
	}
	// Alice at her share takes nothing of bob's.
	mustCallAs(t, a, bob, "create_session", CreateSessionInput{Name: "b1"})
	// The server's 3 are in use: carol, under her share, is refused too.
	_, err = callAs(t, a, carol, "create_session", CreateSessionInput{Name: "c1"})
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "server's session disks (loop-mounted images) are all in use (3)") {
		t.Errorf("the server full: %q", ce.Message)
	}
	// A destroyed session gives its place back.
	mustCallAs(t, a, alice, "destroy_session", SessionRef{Session: a1.ID})
	mustCallAs(t, a, carol, "create_session", CreateSessionInput{Name: "c1"})
	if s := a.tenants.diskShares.Stats(); s.Held != 3 || s.Tenants != 3 || s.RefusedShare != 1 || s.RefusedFull != 1 {
		t.Fatalf("stats %+v", s)
	}
	// The next server counts the images this one leaves: bob still holds
	// his share.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a2, err := New(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a2.Close() })
	if s := a2.tenants.diskShares.Stats(); s.Held != 3 || a2.tenants.diskShares.Held("bob") != 1 {
		t.Fatalf("after a restart: stats %+v, bob holds %d", s, a2.tenants.diskShares.Held("bob"))
	}
	_, err = callAs(t, a2, bob, "create_session", CreateSessionInput{Name: "b2"})
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "tenant's share of the session disks") {
		t.Errorf("bob at his share after a restart: %q", ce.Message)
	}
}

// With the shared filesystem, the sessions' disks are subvolumes (no loop
// device, no mount each): the cap of --max-session-disks does not apply,
// and the ceilings say so.
func TestSharedDisksHaveNoLoopDeviceCap(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, Limits: Limits{SessionDisks: 1, Tenant: TenantLimits{Disk: 16 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.tenants.disks.Shared() {
		t.Skipf("no shared filesystem here: %s", a.tenants.disks.Method())
	}
	for _, name := range []string{"s1", "s2"} {
		mustCall(t, a, "create_session", CreateSessionInput{Name: name})
	}
	if !strings.HasPrefix(a.tenants.ceilings.From["session_disks"], "not applied") {
		t.Errorf("the session disks' ceiling says %q", a.tenants.ceilings.From["session_disks"])
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// The shared filesystem, on a private bind of the sessions' directory.
	var btrfs, all int
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == a.tenants.root || strings.HasPrefix(f[4], a.tenants.root+"/")) {
			all++
			if strings.Contains(l, " - btrfs ") {
				btrfs++
			}
		}
	}
	if btrfs != 1 || all > 2 {
		t.Errorf("%d mounts (%d btrfs) at or below the sessions' directory for three sessions' disks, want the shared one on its bind", all, btrfs)
	}
}

// A server restarted on a data directory whose sessions' disks are
// subvolumes of the shared filesystem finds each session's subvolume,
// its files and its quota: a run past the quota still fails.
func TestRestartKeepsTheSessionsSubvolumes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	opts := &Options{Python: testPython, Limits: Limits{Tenant: TenantLimits{Disk: 16 << 20}}}
	a, err := New(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !a.tenants.disks.Shared() {
		a.Close()
		t.Skipf("no shared filesystem here: %s", a.tenants.disks.Method())
	}
	mustCall(t, a, "create_session", CreateSessionInput{Name: "kept"})
	shOK(t, a, "kept", "echo kept > note")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a, err = New(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if !a.tenants.disks.Shared() {
		t.Fatalf("after a restart: %s", a.tenants.disks.Method())
	}
	if r := shOK(t, a, "kept", "cat note"); strings.TrimSpace(r.Stdout) != "kept" {
		t.Errorf("after a restart the session's file reads %q", r.Stdout)
	}
	r := runCode(t, a, RunCodeInput{Session: "kept", Lang: "shell", Code: "head -c 32M /dev/zero > big; echo rc=$?"})
	if !strings.Contains(r.Stderr+r.Stdout, "Disk quota exceeded") || !strings.Contains(r.Stderr+r.Stdout, "disk quota of 16 MiB is full") {
		t.Errorf("32 MiB into a 16 MiB quota after a restart:\nstdout %q\nstderr %q", r.Stdout, r.Stderr)
	}
}

// The attack: a tenant fires many more create_session calls at once than
// its session ceiling allows, so that each passes the ceiling's count
// before any other's session is stored. The ceiling holds under the
// burst: exactly the ceiling's sessions are made (spares claimed or made
// anew), and every other call is refused at once with resource_exhausted
// (429) naming the ceiling.
func TestABurstOfCreatesGetsExactlyTheTenantCeiling(t *testing.T) {
	t.Parallel()
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, SpareSessions: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	const ceiling, burst = 4, 32
	tenant := fmt.Sprintf("burst-%d", os.Getpid())
	if err := a.setTenantLimits(context.Background(), tenant, TenantLimits{Sessions: ceiling}); err != nil {
		t.Fatal(err)
	}
	caller := controller.Caller{Path: "test", Tenant: tenant, Scope: capability.ScopeExec, TokenID: "tb"}
	errs := make([]error, burst)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			<-gate
			_, errs[i] = callAs(t, a, caller, "create_session", CreateSessionInput{Name: fmt.Sprint("b", i)})
		})
	}
	close(gate)
	wg.Wait()
	made := 0
	for _, err := range errs {
		if err == nil {
			made++
			continue
		}
		ce := wantCode(t, err, capability.ResourceExhausted)
		if !strings.Contains(ce.Message, fmt.Sprintf("session ceiling of %d", ceiling)) {
			t.Errorf("the refusal does not name the ceiling: %q", ce.Message)
		}
	}
	list := mustCallAs(t, a, caller, "list_sessions", ListSessionsInput{}).(*SessionList)
	if made != ceiling || len(list.Sessions) != ceiling {
		t.Fatalf("a burst of %d against a ceiling of %d: %d made, %d listed", burst, ceiling, made, len(list.Sessions))
	}
}

// A status read makes no session: a tenant that has none reads an empty
// default_session and still holds none after it (made by the read, the
// default counted against the tenant's session ceiling, and quro doctor's
// status made one in the data directory of the server it ran beside); the
// first call without a session makes it, and the next status names it.
func TestServiceStatusMakesNoSession(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	tenant := fmt.Sprintf("status-%d", os.Getpid())
	c := controller.Caller{Path: "test", Tenant: tenant, Scope: capability.ScopeExec, TokenID: "t-" + tenant}
	for range 2 {
		st := mustCallAs(t, a, c, "get_service_status", Empty{}).(*Status)
		if st.Sessions != 0 || st.DefaultSession != "" {
			t.Fatalf("a status read of a tenant without sessions: %d sessions, default %q", st.Sessions, st.DefaultSession)
		}
	}
	list := mustCallAs(t, a, c, "list_sessions", Empty{})
	if b, _ := json.Marshal(list); strings.Contains(string(b), `"id"`) {
		t.Fatalf("the status reads made a session: %s", b)
	}
	mustCallAs(t, a, c, "run_code", RunCodeInput{Lang: "sh", Code: "true"})
	st := mustCallAs(t, a, c, "get_service_status", Empty{}).(*Status)
	if st.Sessions != 1 || st.DefaultSession == "" {
		t.Fatalf("after a call without a session: %d sessions, default %q", st.Sessions, st.DefaultSession)
	}
}
