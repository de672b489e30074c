package js

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/session"
)

type ctxRun struct {
	*runcode.Result
	out, err string
}

func runKept(t *testing.T, e *Engine, s *session.Session, lang, id, code string) ctxRun {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng := runcode.Engine(e)
	if lang == "ts" {
		eng = e.TS()
	}
	res, err := eng.Run(ctx, &runcode.Request{Code: code, Lang: lang, Session: s, Timeout: time.Minute,
		Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: id, Rich: true}})
	if err != nil {
		t.Fatalf("Run(%q): %v", code, err)
	}
	return ctxRun{res, out.String(), errb.String()}
}

func mainText(r ctxRun) string {
	for _, x := range r.Results {
		if x.Main {
			s, _ := x.Data["text/plain"].(string)
			return s
		}
	}
	return "<none>"
}

// A context's top-level declarations (let, const, function, class) last
// across its runs; another context, and run_code's plain runs, see none
// of them.
func TestContextKeepsState(t *testing.T) {
	e := New(nil)
	defer e.Close()
	s := newSession(t, "ctx")
	runKept(t, e, s, "js", "a", "let n = 40; const two = 2; function add(x, y) { return x + y }; class K { v() { return 1 } }")
	if r := runKept(t, e, s, "js", "a", "n = add(n, two); n + new K().v()"); mainText(r) != "43" || r.ExecutionCount != 2 {
		t.Errorf("second run: %q count %d (%q %q %+v)", mainText(r), r.ExecutionCount, r.out, r.err, r.Exception)
	}
	// TypeScript runs in the same VM.
	if r := runKept(t, e, s, "ts", "a", "const m: number = n * 2; m"); mainText(r) != "84" {
		t.Errorf("ts run: %q %+v", mainText(r), r.Exception)
	}
	if r := runKept(t, e, s, "js", "b", "typeof n"); mainText(r) != `"undefined"` {
		t.Errorf("context b sees a's n: %q", mainText(r))
	}
	if r := runKept(t, e, s, "js", "a", "console.log('out'); throw new TypeError('bad')"); r.Exception == nil ||
		r.Exception.Name != "TypeError" || r.Exception.Value != "bad" || r.err != "" || r.out != "out\n" {
		t.Errorf("error: %+v stdout %q stderr %q", r.Exception, r.out, r.err)
	}
	// Dropped (restart, removal): a fresh VM under the same id.
	if err := e.DropContext(context.Background(), s.ID, "a"); err != nil {
		t.Fatal(err)
	}
	if r := runKept(t, e, s, "js", "a", "typeof n"); mainText(r) != `"undefined"` || r.ExecutionCount != 1 {
		t.Errorf("after the drop: %q count %d", mainText(r), r.ExecutionCount)
	}
}

// The kept VMs are capped per session, and every one is closed with its
// context.
func TestContextCaps(t *testing.T) {
	e := New(nil)
	defer e.Close()
	s := newSession(t, "caps")
	for i := range MaxContextsPerSession {
		runKept(t, e, s, "js", string(rune('a'+i)), "1")
	}
	var out, errb bytes.Buffer
	_, err := e.Run(context.Background(), &runcode.Request{Code: "1", Lang: "js", Session: s, Timeout: time.Minute,
		Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: "one-too-many"}})
	if !errors.Is(err, ErrContextLimit) || !strings.Contains(err.Error(), "remove_code_context") {
		t.Fatalf("past the cap: %v", err)
	}
	// Another session has its own.
	runKept(t, e, newSession(t, "other"), "js", "a", "1")
	if n := e.Contexts(); n != MaxContextsPerSession+1 {
		t.Fatalf("%d contexts", n)
	}
	for i := range MaxContextsPerSession {
		_ = e.DropContext(context.Background(), s.ID, string(rune('a'+i)))
	}
	if n := e.Contexts(); n != 1 {
		t.Fatalf("%d contexts after the drops", n)
	}
	runKept(t, e, s, "js", "one-too-many", "1")
}

// A run interrupted by its caller keeps the context's state; its timers
// do not run in the next run.
func TestContextInterrupt(t *testing.T) {
	e := New(nil)
	defer e.Close()
	s := newSession(t, "intr")
	runKept(t, e, s, "js", "a", "let n = 0")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var out bytes.Buffer
	w := writerFunc(func(p []byte) {
		if bytes.Contains(p, []byte("looping")) {
			select {
			case <-started:
			default:
				close(started)
			}
		}
		out.Write(p)
	})
	done := make(chan *runcode.Result)
	go func() {
		res, err := e.Run(ctx, &runcode.Request{Code: "setTimeout(() => console.log('late timer'), 0); while (true) { n++; if (n === 1000) console.log('looping') }",
			Lang: "js", Session: s, Timeout: time.Minute, Stdout: w, Stderr: &bytes.Buffer{}, Context: &runcode.ContextRun{ID: "a", Rich: true}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-started:
	case res := <-done: // never hang on a run that ended without the line
		t.Fatalf("the run ended before it printed 'looping': %+v (stdout %q)", res, out.String())
	}
	cancel()
	if res := <-done; !res.Interrupted {
		t.Fatalf("not interrupted: %+v", res)
	}
	a := runKept(t, e, s, "js", "a", "n")
	if v := mainText(a); len(v) < 4 || a.out != "" {
		t.Errorf("after the interrupt: n = %q, stdout %q", v, a.out)
	}
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// The kept VMs live in the server's memory: however many sessions (of
// however many tenants, each within its share) ask, the server holds at
// most MaxContexts.
func TestContextServerCap(t *testing.T) {
	e := New(nil)
	defer e.Close()
	var last *session.Session
	for i := range MaxContexts / MaxContextsPerSession {
		last = newSession(t, "s"+string(rune('a'+i)))
		last.Tenant = fmt.Sprint("t", i*MaxContextsPerSession/MaxContextsPerTenant)
		for j := range MaxContextsPerSession {
			runKept(t, e, last, "js", string(rune('a'+j)), "1")
		}
	}
	var out, errb bytes.Buffer
	_, err := e.Run(context.Background(), &runcode.Request{Code: "1", Lang: "js", Session: newSession(t, "late"), Timeout: time.Minute,
		Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: "a"}})
	if !errors.Is(err, ErrContextLimit) {
		t.Fatalf("past the server's cap: %v", err)
	}
	// A run_code run (no context) is not refused.
	if _, err := e.Run(context.Background(), &runcode.Request{Code: "1", Lang: "js", Session: last, Timeout: time.Minute,
		Stdout: &out, Stderr: &errb}); err != nil {
		t.Fatal(err)
	}
}

// A context's runs see process.env (with the run's own variables) and
// process.cwd(), as E2B's Node kernel; run_code's plain runs do not.
func TestContextProcess(t *testing.T) {
	e := New(nil)
	defer e.Close()
	s := newSession(t, "proc")
	var out, errb bytes.Buffer
	res, err := e.Run(context.Background(), &runcode.Request{Code: "[process.env.WHO, process.env.FOO, process.cwd()].join(' ')", Lang: "js", Session: s,
		Timeout: time.Minute, Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: "p", Rich: true, Dir: "/home/user", Env: map[string]string{"FOO": "bar"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mainText(ctxRun{Result: res}); got != `"proc bar /home/user"` {
		t.Errorf("process: %s (%+v %q)", got, res.Exception, errb.String())
	}
	if r := runKept(t, e, s, "js", "p", "String(process.env.FOO)"); mainText(r) != `"undefined"` {
		t.Errorf("the run's variable outlived it: %s", mainText(r))
	}
}

// One tenant's sessions hold at most MaxContextsPerTenant kept VMs, its
// share of the server's MaxContexts: another tenant still gets its own.
func TestContextTenantShare(t *testing.T) {
	e := New(nil)
	defer e.Close()
	var sessions []*session.Session
	for i := 0; len(sessions)*MaxContextsPerSession < MaxContextsPerTenant+1; i++ {
		s := newSession(t, fmt.Sprint("greedy", i))
		s.Tenant = "greedy"
		sessions = append(sessions, s)
	}
	made := 0
	for _, s := range sessions {
		for i := range MaxContextsPerSession {
			var out, errb bytes.Buffer
			_, err := e.Run(context.Background(), &runcode.Request{Code: "1", Lang: "js", Session: s, Timeout: time.Minute,
				Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: fmt.Sprint("c", i)}})
			if made < MaxContextsPerTenant {
				if err != nil {
					t.Fatalf("context %d of the tenant: %v", made, err)
				}
				made++
				continue
			}
			if !errors.Is(err, ErrContextLimit) || !strings.Contains(err.Error(), "tenant's share of the JavaScript/TypeScript contexts") {
				t.Fatalf("past the tenant's share: %v", err)
			}
		}
	}
	other := newSession(t, "other")
	other.Tenant = "other"
	runKept(t, e, other, "js", "a", "1")
	if n := e.Contexts(); n != MaxContextsPerTenant+1 {
		t.Errorf("%d contexts", n)
	}
}

// A server at MaxContexts closes the VM idle the longest (past IdleEvict)
// to make room; that context's next run starts afresh and says its state
// was lost.
func TestContextIdleEviction(t *testing.T) {
	old := IdleEvict
	IdleEvict = 0 // every VM not running counts as idle
	defer func() { IdleEvict = old }()
	e := New(nil)
	defer e.Close()
	var first *session.Session
	for i := range MaxContexts / MaxContextsPerSession {
		s := newSession(t, fmt.Sprint("s", i))
		s.Tenant = fmt.Sprint("t", i*MaxContextsPerSession/MaxContextsPerTenant)
		if first == nil {
			first = s
		}
		for j := range MaxContextsPerSession {
			runKept(t, e, s, "js", fmt.Sprint("c", j), "var kept = 'yes'")
		}
	}
	late := newSession(t, "late")
	late.Tenant = "late"
	runKept(t, e, late, "js", "a", "1")
	if n := e.Contexts(); n != MaxContexts {
		t.Errorf("%d contexts", n)
	}
	// The first context made was idle the longest: it was the one closed.
	r := runKept(t, e, first, "js", "c0", "typeof kept")
	if mainText(r) != `"undefined"` || !strings.Contains(r.err, "state was lost") || r.ExecutionCount != 1 {
		t.Errorf("the evicted context's next run: %s %q count %d", mainText(r), r.err, r.ExecutionCount)
	}
	// It said so once.
	if r := runKept(t, e, first, "js", "c0", "1"); strings.Contains(r.err, "state was lost") {
		t.Errorf("said twice: %q", r.err)
	}
	// Without idle VMs, the cap refuses.
	IdleEvict = time.Hour
	var out, errb bytes.Buffer
	if _, err := e.Run(context.Background(), &runcode.Request{Code: "1", Lang: "js", Session: late, Timeout: time.Minute,
		Stdout: &out, Stderr: &errb, Context: &runcode.ContextRun{ID: "b"}}); !errors.Is(err, ErrContextLimit) {
		t.Errorf("full, nothing idle: %v", err)
	}
}
