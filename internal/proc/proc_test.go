package proc

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/quro-dev/quro/internal/sandbox"
)

// A table over a real sandbox: every process runs as in a session.
type rig struct {
	t    *testing.T
	tab  *Table
	sb   *sandbox.Sandbox
	base *sandbox.Spec
}

func newRig(t *testing.T, max int) *rig {
	t.Helper()
	sb, err := sandbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tab := newTable(max, DefaultQueue)
	t.Cleanup(tab.Close)
	return &rig{t: t, tab: tab, sb: sb, base: &sandbox.Spec{Dir: dir, TmpDir: dir}}
}

func (r *rig) start(session string, st *Start) (*Process, *Viewer, error) {
	return r.tab.Start(context.Background(), r.sb, r.base, session, st)
}

func (r *rig) mustStart(session string, cmd string, args ...string) (*Process, *Viewer) {
	r.t.Helper()
	p, v, err := r.start(session, &Start{Config: Config{Cmd: cmd, Args: args}})
	if err != nil {
		r.t.Fatalf("start %s %v: %v", cmd, args, err)
	}
	return p, v
}

// pending is the table's count of starts under way, for every session.
func (r *rig) pending() map[string]int {
	r.tab.mu.Lock()
	defer r.tab.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.tab.pending {
		out[k] = v
	}
	return out
}

// read collects a viewer's output to its end.
func read(v *Viewer) map[string]string {
	out := map[string]string{}
	for ev := range v.C {
		out[ev.Stream] += string(ev.Data)
		v.Consumed(len(ev.Data))
	}
	return out
}

// A process runs, its output reaches the viewer attached before it ran,
// it ends in envd's words and leaves the table.
func TestStartOutputEnd(t *testing.T) {
	r := newRig(t, DefaultMax)
	p, v := r.mustStart("s", "sh", "-c", "echo out; echo err >&2; exit 3")
	out := read(v)
	<-p.Done()
	if out["stdout"] != "out\n" || out["stderr"] != "err\n" || v.Err() != nil {
		t.Fatalf("output %q, viewer error %v", out, v.Err())
	}
	if e := p.End(); e.ExitCode != 3 || !e.Exited || e.Status != "exit status 3" || e.Error != "exit status 3" {
		t.Fatalf("end: %+v", e)
	}
	if l := r.tab.List("s"); len(l) != 0 {
		t.Fatalf("an ended process is listed: %+v", l)
	}
	if _, err := r.tab.Get("s", Selector{Pid: p.Pid()}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of an ended process: %v", err)
	}
	if _, err := p.Attach(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("attach to an ended process: %v", err)
	}
}

// A process's pid is the one its program has in its box (its own $$),
// known at the start: not a pid read from /proc after it, which for a
// program that ended at once is gone (0) or the host's.
func TestPidIsTheProgramsOwn(t *testing.T) {
	r := newRig(t, DefaultMax)
	p, v := r.mustStart("s", "sh", "-c", "echo $$")
	out := read(v)
	<-p.Done()
	own, err := strconv.Atoi(strings.TrimSpace(out["stdout"]))
	if err != nil {
		t.Fatalf("output %q", out)
	}
	if p.Pid() != own {
		t.Fatalf("pid %d, the program's own %d", p.Pid(), own)
	}
}

// The limit counts live processes and starts under way, per session;
// a start that fails or is refused, at any step, gives its place back.
func TestReservePendingAccounting(t *testing.T) {
	r := newRig(t, 2)
	// Reservations alone (starts under way) count.
	if err := r.tab.reserve("a", "", Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := r.tab.reserve("a", "", Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := r.tab.reserve("a", "", Limits{}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third reservation of 2: %v", err)
	}
	if err := r.tab.reserve("b", "", Limits{}); err != nil {
		t.Fatalf("another session's own count: %v", err)
	}
	r.tab.unreserve("a", "")
	r.tab.unreserve("a", "")
	r.tab.unreserve("b", "")
	if p := r.pending(); len(p) != 0 {
		t.Fatalf("pending after every unreserve: %v", p)
	}
	if n := r.tab.TenantCount(""); n != 0 {
		t.Fatalf("tenant count after every unreserve: %d", n)
	}

	// Failed and refused starts leave nothing behind: refused before the
	// reservation, after it, by the sandbox (arguments past what exec
	// takes), or given up by the caller.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, try := range map[string]func() error{
		"empty cmd": func() error { _, _, err := r.start("a", &Start{}); return err },
		"bad variable": func() error {
			_, _, err := r.start("a", &Start{Config: Config{Cmd: "true", Env: map[string]string{"LD_PRELOAD": "/x.so"}}})
			return err
		},
		"bad terminal": func() error {
			_, _, err := r.start("a", &Start{Config: Config{Cmd: "true"}, PTY: &Size{Cols: 0, Rows: 1}})
			return err
		},
		"long tag": func() error {
			_, _, err := r.start("a", &Start{Config: Config{Cmd: "true"}, Tag: strings.Repeat("t", MaxTag+1)})
			return err
		},
		"huge arguments": func() error {
			_, _, err := r.start("a", &Start{Config: Config{Cmd: "echo", Args: []string{strings.Repeat("a", 4<<20)}}})
			return err
		},
		"canceled": func() error {
			_, _, err := r.tab.Start(canceled, r.sb, r.base, "a", &Start{Config: Config{Cmd: "true"}, Stdin: true})
			return err
		},
	} {
		if err := try(); err == nil {
			t.Errorf("%s: started", name)
		} else if name != "canceled" && name != "huge arguments" && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		if p := r.pending(); len(p) != 0 {
			t.Fatalf("pending after %s: %v", name, p)
		}
	}

	// Live processes count: two run, a third is refused; once one has
	// ended its place is free.
	p1, _ := r.mustStart("a", "sleep", "100000")
	r.mustStart("a", "sleep", "100000")
	if _, _, err := r.start("a", &Start{Config: Config{Cmd: "true"}}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third process of 2: %v", err)
	}
	if p := r.pending(); len(p) != 0 {
		t.Fatalf("pending after a refused start: %v", p)
	}
	r.mustStart("b", "true") // another session's own count
	p1.Signal(syscall.SIGKILL)
	<-p1.Done()
	if e := p1.End(); e.Status != "signal: killed" || e.ExitCode != -1 {
		t.Fatalf("end after SIGKILL: %+v", e)
	}
	r.mustStart("a", "true")
	if p := r.pending(); len(p) != 0 {
		t.Fatalf("pending after starts: %v", p)
	}
}

// A tenant's processes count together over its sessions: at its limit a
// start in any of its sessions is refused with a *LimitError naming the
// tenant, another tenant starts on, and a process that ends (killed, or
// ending by itself) frees its place. A session's own limit comes first.
func TestTenantLimitSpansSessions(t *testing.T) {
	r := newRig(t, DefaultMax)
	lim := Limits{Session: 2, Tenant: 3}
	start := func(session, tenant string) (*Process, error) {
		p, _, err := r.start(session, &Start{Config: Config{Cmd: "sleep", Args: []string{"100000"}}, Tenant: tenant, Limits: lim})
		return p, err
	}
	p1, err := start("a1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := start("a1", "a"); err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if _, err := start("a1", "a"); !errors.As(err, &le) || le.Scope != "session" || le.Count != 2 || le.Limit != 2 || !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third process of a session of 2: %v", err)
	}
	if _, err := start("a2", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err = start("a3", "a"); !errors.As(err, &le) || le.Scope != "tenant" || le.Count != 3 || le.Limit != 3 {
		t.Fatalf("a fourth process of a tenant of 3: %v", err)
	}
	if !strings.Contains(err.Error(), "the tenant already runs 3 background processes (its limit is 3)") {
		t.Fatalf("the refusal does not say which limit: %v", err)
	}
	if _, err := start("b1", "b"); err != nil {
		t.Fatalf("another tenant's own count: %v", err)
	}
	if s, n := r.tab.Count("a1", "a"); s != 2 || n != 3 {
		t.Fatalf("counts: session %d, tenant %d; want 2, 3", s, n)
	}
	p1.Signal(syscall.SIGKILL)
	<-p1.Done()
	p, err := start("a3", "a")
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	// One that ends by itself frees its place too.
	p.Signal(syscall.SIGTERM)
	<-p.Done()
	if _, _, err := r.start("a3", &Start{Config: Config{Cmd: "true"}, Tenant: "a", Limits: lim}); err != nil {
		t.Fatal(err)
	}
	r.tab.Close()
	if n := r.tab.TenantCount("a"); n != 0 {
		t.Fatalf("tenant count after close: %d", n)
	}
	// A negative limit is none.
	r2 := newRig(t, 1)
	for range 3 {
		if _, _, err := r2.start("s", &Start{Config: Config{Cmd: "sleep", Args: []string{"100000"}}, Tenant: "x", Limits: Limits{Session: -1, Tenant: -1}}); err != nil {
			t.Fatal(err)
		}
	}
}

// Close kills every process of every session and waits for them; their
// viewers see the end (not a lag); nothing starts after.
func TestClose(t *testing.T) {
	r := newRig(t, DefaultMax)
	var procs []*Process
	var viewers []*Viewer
	for _, s := range []string{"a", "a", "b"} {
		p, v, err := r.start(s, &Start{Config: Config{Cmd: "sh", Args: []string{"-c", "echo up; exec sleep 100000"}}, Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		procs, viewers = append(procs, p), append(viewers, v)
	}
	for _, v := range viewers {
		if ev := <-v.C; string(ev.Data) != "up\n" {
			t.Fatalf("first output %q", ev.Data)
		}
	}
	r.tab.Close()
	for i, p := range procs {
		select {
		case <-p.Done():
		default:
			t.Fatalf("process %d runs on after Close returned", i)
		}
		if e := p.End(); e.Status != "signal: killed" {
			t.Fatalf("process %d: %+v", i, e)
		}
		if _, open := <-viewers[i].C; open || viewers[i].Err() != nil {
			t.Fatalf("viewer %d after Close: open %v, error %v", i, open, viewers[i].Err())
		}
		if err := p.SendInput([]byte("x")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("input to a closed process: %v", err)
		}
	}
	if l := append(r.tab.List("a"), r.tab.List("b")...); len(l) != 0 {
		t.Fatalf("listed after Close: %+v", l)
	}
	if _, _, err := r.start("a", &Start{Config: Config{Cmd: "true"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("a start after Close: %v", err)
	}
	if p := r.pending(); len(p) != 0 {
		t.Fatalf("pending after Close: %v", p)
	}
}
