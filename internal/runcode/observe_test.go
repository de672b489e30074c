package runcode

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

type twoStreams struct{}

func (twoStreams) Name() string                { return "two" }
func (twoStreams) Probe(context.Context) error { return nil }
func (twoStreams) Run(ctx context.Context, req *Request) (*Result, error) {
	fmt.Fprint(req.Stdout, "out1 ")
	fmt.Fprint(req.Stderr, "err1")
	fmt.Fprint(req.Stdout, "out2")
	return &Result{}, nil
}

func TestRunReportsOutputToTheContextObserver(t *testing.T) {
	r := New([]Language{{Name: "python", Runs: true, Chain: []Engine{twoStreams{}}}}, &Options{MaxStdout: 64})
	var got []string
	ctx := WithOutput(context.Background(), func(stream string, p []byte) {
		got = append(got, stream+":"+string(p))
	})
	res, err := r.Run(ctx, Input{Code: "x", Session: testSession(t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := "stdout:out1 |stderr:err1|stdout:out2"; strings.Join(got, "|") != want {
		t.Fatalf("observed %q, want %q", strings.Join(got, "|"), want)
	}
	if res.Stdout != "out1 out2" || res.Stderr != "err1" {
		t.Fatalf("capture changed by observing: %+v", res)
	}
	// Without an observer nothing is reported (and nothing breaks).
	if _, err := r.Run(context.Background(), Input{Code: "x", Session: testSession(t)}); err != nil {
		t.Fatal(err)
	}
}

func TestObservedCaptureSeesEveryByteEvenWhenCut(t *testing.T) {
	var n int
	c := NewCapture(64, "", 0).Observe(func(_ string, p []byte) { n += len(p) }, "stdout")
	for range 100 {
		c.Write([]byte(strings.Repeat("x", 10)))
	}
	if v := c.Finish(); !v.Cut || n != 1000 {
		t.Fatalf("observed %d bytes, cut=%v", n, v.Cut)
	}
}
