package app

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/metrics/metricstest"
	"github.com/quro-dev/quro/internal/runcode"
	"golang.org/x/sys/unix"
)

// TestStoppedRunsAreAuditedAsSuch: a real run that hits its timeout and
// one whose call is canceled while it runs are audited and counted as
// timeout and canceled, not ok.
func TestStoppedRunsAreAuditedAsSuch(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	// The session's box first, so that the timeout below is the run's
	// alone (a box's start on a loaded machine can take seconds).
	if reply, err := cliCall(t, a, "run_code", RunCodeInput{Lang: "sh", Code: "true"}); err != nil || reply.Output.(*runcode.Result).ExitCode != 0 {
		t.Fatalf("%v %+v", err, reply)
	}
	reply, err := cliCall(t, a, "run_code", RunCodeInput{Lang: "sh", Code: "echo before; sleep 30", TimeoutMS: 2000})
	if err != nil || !reply.Output.(*runcode.Result).TimedOut {
		t.Fatalf("%v %+v", err, reply)
	}

	// The canceled run tells the test it runs through a FIFO; the call is
	// canceled only then.
	info := mustCall(t, a, "get_session_status", SessionRef{}).(*SessionInfo)
	fifo := filepath.Join(info.Workspace, "started")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(fifo, 0o666)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		b, _ := json.Marshal(RunCodeInput{Lang: "sh", Code: "echo x > started; sleep 30"})
		reply, err := a.Controller.Call(ctx, cli, "run_code", b)
		if err == nil && !reply.Output.(*runcode.Result).Interrupted {
			t.Errorf("the canceled run was not interrupted: %+v", reply.Output)
		}
		done <- err
	}()
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(f).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the canceled call did not return")
	}

	log, err := call(t, a, "get_audit_log", AuditInput{Capability: "run_code"})
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, e := range log.Output.(*AuditLog).Entries {
		outcomes = append(outcomes, e.Outcome)
	}
	if len(outcomes) != 3 || outcomes[0] != "ok" || outcomes[1] != "timeout" || outcomes[2] != "canceled" {
		t.Fatalf("audited outcomes %q, want [ok timeout canceled] (the box's start, then the two)", outcomes)
	}
	expect(t, metricstest.Scrape(t, a.Metrics.Handler()),
		want{"quro_calls_total", []string{"capability", "run_code", "path", "cli", "outcome", "timeout"}, 1},
		want{"quro_calls_total", []string{"capability", "run_code", "path", "cli", "outcome", "canceled"}, 1},
	)
}
