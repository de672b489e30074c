package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/soak"
)

// TestAttackPauseResumeRacingDestroyForkRun: two goroutines hammer
// pause_session and resume_session while destroy_session, fork_session
// and run_code run on the same session, round after round. Every call
// returns (no deadlock: each has a minute, the test's guard), every error
// is a classified capability error (not internal) with a message, no
// process of the destroyed session is left (frozen or not), and a fork
// that was made is usable and not left frozen. Five rounds: the destroy
// starts after 1 to 5 pause/resume cycles, one round of each; more
// rounds of the same race are TestSoakAttackPauseResumeRacingDestroyForkRun
// (make test-soak).
func TestAttackPauseResumeRacingDestroyForkRun(t *testing.T) {
	t.Parallel()
	pauseResumeRacingDestroyForkRun(t, 5)
}

// TestSoakAttackPauseResumeRacingDestroyForkRun is
// TestAttackPauseResumeRacingDestroyForkRun over 100 rounds, each length
// of the warm-up twenty times: the interleavings a race meets vary from
// round to round, and hitting a rare one is a matter of repetitions.
func TestSoakAttackPauseResumeRacingDestroyForkRun(t *testing.T) {
	soak.Skip(t)
	pauseResumeRacingDestroyForkRun(t, 100)
}

func pauseResumeRacingDestroyForkRun(t *testing.T, rounds int) {
	a := newApp(t, nil)
	needBoxes(t, a)
	var errMu sync.Mutex
	errs, msgs := map[string]int{}, map[string]string{}
	check := func(what string, err error) {
		if err == nil {
			return
		}
		var ce *capability.Error
		if !errors.As(err, &ce) || ce.Code == capability.Internal || ce.Message == "" {
			t.Errorf("%s: an unclassified error: %v", what, err)
			return
		}
		errMu.Lock()
		errs[what+" "+string(ce.Code)]++
		msgs[what+" "+string(ce.Code)] = ce.Message
		errMu.Unlock()
	}
	for i := range rounds {
		name := fmt.Sprintf("race%d", i)
		s := mustCall(t, a, "create_session", CreateSessionInput{Name: name}).(*SessionInfo)
		mustCall(t, a, "start_process", StartProcessInput{Session: s.ID, Cmd: "sleep", Args: []string{"1000"}, Background: true})
		sess, err := a.Sessions.ByIDAnyTenant(context.Background(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if bx := a.Sandbox.Box(s.ID); bx == nil || !bx.CanPause() {
			t.Skip("this machine cannot freeze a box")
		}

		// The destroy starts once the hammers have paused and resumed a
		// few times (rounds vary: 1 to 5 cycles), so that it meets the run
		// and the fork under way; a hammer stops when the session is gone.
		start, stop, warm := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var cycles atomic.Int64
		var warmOnce sync.Once
		var hammers, calls sync.WaitGroup
		notFound := func(err error) bool {
			var ce *capability.Error
			return errors.As(err, &ce) && ce.Code == capability.NotFound
		}
		for range 2 {
			hammers.Add(1)
			go func() {
				defer hammers.Done()
				defer warmOnce.Do(func() { close(warm) })
				<-start
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, err := callWithin(t, a, admin, "pause_session", SessionRef{Session: s.ID}, time.Minute)
					check("pause_session", err)
					_, err2 := callWithin(t, a, admin, "resume_session", SessionRef{Session: s.ID}, time.Minute)
					check("resume_session", err2)
					if notFound(err) || notFound(err2) {
						return
					}
					if cycles.Add(1) == int64(1+i%5) {
						warmOnce.Do(func() { close(warm) })
					}
				}
			}()
		}
		var fork *ForkResult
		calls.Add(3)
		go func() {
			defer calls.Done()
			<-start
			_, err := callWithin(t, a, admin, "run_code", RunCodeInput{Session: s.ID, Lang: "bash", Code: "echo ok"}, time.Minute)
			check("run_code", err)
		}()
		go func() {
			defer calls.Done()
			<-start
			reply, err := callWithin(t, a, admin, "fork_session", ForkInput{Session: s.ID}, time.Minute)
			check("fork_session", err)
			if err == nil {
				fork = reply.Output.(*ForkResult)
			}
		}()
		go func() {
			defer calls.Done()
			<-warm
			// A destroy refused while a freeze is under way is tried again,
			// as a caller would.
			for try := 0; try < 50; try++ {
				_, err := callWithin(t, a, admin, "destroy_session", SessionRef{Session: s.ID}, time.Minute)
				if err == nil {
					return
				}
				check("destroy_session", err)
				if notFound(err) {
					return
				}
			}
			t.Errorf("round %d: destroy_session refused 50 times", i)
		}()
		close(start)
		calls.Wait()
		close(stop)
		hammers.Wait()
		if t.Failed() {
			t.FailNow()
		}

		// The session is gone, and so is every process of its box.
		if !gone(a, s.ID) {
			t.Fatalf("round %d: session %s is still there after its destroy", i, s.ID)
		}
		// The destroy answered once the box was sent its kill: its end
		// (bubblewrap's exit with every process of the box) is the event.
		a.Sandbox.AwaitEnded(s.ID)
		waitFor(t, "the destroyed session's processes gone", func() bool {
			return a.Sandbox.Box(s.ID) == nil && len(procsIn(sess.Dir)) == 0
		})
		// A fork made is usable and not frozen unless paused as a session.
		if fork != nil {
			for _, c := range fork.Copies {
				if bx := a.Sandbox.Box(c.Session); bx != nil && bx.Paused() && status(t, a, c.Session).SessionState != StatePaused {
					t.Fatalf("round %d: fork %s's box is frozen while its session is %s", i, c.Session, status(t, a, c.Session).SessionState)
				}
				if r := runCodeWithin(t, a, RunCodeInput{Session: c.Session, Lang: "bash", Code: "echo fork-ok"}, time.Minute); r.Stdout != "fork-ok\n" {
					t.Fatalf("round %d: fork %s: %+v", i, c.Session, r)
				}
				mustCall(t, a, "destroy_session", SessionRef{Session: c.Session})
			}
		}
	}
	// No box of the App is left frozen without its session being paused.
	for _, k := range a.Sandbox.BoxKeys() {
		if bx := a.Sandbox.Box(k); bx != nil && bx.Paused() {
			if _, err := a.Sessions.ByIDAnyTenant(context.Background(), k); errors.Is(err, session.ErrNotFound) {
				t.Errorf("box %s is frozen and has no session", k)
			}
		}
	}
	for k, n := range errs {
		t.Logf("%s ×%d, e.g. %q", k, n, msgs[k])
	}
}

// procsIn are the host pids of the processes whose working directory is
// dir or below it.
func procsIn(dir string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
