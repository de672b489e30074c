package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

// TestMoveIsAdmittedAsACreate: a node takes a moved session only with
// room under every ceiling a create is admitted against. Its admission
// probe (Mover.Admit, asked before the sender pauses the session)
// refuses files larger than the tenant's disk quota there, and a tenant
// at its memory ceiling there; the import itself refuses the latter too
// (the probe is advice), leaving nothing behind, and takes the session
// once the ceiling is raised.
func TestMoveIsAdmittedAsACreate(t *testing.T) {
	needEmbedded(t, nil) // the receiver's sessions hold memory in their workers
	ctx := context.Background()
	from := newApp(t, nil)
	to, err := New(ctx, t.TempDir(), &Options{Python: testPython, PrestartPython: true,
		Limits: Limits{Tenant: TenantLimits{Disk: 16 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { to.Close() })
	tenant := fmt.Sprintf("mv-%d", os.Getpid()) // its cgroup is the host's: one of its own
	caller := controller.Caller{Path: "test", Tenant: tenant, Scope: capability.ScopeAdmin, TokenID: "tm"}
	s := mustCallAs(t, from, caller, "create_session", CreateSessionInput{Name: "moving"}).(*SessionInfo)
	if r, err := callAs(t, from, caller, "terminal_exec", TerminalExecInput{Session: s.ID,
		Command: "head -c 20000000 /dev/zero > big.bin && echo kept > kept.txt"}); err != nil {
		t.Fatal(err, r)
	}
	size, err := from.Mover().Size(ctx, s.ID)
	if err != nil || size != 20000005 {
		t.Fatalf("the session's size: %d %v, want 20000005", size, err)
	}

	// Larger than the receiver's disk quota per session: refused before
	// the sender pauses it.
	err = to.Mover().Admit(ctx, tenant, size)
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "disk quota") || !strings.Contains(ce.Message, "16 MiB") {
		t.Errorf("the refusal %q does not name the disk quota", ce.Message)
	}
	if r, err := callAs(t, from, caller, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "rm big.bin"}); err != nil {
		t.Fatal(err, r)
	}
	if size, err = from.Mover().Size(ctx, s.ID); err != nil || size != 5 {
		t.Fatalf("the session's size: %d %v, want 5", size, err)
	}
	if err := to.Mover().Admit(ctx, tenant, size); err != nil {
		t.Fatalf("a small session on a receiver with room: %v", err)
	}
	// A file with twenty names and a 100 MiB sparse file (a venv's or
	// uv's cache of hard links) are counted as the move carries them:
	// once, and by their data.
	if r, err := callAs(t, from, caller, "terminal_exec", TerminalExecInput{Session: s.ID,
		Command: "head -c 1000000 /dev/urandom > f && for i in $(seq 1 20); do ln f l$i; done && truncate -s 100M sparse"}); err != nil {
		t.Fatal(err, r)
	}
	if size, err = from.Mover().Size(ctx, s.ID); err != nil || size != 1000005 {
		t.Fatalf("the session's size with hard links and a sparse file: %d %v, want 1000005", size, err)
	}
	if err := to.Mover().Admit(ctx, tenant, size); err != nil {
		t.Fatalf("a session of hard links and holes on a receiver with room: %v", err)
	}

	if _, ok := to.Sandbox.TenantUsage(""); !ok {
		t.Skip("no cgroups layer here: no memory ceiling to be at")
	}
	// The tenant at its memory ceiling on the receiver: a session there
	// holds 56 MiB, the ceiling leaves less than an idle session needs.
	held := mustCallAs(t, to, caller, "create_session", CreateSessionInput{Name: "holder"}).(*SessionInfo)
	reply, err := callAs(t, to, caller, "run_code", RunCodeInput{Session: held.ID, TimeoutMS: -1, Code: "held = b'x' * (56 << 20)\nprint('held')"})
	if err != nil || !strings.Contains(reply.Output.(*runcode.Result).Stdout, "held") {
		t.Fatalf("holding memory: %v %+v", err, reply)
	}
	u, _ := to.Sandbox.TenantUsage(tenant)
	if err := to.setTenantLimits(ctx, tenant, TenantLimits{Memory: max(64<<20, int64(u.Memory)+sessionMemory/2)}); err != nil {
		t.Fatal(err)
	}
	err = to.Mover().Admit(ctx, tenant, size)
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "memory ceiling") {
		t.Errorf("the probe's refusal %q does not name the memory ceiling", ce.Message)
	}
	importIt := func() error {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(from.Mover().Export(ctx, s.ID, pw)) }()
		_, _, _, err := to.Mover().Import(ctx, s.ID, tenant, "moving", pr)
		pr.Close()
		return err
	}
	// A sender that moves it without asking (or whose answer is stale):
	// the import refuses it, and nothing of it is left.
	err = importIt()
	if ce := wantCode(t, err, capability.ResourceExhausted); !strings.Contains(ce.Message, "memory ceiling") {
		t.Errorf("the import's refusal %q does not name the memory ceiling", ce.Message)
	}
	if _, err := to.Sessions.ByIDAnyTenant(ctx, s.ID); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("a refused import left its session: %v", err)
	}
	// Raised: taken, with its files.
	if err := to.setTenantLimits(ctx, tenant, TenantLimits{}); err != nil {
		t.Fatal(err)
	}
	if err := importIt(); err != nil {
		t.Fatalf("the import with room: %v", err)
	}
	r, err := callAs(t, to, caller, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "cat kept.txt"})
	if err != nil || !strings.Contains(r.Text, "kept") {
		t.Fatalf("the moved session's file: %v %+v", err, r)
	}
}
