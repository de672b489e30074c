package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/store"
)

// Session metadata, lifetimes and the patrol that ends them (lifetime.go),
// on a real App: real store, real boxes.

// waitFor polls cond until it holds; the deadline is a guard against a
// hang, not a measurement.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// A guard against a hang, not a measurement: what is waited for is a
	// state that follows events of the host (a box's end, a release), and
	// a minute left little room at the loads seen here (up to 90 on 2
	// cores); the other waits of these tests allow 3 minutes too.
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 3 minutes", what)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a wait for something to settle
	}
}

func gone(a *App, id string) bool {
	_, err := a.Sessions.ByIDAnyTenant(context.Background(), id)
	return errors.Is(err, session.ErrNotFound)
}

func TestSessionMetadataEnvAndFilters(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	one := mustCall(t, a, "create_session", CreateSessionInput{Name: "one", Metadata: map[string]string{"team": "a", "role": "web"},
		Env: map[string]string{"GREETING": "hi"}}).(*SessionInfo)
	mustCall(t, a, "create_session", CreateSessionInput{Name: "two", Metadata: map[string]string{"team": "a"}})
	mustCall(t, a, "create_session", CreateSessionInput{Name: "three"})
	if one.Metadata["role"] != "web" || one.SessionState != StateRunning || one.ExpiresAt != nil {
		t.Fatalf("created: %+v", one)
	}
	env := mustCall(t, a, "get_session_env", SessionRef{Session: "one"}).(*EnvOutput)
	if env.Env["GREETING"] != "hi" {
		t.Fatalf("env %v", env.Env)
	}
	names := func(in ListSessionsInput) string {
		l := mustCall(t, a, "list_sessions", in).(*SessionList)
		var n []string
		for _, s := range l.Sessions {
			n = append(n, s.Name)
		}
		return strings.Join(n, ",")
	}
	if got := names(ListSessionsInput{Metadata: map[string]string{"team": "a"}}); got != "one,two" {
		t.Fatalf("team=a: %s", got)
	}
	if got := names(ListSessionsInput{Metadata: map[string]string{"team": "a", "role": "web"}}); got != "one" {
		t.Fatalf("team=a role=web: %s", got)
	}
	if got := names(ListSessionsInput{State: []string{StatePaused}}); got != "" {
		t.Fatalf("paused: %s", got)
	}
	if _, err := call(t, a, "list_sessions", ListSessionsInput{State: []string{"sleeping"}}); err == nil || !strings.Contains(err.Error(), "running or paused") {
		t.Fatalf("bad state: %v", err)
	}

	// Out of bounds: refused with what to fix, and nothing is made.
	before := len(mustCall(t, a, "list_sessions", ListSessionsInput{}).(*SessionList).Sessions)
	many := map[string]string{}
	for i := range session.MaxMetadataPairs + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		in   CreateSessionInput
		want string
	}{
		{CreateSessionInput{Metadata: many}, "at most 64"},
		{CreateSessionInput{Metadata: map[string]string{strings.Repeat("k", 129): "v"}}, "at most 128"},
		{CreateSessionInput{Metadata: map[string]string{"k": strings.Repeat("v", 1025)}}, "at most 1024"},
		{CreateSessionInput{Metadata: map[string]string{"": "v"}}, "empty"},
		{CreateSessionInput{Metadata: map[string]string{"k": "a\nb"}}, "control"},
		{CreateSessionInput{Env: map[string]string{"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD"},
		{CreateSessionInput{Env: map[string]string{"1A": "x"}}, "1A"},
		{CreateSessionInput{TimeoutS: -1}, "timeout_s"},
		{CreateSessionInput{TimeoutS: 400 * 24 * 3600}, "at most"},
		{CreateSessionInput{OnTimeout: "explode"}, "destroy or pause"},
	} {
		_, err := call(t, a, "create_session", tc.in)
		if err == nil {
			t.Errorf("%+v: accepted", tc.in)
			continue
		}
		ce := wantCode(t, err, capability.InvalidArgument)
		if !strings.Contains(ce.Message, tc.want) {
			t.Errorf("%+v: %q lacks %q", tc.in, ce.Message, tc.want)
		}
	}
	if after := len(mustCall(t, a, "list_sessions", ListSessionsInput{}).(*SessionList).Sessions); after != before {
		t.Fatalf("refused creates left sessions: %d → %d", before, after)
	}
}

// A lifetime ends in a destroy, promptly; set_session_timeout shortens and
// extends it, and 0 removes it.
func TestSessionLifetimeDestroys(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	a.startLifetimes() // as Supervise does
	short := mustCall(t, a, "create_session", CreateSessionInput{Name: "short", TimeoutS: 1}).(*SessionInfo)
	if short.ExpiresAt == nil || short.OnTimeout != session.ExpiryDestroy {
		t.Fatalf("no lifetime: %+v", short)
	}
	// An hour, not a second: at load the create and the call below took
	// longer than a second, and the session had expired (destroyed, "not
	// found") before its lifetime was removed.
	kept := mustCall(t, a, "create_session", CreateSessionInput{Name: "kept", TimeoutS: 3600}).(*SessionInfo)
	if kept.ExpiresAt == nil {
		t.Fatalf("no lifetime: %+v", kept)
	}
	mustCall(t, a, "set_session_timeout", SetTimeoutInput{Session: "kept", TimeoutS: 0})
	long := mustCall(t, a, "create_session", CreateSessionInput{Name: "long", TimeoutS: 3600}).(*SessionInfo)
	shortened := mustCall(t, a, "set_session_timeout", SetTimeoutInput{Session: "long", TimeoutS: 1}).(*SessionInfo)
	if shortened.ExpiresAt == nil || !shortened.ExpiresAt.Before(*long.ExpiresAt) {
		t.Fatalf("not shortened: %v → %v", long.ExpiresAt, shortened.ExpiresAt)
	}
	waitFor(t, "the expired sessions destroyed", func() bool { return gone(a, short.ID) && gone(a, long.ID) })
	st := status(t, a, kept.ID)
	if st.ExpiresAt != nil {
		t.Fatalf("a removed lifetime is back: %+v", st)
	}
	// The session whose lifetime was removed outlived the others' end (the
	// patrol that ended them passed it by).
	if gone(a, kept.ID) {
		t.Fatal("a session with no lifetime was destroyed")
	}
}

// A lifetime extended after the patrol read the due sessions, but before
// it ended this one, is kept: the patrol looks at each again right before
// ending it.
func TestSessionLifetimeExtendedMeanwhile(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	ctx := context.Background()
	saved := mustCall(t, a, "create_session", CreateSessionInput{Name: "saved", TimeoutS: 3600}).(*SessionInfo)
	ended := mustCall(t, a, "create_session", CreateSessionInput{Name: "ended", TimeoutS: 3600}).(*SessionInfo)
	// Both lifetimes are over (set in the store: no patrol runs here, the
	// test takes its one look itself).
	for _, id := range []string{saved.ID, ended.ID} {
		if err := a.Store.SetSessionLifetime(ctx, id, time.Now().Add(-time.Second), session.ExpiryDestroy); err != nil {
			t.Fatal(err)
		}
	}
	listed := 0
	a.life.listed = func(due []*session.Session) {
		listed = len(due)
		// setTimeout lands between the patrol's list and its destroy.
		mustCall(t, a, "set_session_timeout", SetTimeoutInput{Session: saved.ID, TimeoutS: 3600})
	}
	a.endExpired(ctx)
	if listed != 2 {
		t.Fatalf("the patrol listed %d due sessions, want 2", listed)
	}
	if gone(a, saved.ID) {
		t.Fatal("a session whose lifetime was extended after the patrol's list was destroyed")
	}
	if st := status(t, a, saved.ID); st.ExpiresAt == nil || st.ExpiresAt.Before(time.Now()) {
		t.Fatalf("the extended lifetime: %+v", st.ExpiresAt)
	}
	if !gone(a, ended.ID) {
		t.Fatal("the session whose lifetime was not extended is still there")
	}
}

// One slow destroy (its session's call takes long to return) does not hold
// back the end of the other expired sessions.
func TestSessionLifetimesEndedTogether(t *testing.T) {
	t.Parallel()
	// The slow destroy waits until the test releases its call.
	a, err := New(context.Background(), t.TempDir(), &Options{Python: testPython, DestroyGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ctx := context.Background()
	slow := mustCall(t, a, "create_session", CreateSessionInput{Name: "slow", TimeoutS: 3600}).(*SessionInfo)
	quick := mustCall(t, a, "create_session", CreateSessionInput{Name: "quick", TimeoutS: 3600}).(*SessionInfo)
	// slow's lifetime ended first: the patrol comes to it first.
	for i, id := range []string{slow.ID, quick.ID} {
		if err := a.Store.SetSessionLifetime(ctx, id, time.Now().Add(time.Duration(i-10)*time.Second), session.ExpiryDestroy); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := a.Sessions.ByIDAnyTenant(ctx, slow.ID)
	if err != nil {
		t.Fatal(err)
	}
	callCtx, release, err := a.lives.EnterSession(ctx, sess, capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ended := make(chan struct{})
	go func() { defer close(ended); a.endExpired(ctx) }()
	<-callCtx.Done() // slow's destroy waits for this call
	waitFor(t, "the other expired session destroyed while the slow destroy waits", func() bool { return gone(a, quick.ID) })
	if gone(a, slow.ID) {
		t.Fatal("the slow destroy ended before its call returned")
	}
	release()
	<-ended
	if !gone(a, slow.ID) {
		t.Fatal("the slow session was not destroyed")
	}
}

// A lifetime set while the session's destroy waits for its calls is
// refused (not found), not reported set on a session about to go.
func TestSessionLifetimeNotSetDuringDestroy(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	ctx := context.Background()
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "going", TimeoutS: 3600}).(*SessionInfo)
	sess, err := a.Sessions.ByIDAnyTenant(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	// A call in flight, which the destroy cancels and waits for.
	callCtx, release, err := a.lives.EnterSession(ctx, sess, capability.UseHold)
	if err != nil {
		t.Fatal(err)
	}
	destroyed := make(chan error, 1)
	go func() { destroyed <- a.destroySession(ctx, sess) }()
	<-callCtx.Done() // the destroy has begun: it canceled the call
	_, err = call(t, a, "set_session_timeout", SetTimeoutInput{Session: s.ID, TimeoutS: 3600})
	release()
	wantCode(t, err, capability.NotFound)
	if err := <-destroyed; err != nil {
		t.Fatal(err)
	}
}

// Code in a session cannot extend (or end) its own lifetime.
func TestSessionLifetimeNotSetFromInside(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "boxed", TimeoutS: 600}).(*SessionInfo)
	inside := controller.Caller{Path: "insession", Scope: capability.ScopeExec, Session: s.ID}
	_, err := callAs(t, a, inside, "set_session_timeout", SetTimeoutInput{Session: s.ID, TimeoutS: 0})
	wantCode(t, err, capability.PermissionDenied)
	if st := status(t, a, s.ID); st.ExpiresAt == nil || !st.ExpiresAt.Equal(*s.ExpiresAt) {
		t.Fatalf("lifetime changed from inside: %v → %v", s.ExpiresAt, st.ExpiresAt)
	}
}

// A lifetime that ends with pause freezes the session's box (its
// processes and memory kept) and leaves the session, with no lifetime.
func TestSessionLifetimePauses(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	a.startLifetimes() // as Supervise does
	needBoxes(t, a)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "nap", TimeoutS: 3600, OnTimeout: session.ExpiryPause}).(*SessionInfo)
	// A box with a process in it.
	mustCall(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "X=kept"})
	if bx := a.Sandbox.Box(s.ID); bx == nil || !bx.CanPause() {
		t.Skip("this machine cannot freeze a box")
	}
	mustCall(t, a, "set_session_timeout", SetTimeoutInput{Session: s.ID, TimeoutS: 1})
	// Paused, then its lifetime removed (two steps: wait for both).
	waitFor(t, "the session paused", func() bool {
		st := status(t, a, s.ID)
		return st.SessionState == StatePaused && st.ExpiresAt == nil
	})
	st := status(t, a, s.ID)
	if st.ExpiresAt != nil || gone(a, s.ID) {
		t.Fatalf("paused session: %+v", st)
	}
	l := mustCall(t, a, "list_sessions", ListSessionsInput{State: []string{StatePaused}}).(*SessionList)
	if len(l.Sessions) != 1 || l.Sessions[0].ID != s.ID {
		t.Fatalf("paused list: %+v", l.Sessions)
	}
	// Used again, it resumes where it was.
	res := mustCall(t, a, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "echo $X"})
	if out := fmt.Sprint(res); !strings.Contains(out, "kept") {
		t.Fatalf("after resume: %s", out)
	}
}

// A lifetime that ends with pause pauses the session even while a stream
// follows a process in it (E2B pauses regardless of open streams); the
// stream stays open and goes on when the session is used again.
func TestSessionLifetimePausesWithAStreamOpen(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	a.startLifetimes() // as Supervise does
	needBoxes(t, a)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "streaming", TimeoutS: 3600, OnTimeout: session.ExpiryPause}).(*SessionInfo)
	start := startStream(t, a, admin, "start_process", StartProcessInput{Session: s.ID, Stdin: true,
		Cmd: "sh", Args: []string{"-c", `echo early; while read x; do echo "got $x"; done`}})
	pid := start.pid(t)
	start.out.waitFor(t, "stdout", "early\n", start.done)
	if bx := a.Sandbox.Box(s.ID); bx == nil || !bx.CanPause() {
		t.Skip("this machine cannot freeze a box")
	}
	mustCall(t, a, "set_session_timeout", SetTimeoutInput{Session: s.ID, TimeoutS: 1})
	waitFor(t, "the session paused with a stream open", func() bool {
		st := status(t, a, s.ID)
		return st.SessionState == StatePaused && st.ExpiresAt == nil
	})
	if !a.Sandbox.Box(s.ID).Paused() {
		t.Fatal("the session is marked paused but its box runs")
	}
	select {
	case <-start.done:
		t.Fatalf("the stream ended at the pause: %+v %v", start.res, start.err)
	default:
	}
	// Used again (input for the process), it resumes and the stream goes on.
	mustCall(t, a, "send_process_input", ProcessInputInput{ProcessSelector: ProcessSelector{Session: s.ID, Pid: pid}, Data: "hello\n"})
	start.out.waitFor(t, "stdout", "got hello\n", start.done)
	mustCall(t, a, "close_process_stdin", ProcessSelector{Session: s.ID, Pid: pid})
	if res := start.wait(t); res.Running || res.ExitCode != 0 {
		t.Fatalf("after the resume: %+v", res)
	}
}

// Sessions whose lifetime ended while no server ran are ended when the
// next one starts.
func TestSessionLifetimeEndedAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	a, err := New(ctx, dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "stale", TimeoutS: 3600}).(*SessionInfo)
	a.Close()
	// The lifetime ends while the server is down.
	st, err := store.Open(ctx, dir+"/quro.db")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetSessionLifetime(ctx, s.ID, time.Now().Add(-time.Minute), ""); err != nil {
		t.Fatal(err)
	}
	st.Close()
	b, err := New(ctx, dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if gone(b, s.ID) {
		t.Fatal("opening the data directory (as a one-shot CLI command does) ended a session: only a server's patrol may")
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go b.Supervise(ctx, time.Minute) // the server's start
	waitFor(t, "the stale session destroyed at start", func() bool { return gone(b, s.ID) })
}

// A spare is still claimed when the new session has metadata, env and a
// lifetime, and gets them.
func TestSpareClaimedWithLifetime(t *testing.T) {
	t.Parallel()
	a, _ := newSpareApp(t, 1)
	spares := waitSpares(t, a, localNone, 1)
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "quick", TimeoutS: 600, OnTimeout: session.ExpiryPause,
		Metadata: map[string]string{"from": "spare"}, Env: map[string]string{"SPARE_VAR": "yes"}}).(*SessionInfo)
	if s.ID != spares[0].ID {
		t.Fatalf("made %s, not the spare %s", s.ID, spares[0].ID)
	}
	if s.ExpiresAt == nil || s.OnTimeout != session.ExpiryPause || s.Metadata["from"] != "spare" {
		t.Fatalf("claimed: %+v", s)
	}
	res := runCode(t, a, RunCodeInput{Session: s.ID, Lang: "python", Code: "import os; print(os.environ.get('SPARE_VAR'))"})
	if !strings.Contains(res.Stdout, "yes") {
		t.Fatalf("the spare's worker lacks the session's env: %+v", res)
	}
}

// A session with nothing running in it is paused all the same: its state
// says so, also after a restart, until it is resumed or used.
func TestPauseWithoutABoxIsAState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	a, err := New(ctx, dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	s := mustCall(t, a, "create_session", CreateSessionInput{Name: "idle"}).(*SessionInfo)
	if a.Sandbox.Box(s.ID) != nil {
		t.Fatal("a new session has a box already")
	}
	if r := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult); !r.Paused {
		t.Fatalf("pause: %+v", r)
	}
	if st := status(t, a, s.ID); st.SessionState != StatePaused {
		t.Fatalf("after pause: %s", st.SessionState)
	}
	a.Close()
	b, err := New(ctx, dir, &Options{Python: testPython})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if st := status(t, b, s.ID); st.SessionState != StatePaused {
		t.Fatalf("after a restart: %s", st.SessionState)
	}
	// Used, it runs again.
	mustCall(t, b, "terminal_exec", TerminalExecInput{Session: s.ID, Command: "true"})
	if st := status(t, b, s.ID); st.SessionState != StateRunning {
		t.Fatalf("after use: %s", st.SessionState)
	}
	mustCall(t, b, "pause_session", SessionRef{Session: s.ID})
	if r := mustCall(t, b, "resume_session", SessionRef{Session: s.ID}).(*PauseResult); r.Paused || status(t, b, s.ID).SessionState != StateRunning {
		t.Fatalf("resume: %+v", r)
	}
}
