package app

import "testing"

// TestIdlePythonWorkerReleased: the idle release (what the worker's idle
// timer does, called here) ends the session's worker, so its box holds no
// process; the next run starts a fresh interpreter that works and says
// the variables are gone, once. A paused session keeps its worker and its
// variables across the release.
func TestIdlePythonWorkerReleased(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	needBoxes(t, a)
	needEmbedded(t, a)
	s := newSession(t, a, "idle", "")
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "x = 41"}); res.ExitCode != 0 {
		t.Fatal(res)
	}
	if st := status(t, a, s.ID); st.Resources == nil || st.Resources.Processes != 1 {
		t.Fatalf("status %+v: want one process (the worker) in the box", st.Resources)
	}
	if !a.Python.ReleaseIdle(s.ID) {
		t.Fatal("ReleaseIdle released nothing")
	}
	if st := status(t, a, s.ID); st.Resources == nil || st.Resources.Processes != 0 {
		t.Fatalf("status %+v: the released worker is still in the box", st.Resources)
	}
	res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print('x' in globals())\nx = 1"})
	if res.ExitCode != 0 || res.Stdout != "False\n" ||
		!hasNoteWith(res, "the Python interpreter was restarted: it had been idle for 15 min") {
		t.Fatalf("the run after the release: %+v", res)
	}
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print(x)"}); res.Stdout != "1\n" || len(res.Notes) != 0 {
		t.Fatalf("the run after that: %+v", res)
	}

	// Paused: the worker and its variables stay.
	if p := mustCall(t, a, "pause_session", SessionRef{Session: s.ID}).(*PauseResult); !p.Paused {
		t.Fatalf("pause_session: %+v", p)
	}
	if a.Python.ReleaseIdle(s.ID) {
		t.Fatal("a paused session's worker was released")
	}
	mustCall(t, a, "resume_session", SessionRef{Session: s.ID})
	if res := runCode(t, a, RunCodeInput{Session: s.ID, Code: "print(x)"}); res.Stdout != "1\n" || len(res.Notes) != 0 {
		t.Fatalf("the run after pause, release and resume: %+v", res)
	}
}
