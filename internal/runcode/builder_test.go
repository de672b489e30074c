package runcode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/sandbox"
)

// building is a Builder that reports the deadline its run got.
type building struct {
	deadline *time.Duration
	req      **Request
}

func (b *building) Name() string                { return "toolchain/x" }
func (b *building) Probe(context.Context) error { return nil }
func (b *building) Builds()                     {}
func (b *building) HostProbe(context.Context) error {
	return errors.New("no x in this server's userland: apt-get install x")
}
func (b *building) Run(ctx context.Context, req *Request) (*Result, error) {
	d, _ := ctx.Deadline()
	*b.deadline = time.Until(d)
	*b.req = req
	return &Result{}, nil
}

// A Builder's run gets the run's and the compile's budgets together (it
// keeps each stage to its own), stdin and args reach it, and status and
// help see its host probe.
func TestBuilderBudgetInputAndHostProbe(t *testing.T) {
	var got time.Duration
	var req *Request
	b := &building{deadline: &got, req: &req}
	r := New([]Language{
		{Name: "x", Runs: true, TakesInput: true, Chain: []Engine{b}},
		{Name: "y", Runs: true, Chain: []Engine{&scripted{name: "y", ran: new([]string)}}},
	}, nil)
	sess := testSession(t)
	if _, err := r.Run(context.Background(), Input{Lang: "x", Code: "c", Session: sess, Timeout: time.Minute, CompileTimeout: 2 * time.Minute,
		Stdin: "in", Args: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	// The engine keeps each stage's budget from its program's start; the
	// runner's deadline is their sum plus the start's bound, a backstop.
	if want := 3*time.Minute + sandbox.DefaultStartTimeout; got <= want-time.Minute || got > want {
		t.Errorf("deadline in %s, want about %s (run 1m + compile 2m + the start's bound)", got, want)
	}
	if req.Stdin != "in" || len(req.Args) != 1 || req.CompileTimeout != 2*time.Minute {
		t.Errorf("request %+v", req)
	}
	if spec := ProcessSpec(req, "x"); spec.Timeout != time.Minute {
		t.Errorf("the run's box spec has timeout %s, want the run's 1m (counted by the sandbox from the program's start)", spec.Timeout)
	}
	if _, err := r.Run(context.Background(), Input{Lang: "x", Code: "c", Session: sess}); err != nil {
		t.Fatal(err)
	}
	if req.CompileTimeout != time.Minute {
		t.Errorf("default compile timeout %s, want 1m", req.CompileTimeout)
	}
	for _, in := range []Input{
		{Lang: "y", Code: "c", Session: sess, Stdin: "in"},
		{Lang: "x", Code: "c", Session: sess, Args: []string{"a\x00"}},
		{Lang: "x", Code: "c", Session: sess, CompileTimeout: time.Hour},
		{Lang: "x", Code: "c", Session: sess, CompileTimeout: -1},
	} {
		if _, err := r.Run(context.Background(), in); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", in, err)
		}
	}
	st := r.Engines()
	if len(st) != 2 || st[0].Available || !strings.Contains(st[0].Reason, "sessions on a rootfs use the rootfs's") {
		t.Errorf("status %+v", st)
	}
	runs, shown := r.Runnable()
	if strings.Join(runs, ",") != "y" || !strings.Contains(shown["x"], "no x in this server's userland") {
		t.Errorf("runnable %v, shown %v", runs, shown)
	}
}

// A run shown by a renderer after a toolchain could not run it says it
// was not run, and why.
func TestRenderFallbackNoteSaysNotRun(t *testing.T) {
	ran := new([]string)
	r := New([]Language{{Name: "z", Runs: true, Chain: []Engine{
		&scripted{name: "toolchain/z", err: errors.New("no z in this server's userland: apt-get install z"), ran: ran},
		shower{&scripted{name: "render/code", ran: ran}},
	}}}, nil)
	res, err := r.Run(context.Background(), Input{Lang: "z", Code: "c", Session: testSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Engine != "render/code" || len(res.Notes) != 1 || res.Notes[0] != "not run, shown by render/code because toolchain/z: no z in this server's userland: apt-get install z" {
		t.Errorf("%+v", res)
	}
}

func TestToolchainText(t *testing.T) {
	for _, tc := range []struct {
		r    Result
		want []string
	}{
		{Result{Stage: "compile", ExitCode: 1, Stderr: "main.c:3:1: error", Toolchain: "gcc 12"}, []string{"⚠️ compile failed (exit code 1); the program did not run", "🔧 gcc 12"}},
		{Result{Stage: "run", ExitCode: 2, Toolchain: "gcc 12", CompileMS: 81}, []string{"⚠️ exit code 2", "🔧 gcc 12 (built in 81 ms)"}},
		{Result{Stage: "run", Toolchain: "gcc 12", Cached: true, Stdout: "hi"}, []string{"hi\n🔧 gcc 12 (cached build of this same source: nothing compiled)"}},
	} {
		txt := tc.r.Text()
		for _, w := range tc.want {
			if !strings.Contains(txt, w) {
				t.Errorf("%q does not contain %q", txt, w)
			}
		}
	}
}

// shower is a scripted engine that only shows the code.
type shower struct{ *scripted }

func (shower) Shows() {}

// Two tiers that fail for the same reason (the session's rootfs is gone,
// which both rootfs Python tiers check) say it once in the note.
func TestSameReasonSaidOnce(t *testing.T) {
	ran := new([]string)
	gone := errors.New(`rootfs "x" is not installed`)
	r := New([]Language{{Name: "z", Runs: true, Chain: []Engine{
		&scripted{name: "a", err: gone, ran: ran},
		&scripted{name: "b", err: gone, ran: ran},
		&scripted{name: "c", err: errors.New("other"), ran: ran},
		&scripted{name: "d", ran: ran},
	}}}, nil)
	res, err := r.Run(context.Background(), Input{Lang: "z", Code: "c", Session: testSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `ran with d because a, b: rootfs "x" is not installed; c: other`; len(res.Notes) != 1 || res.Notes[0] != want {
		t.Errorf("notes %q, want %q", res.Notes, want)
	}
}

// TestStepAsideNoNote: an engine that steps aside for the session's own
// choice (its rootfs) is no surprise to the caller; the run says nothing
// of it.
func TestStepAsideNoNote(t *testing.T) {
	ran := new([]string)
	r := New([]Language{{Name: "z", Runs: true, Chain: []Engine{
		&scripted{name: "a", err: fmt.Errorf("session runs on rootfs %q: %w", "x", ErrStepAside), ran: ran},
		&scripted{name: "b", ran: ran},
	}}}, nil)
	res, err := r.Run(context.Background(), Input{Lang: "z", Code: "c", Session: testSession(t)})
	if err != nil || res.Engine != "b" || len(res.Notes) != 0 {
		t.Errorf("%v: engine %s notes %q, want b and none", err, res.Engine, res.Notes)
	}
}
