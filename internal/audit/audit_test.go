package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/store"
)

func TestSummarizeLeavesSecretsOut(t *testing.T) {
	for _, tc := range []struct{ args, want, never string }{
		{`{"code":"print(1)\nprint('secret-ish')","lang":"py"}`, `code="print(1) …(28 bytes)" lang="py"`, "secret-ish"},
		{`{"session":"s1","env":{"API_KEY":"hunter2"}}`, `env=names["API_KEY"] <values redacted, 7 bytes> session="s1"`, "hunter2"},
		{`{"env":{"LD_PRELOAD":"/w/x.so","OLD":null}}`, `env=names["LD_PRELOAD","OLD"] <values redacted, 7 bytes>`, "x.so"},
		{`{"env":"LD_PRELOAD=/w/x.so"}`, `env=<18 bytes>`, "x.so"},
		{`{"session":"s1","path":"a.txt","content":"TOPSECRET"}`, `content=<9 bytes> path="a.txt" session="s1"`, "TOPSECRET"},
		{`{"session":"s","data":"pass\n"}`, `data=<5 bytes> session="s"`, "pass"},
		{`{"timeout_ms":500}`, `timeout_ms=500`, ""},
		// set_session_secret's value: its size only.
		{`{"hosts":["api.example.com"],"name":"API_KEY","value":"sk-hunter2"}`, `hosts=<19 bytes> name="API_KEY" value=<10 bytes>`, "hunter2"},
		// Text as written, not HTML-escaped; sizes of the content, not its JSON.
		{`{"command":"ls -l > out.txt && cat <in"}`, `command="ls -l > out.txt && cat <in"`, `\u003e`},
		{`{"path":"notes/a&b.txt","content":"hello\n"}`, `content=<6 bytes> path="notes/a&b.txt"`, `\u0026`},
		{`{"path":"é.txt","content":"é\u00e9\"\\"}`, `content=<6 bytes> path="é.txt"`, ""},
		{`{"content":"aGVsbG8K","encoding":"base64"}`, `content=<6 bytes> encoding="base64"`, ""},
		{`{"content":"not base64!","encoding":"base64"}`, `content=<11 bytes> encoding="base64"`, ""},
		{`{"args":[1, 2]}`, `args=<6 bytes>`, ""},
		// A process's argv says what ran (E2B's commands.run), as a command.
		{`{"args":["-l","-c","curl -H 'X-API-KEY: e2b_0a1b2c3d4e5f00112233445566778899' x\nmore"]}`,
			`args="-l -c curl -H 'X-API-KEY: e2b_0a1b2c3d4e5f<secret redacted>' x …(67 bytes)"`, "0011223344"},
		{`{"code":"print('a\u003cb')\nx"}`, `code="print('a<b') …(14 bytes)"`, ""},
		{`{"name":"tab\there\u2028\u0000"}`, `name="tab\there\u2028\u0000"`, ""},
		// A terminal escape stays escaped: the log is read on terminals.
		{`{"command":"echo \u001b[2J\u001b]0;pwned\u0007"}`, `command="echo \u001b[2J\u001b]0;pwned\u0007"`, "\x1b"},
		// A whole token where its id was asked for, or in a command: the id
		// stays (it names the token), the secret never.
		{`{"id":"quro_0a1b2c3d4e5f_S3cr3t-_partOfIt"}`, `id="quro_0a1b2c3d4e5f_<secret redacted>"`, "S3cr3t"},
		{`{"command":"curl -H 'Authorization: Bearer quro_ab12_Zz9-x_y' x"}`, `command="curl -H 'Authorization: Bearer quro_ab12_<secret redacted>' x"`, "Zz9"},
		// The E2B spelling of a token (e2b_<id hex><secret hex>) and a
		// sandbox's access token, in code.
		{`{"code":"os.environ['E2B_API_KEY']='e2b_0a1b2c3d4e5f9d31d3fdfb4118ecc0fa89dab35c2a172f0cc1aabb'"}`,
			`code="os.environ['E2B_API_KEY']='e2b_0a1b2c3d4e5f<secret redacted>'"`, "9d31d3"},
		{`{"cwd":"qa_442d0f8a1b2c3d4e5f60718293a4b5c6d7e8f9012345678901234567890abcd"}`, `cwd="qa_<secret redacted>"`, "442d0f"},
		{`{}`, ``, ""},
		{``, ``, ""},
		{`[1,2]`, `(5 bytes, not a JSON object)`, ""},
	} {
		got := Summarize(json.RawMessage(tc.args))
		if got != tc.want {
			t.Errorf("%s: got %q want %q", tc.args, got, tc.want)
		}
		if tc.never != "" && strings.Contains(got, tc.never) {
			t.Errorf("%s: secret in %q", tc.args, got)
		}
	}
	huge := `{"code":"` + strings.Repeat("x", 1<<20) + `","name":"` + strings.Repeat("é", 500) + `"}`
	if got := Summarize(json.RawMessage(huge)); len(got) > 1100 {
		t.Errorf("summary of 1 MiB is %d bytes", len(got))
	}
}

func newLog(t *testing.T, keep int64) (*Log, *store.Store) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "quro.db"))
	if err != nil {
		t.Fatal(err)
	}
	l := New(st, &Options{Keep: keep})
	t.Cleanup(func() { l.Close(); st.Close() })
	return l, st
}

func record(tenant, name string, err *capability.Error) *controller.Record {
	r := &controller.Record{Start: time.Now(), Caller: controller.Caller{Path: "rest", Tenant: tenant, TokenID: "tok"},
		Capability: name, Args: json.RawMessage(`{"code":"1+1"}`), Outcome: "ok", Duration: 1500 * time.Microsecond}
	if err != nil {
		r.Outcome, r.Err = string(err.Code), err
	}
	return r
}

// A query sees every call recorded before it, though writing is batched.
func TestEntriesSeeEarlierCalls(t *testing.T) {
	l, _ := newLog(t, 0)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := []string{"a", "b"}[i%2]
			l.Observe(ctx, record(tenant, "run_code", nil))
		}()
	}
	wg.Wait()
	l.Observe(ctx, record("a", "list_sessions", capability.Errorf(capability.NotFound, "no session x")))
	got, err := l.Entries(ctx, Query{Tenant: "a", Limit: 1000})
	if err != nil || len(got) != 101 {
		t.Fatalf("%d entries, %v", len(got), err)
	}
	last := got[len(got)-1]
	if last.Capability != "list_sessions" || last.Outcome != "not_found" || last.Message != "no session x" ||
		last.TokenID != "tok" || last.Path != "rest" || last.DurationMS != 1.5 || last.Args != `code="1+1"` {
		t.Fatalf("%+v", last)
	}
	got, _ = l.Entries(ctx, Query{Tenant: "b"})
	if len(got) != 50 {
		t.Fatalf("default limit gave %d", len(got))
	}
	got, _ = l.Entries(ctx, Query{Tenant: "c"})
	if len(got) != 0 {
		t.Fatalf("tenant c sees %d", len(got))
	}
}

func TestCloseWritesPending(t *testing.T) {
	file := filepath.Join(t.TempDir(), "quro.db")
	st, err := store.Open(context.Background(), file)
	if err != nil {
		t.Fatal(err)
	}
	l := New(st, nil)
	for range 10 {
		l.Observe(context.Background(), record("", "help", nil))
	}
	l.Close()
	l.Observe(context.Background(), record("", "after close", nil)) // dropped, not a panic
	rows, err := st.Audit(context.Background(), store.AuditFilter{Limit: 100})
	st.Close()
	if err != nil || len(rows) != 10 {
		t.Fatalf("%d rows after close, %v", len(rows), err)
	}
}

func TestKeepBoundsTheLog(t *testing.T) {
	l, _ := newLog(t, 30)
	ctx := context.Background()
	for range 100 {
		l.Observe(ctx, record("", "help", nil))
		l.Flush(ctx)
	}
	got, _ := l.Entries(ctx, Query{Limit: 1000})
	if len(got) != 30 || got[len(got)-1].Seq != 100 {
		t.Fatalf("%d entries, last %+v", len(got), got[len(got)-1])
	}
}

// holdWriteLock takes SQLite's write lock on file from a connection of its
// own (another process would do the same): the audit writer's
// transactions wait behind it, as behind a disk that does not keep up.
// The returned func releases it.
func holdWriteLock(t *testing.T, file string) func() {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Error(err)
		}
		conn.Close()
		db.Close()
	}
	t.Cleanup(release)
	return release
}

func (l *Log) pendingLen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// TestPendingBoundedUnderAHeldWriteLock: with the database's write lock
// held elsewhere, the entries waiting never exceed MaxPending; calls past
// the bound wait, then their entries are dropped and counted; once the
// lock goes, the log holds what was kept and a gap entry with the count,
// and kept + lost is every call.
func TestPendingBoundedUnderAHeldWriteLock(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	st, err := store.Open(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const max, calls = 4, 30
	l := New(st, &Options{MaxPending: max, Wait: time.Millisecond})
	defer l.Close()
	release := holdWriteLock(t, file)
	for i := range calls {
		l.Observe(ctx, &controller.Record{Caller: controller.Caller{Tenant: "acme"}, Capability: "run_code",
			Args: json.RawMessage(fmt.Sprintf(`{"code":"print(%d)"}`, i)), Outcome: "ok", Start: time.Now()})
		if n := l.pendingLen(); n > max {
			t.Fatalf("%d entries pending after call %d, bound %d", n, i, max)
		}
	}
	// At most one batch (≤ max) is in the writer's hands, ≤ max wait.
	lost := l.Lost()
	if lost < calls-2*max {
		t.Fatalf("%d lost of %d calls with at most %d held", lost, calls, 2*max)
	}
	release()
	got, err := l.Entries(ctx, Query{Tenant: "acme", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	// One gap entry per batch that followed losses (the first calls past
	// the bound may be dropped while the writer still lingers before its
	// first batch): their counts add up to Lost.
	kept, gapped := 0, 0
	for _, e := range got {
		switch e.Capability {
		case "run_code":
			kept++
		case GapCapability:
			n := gapCount(e.Message)
			if e.Outcome != GapOutcome || n <= 0 || !strings.HasPrefix(e.Message, fmt.Sprintf("%d audit entries", n)) {
				t.Errorf("gap entry %+v", e)
			}
			gapped += n
		}
	}
	if int64(gapped) != lost || int64(kept)+lost != calls {
		t.Fatalf("%d kept + %d lost (%d in gap entries) != %d calls: %+v", kept, lost, gapped, calls, got)
	}
}

// TestFullLogWaitsForRoom: a call at the bound waits for the writer (back
// pressure) and loses nothing when the writer catches up within Wait.
func TestFullLogWaitsForRoom(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "quro.db")
	st, err := store.Open(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const max = 2
	l := New(st, &Options{MaxPending: max, Wait: time.Hour})
	defer l.Close()
	release := holdWriteLock(t, file)
	rec := func() *controller.Record {
		return &controller.Record{Caller: controller.Caller{Tenant: "acme"}, Capability: "ping", Outcome: "ok", Start: time.Now()}
	}
	// Fill: the writer takes a batch and blocks on the lock; then the
	// pending entries reach the bound.
	for l.pendingLen() < max {
		l.Observe(ctx, rec())
	}
	done := make(chan struct{})
	go func() {
		l.Observe(ctx, rec()) // blocks: no room until the lock goes
		close(done)
	}()
	release()
	<-done
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if l.Lost() != 0 {
		t.Fatalf("%d lost", l.Lost())
	}
}

// The filters on the server's side: outcome (ok, failed, one outcome),
// session, and background reads left out unless asked for.
func TestEntriesFilters(t *testing.T) {
	t.Parallel()
	l, _ := newLog(t, 0)
	ctx := context.Background()
	add := func(name, sess string, err *capability.Error, bg bool) {
		r := record("a", name, err)
		r.Session, r.Background = sess, bg
		l.Observe(ctx, r)
	}
	add("run_code", "s1", nil, false)
	add("run_code", "s2", capability.Errorf(capability.NotFound, "no"), false)
	add("terminal_exec", "s1", capability.Errorf(capability.Busy, "busy"), false)
	add("list_sessions", "", nil, true)
	names := func(q Query) string {
		q.Tenant = "a"
		got, err := l.Entries(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, e := range got {
			s = append(s, e.Capability+"/"+e.Session+"/"+e.Outcome)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		q    Query
		want string
	}{
		{Query{}, "run_code/s1/ok run_code/s2/not_found terminal_exec/s1/busy"},
		{Query{Background: true}, "run_code/s1/ok run_code/s2/not_found terminal_exec/s1/busy list_sessions//ok"},
		{Query{Outcome: "ok"}, "run_code/s1/ok"},
		{Query{Outcome: "failed"}, "run_code/s2/not_found terminal_exec/s1/busy"},
		{Query{Outcome: "busy"}, "terminal_exec/s1/busy"},
		{Query{Session: "s1"}, "run_code/s1/ok terminal_exec/s1/busy"},
		{Query{Session: "s1", Outcome: "failed"}, "terminal_exec/s1/busy"},
		{Query{Outcome: "x' OR '1'='1"}, ""},
	} {
		if got := names(tc.q); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.q, got, tc.want)
		}
	}
	got, _ := l.Entries(ctx, Query{Tenant: "a", Background: true, Capability: "list_sessions"})
	if len(got) != 1 || !got[0].Background {
		t.Fatalf("the background read: %+v", got)
	}
}
