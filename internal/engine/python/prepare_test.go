//go:build !slim

package python

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/flock"
	"github.com/quro-dev/quro/internal/progress"
	"github.com/quro-dev/quro/internal/runcode"
)

// recorder collects progress messages and signals each one.
type recorder struct {
	mu   sync.Mutex
	msgs []string
	got  chan string
}

func newRecorder() *recorder { return &recorder{got: make(chan string, 1000)} }

func (r *recorder) report(msg string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
	r.got <- msg
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// The first run on a fresh data directory: the preparation runs once, in
// the background, whoever asked first; a probe meanwhile does not wait for
// it (nor fail); each run waiting for it is told its progress; a run that
// ends while it goes on says so plainly, without falling to another tier;
// and another process holding the directory's lock (here the test) is
// waited for, and said to be.
func TestFirstRunPreparesOnceWithProgress(t *testing.T) {
	root := t.TempDir()
	data := t.TempDir()
	status := newRecorder()
	e := NewEmbedded(data, testSB, &EmbeddedOptions{InstallRoot: root, Status: status.report, NoSpare: true})
	defer e.Close()

	// Another "quro process" holds the lock: the preparation cannot end.
	os.MkdirAll(filepath.Join(root, "python"), 0o755)
	unlock, err := flock.Lock(filepath.Join(root, "python", ".lock"), nil)
	if err != nil {
		t.Fatal(err)
	}

	// The probe returns (nil) without waiting; it started the preparation.
	if err := e.Probe(context.Background()); err != nil {
		t.Fatalf("probe while preparing: %v", err)
	}
	if msg := <-status.got; !strings.Contains(msg, "waiting for another quro process") {
		t.Fatalf("first status %q", msg)
	}

	// A run whose context ends while waiting returns a result that says
	// why, not an engine error (which would send it to the next tier).
	ctx, cancel := context.WithCancel(context.Background())
	early := newRecorder()
	done := make(chan ran, 1)
	go func() {
		var out, errb bytes.Buffer
		res, err := e.Run(progress.With(ctx, early.report), &runcode.Request{Code: "print(1)", Lang: "python", Session: newSession(t), Timeout: time.Minute, Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Errorf("engine error: %v", err)
			res = &runcode.Result{}
		}
		done <- ran{res, out.String(), errb.String()}
	}()
	if msg := <-early.got; !strings.Contains(msg, "waiting for another quro process") {
		t.Fatalf("a waiting run is told %q", msg)
	}
	cancel()
	r := <-done
	if r.ExitCode != -1 || !strings.Contains(r.Error, "still being prepared") || !strings.Contains(r.Error, "run it again") || r.out != "" {
		t.Fatalf("run canceled while preparing: %+v", r.Result)
	}

	// Through the runner, as every access path runs code: the wait for
	// the preparation is not bounded by the run's budget (a first run
	// with the default 30 s failed on a loaded machine while the
	// preparation went on) but by the runner's PrepareTimeout and the
	// caller; one that ends says what it waited for, and the run does not
	// fall to another tier.
	const budget = time.Minute
	seen := &preparedUnder{Embedded: e, left: make(chan time.Duration, 10)}
	runner := runcode.New([]runcode.Language{{Name: "python", Runs: true, Chain: []runcode.Engine{seen, &scriptedTier{}}}}, nil)
	viaRunner := func(ctx context.Context, rec *recorder) (*runcode.Result, error) {
		return runner.Run(progress.With(ctx, rec.report), runcode.Input{Code: "print(6 * 7)", Lang: "python", Session: newSession(t), Timeout: budget})
	}
	ctx, cancel = context.WithCancel(context.Background())
	canceled := newRecorder()
	cdone := make(chan *runcode.Result, 1)
	go func() {
		res, err := viaRunner(ctx, canceled)
		if err != nil {
			t.Errorf("runner: %v", err)
		}
		cdone <- res
	}()
	if left := <-seen.left; left <= budget {
		t.Fatalf("the preparation was waited for under %s, within the run's budget of %s", left, budget)
	}
	<-canceled.got // it waits
	cancel()
	if res := <-cdone; res == nil || res.Engine != "python/embedded" || res.ExitCode != -1 ||
		!strings.Contains(res.Error, "still being prepared") || !strings.Contains(res.Error, "waited") ||
		!strings.Contains(res.Error, "waiting for another quro process") || !strings.Contains(res.Error, "did not start") {
		t.Fatalf("a runner's run canceled while preparing: %+v", res)
	}

	// Two runs wait together; the lock is released; both run, after one
	// extraction, each having seen the progress.
	recs := []*recorder{newRecorder(), newRecorder()}
	var wg sync.WaitGroup
	viaRec := newRecorder()
	wg.Add(1)
	go func() {
		defer wg.Done()
		res, err := viaRunner(context.Background(), viaRec)
		if err != nil || res.ExitCode != 0 || res.Stdout != "42\n" || res.Engine != "python/embedded" {
			t.Errorf("a runner's run after preparing: %v %+v", err, res)
		}
	}()
	<-viaRec.got // it waits, and was told so
	for _, rec := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errb bytes.Buffer
			res, err := e.Run(progress.With(context.Background(), rec.report), &runcode.Request{Code: "print(6 * 7)", Lang: "python", Session: newSession(t), Timeout: time.Minute, Stdout: &out, Stderr: &errb})
			if err != nil || res.ExitCode != 0 || out.String() != "42\n" {
				t.Errorf("run after preparing: %v %+v %q %q", err, res, out.String(), errb.String())
			}
		}()
		<-rec.got // it waits, and was told so
	}
	unlock()
	wg.Wait()
	for i, rec := range append(recs, status) {
		msgs := rec.all()
		if want := "preparing the embedded Python (first run on this data directory): extracting 100%"; !strings.Contains(msgs, want) {
			t.Errorf("reporter %d was not told %q:\n%s", i, want, msgs)
		}
		// The standard library ships compiled (see precompiled.go).
		if strings.Contains(msgs, "compiling") {
			t.Errorf("reporter %d was told of compiling:\n%s", i, msgs)
		}
	}
	if !strings.Contains(status.all(), "ready (") {
		t.Errorf("status: %s", status.all())
	}
	if n := strings.Count(status.all(), "extracting 0%"); n != 1 {
		t.Errorf("%d extractions:\n%s", n, status.all())
	}
	dir, extracted, err := e.Installed(context.Background())
	if err != nil || !extracted || !strings.HasPrefix(dir, root) {
		t.Errorf("installed %s %v %v", dir, extracted, err)
	}
	// Prepared: a later probe checks a worker starts, as before.
	if err := e.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// preparedUnder is the embedded engine, telling how long the context of
// each wait for its preparation had left.
type preparedUnder struct {
	*Embedded
	left chan time.Duration
}

func (p *preparedUnder) Prepare(ctx context.Context, req *runcode.Request) error {
	left := time.Duration(1<<63 - 1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	p.left <- left
	return p.Embedded.Prepare(ctx, req)
}

// scriptedTier is a next tier that must not be asked.
type scriptedTier struct{}

func (scriptedTier) Name() string                    { return "next-tier" }
func (scriptedTier) Probe(ctx context.Context) error { return nil }
func (scriptedTier) Run(ctx context.Context, req *runcode.Request) (*runcode.Result, error) {
	return nil, errors.New("the next tier was asked")
}
