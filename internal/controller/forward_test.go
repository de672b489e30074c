package controller_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// A call for a session another node owns is offered to Forward once
// decoded and allowed, before any session is entered: the owner's answer
// becomes the capability's own output type, the reply's text is made
// from it, and this node neither runs nor records the call. A call
// marked ServeHere, or one Forward declines, runs here and is recorded.
// The real forwarding (internal/cluster Router.Forward between nodes on
// a real API server) is TestCluster's (build tag k8s).
func TestControllerForwardsCallsOfAnotherNodesSession(t *testing.T) {
	t.Parallel()
	var ran, entered, recorded, served []string
	var offered []string
	reg := newRegistry(t, capability.New("count", "count in a session", capability.ScopeExec,
		func(ctx context.Context, in inSession) (*count, error) {
			ran = append(ran, in.Session)
			return &count{N: in.N + 1}, nil
		}).InSession(capability.UseBusy))
	c := controller.New(reg, &controller.Options{
		Enter: func(ctx context.Context, ref string, use capability.Use) (context.Context, func(), error) {
			entered = append(entered, ref)
			return ctx, func() {}, nil
		},
		Observers: []controller.Observer{func(ctx context.Context, r *controller.Record) { recorded = append(recorded, r.Capability) }},
	})
	c.SetForward(func(ctx context.Context, caller controller.Caller, name, ref string, args json.RawMessage) (json.RawMessage, bool, error) {
		offered = append(offered, ref+" "+controller.CredentialFrom(ctx))
		switch ref {
		case "remote":
			return json.RawMessage(`{"n":42,"entered":"on the owner"}`), true, nil
		case "down":
			e := capability.Errorf(capability.Unavailable, "the owner is not running")
			e.RetryAfter = 5
			return nil, true, e
		}
		return nil, false, nil
	}, func(ctx context.Context, r *controller.Record) { served = append(served, r.Capability) })
	caller := controller.Caller{Path: "mcp", Scope: capability.ScopeExec}
	ctx := controller.WithCredential(context.Background(), "Bearer tok")

	reply, err := c.Call(ctx, caller, "count", json.RawMessage(`{"session":"remote","n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if out, ok := reply.Output.(*count); !ok || out.N != 42 || out.Entered != "on the owner" {
		t.Fatalf("forwarded output %#v", reply.Output)
	}
	if reply.Text == "" {
		t.Fatal("a forwarded reply has no text")
	}
	if len(ran) != 0 || len(entered) != 0 || len(recorded) != 0 || len(served) != 0 {
		t.Fatalf("a forwarded call ran %q, entered %q, recorded %q, served %q here", ran, entered, recorded, served)
	}
	_, err = c.Call(ctx, caller, "count", json.RawMessage(`{"session":"down"}`))
	var ce *capability.Error
	if !errors.As(err, &ce) || ce.Code != capability.Unavailable || ce.RetryAfter != 5 {
		t.Fatalf("owner down: %v", err)
	}
	// Bad arguments are refused here, before anything is offered.
	if _, err := c.Call(ctx, caller, "count", json.RawMessage(`{"session":"remote","n":"x"}`)); err == nil {
		t.Fatal("bad arguments were forwarded")
	}
	if _, err := c.Call(ctx, caller, "count", json.RawMessage(`{"session":"local","n":1}`)); err != nil || len(ran) != 1 {
		t.Fatalf("a declined call: %v, ran %q", err, ran)
	}
	if _, err := c.Call(controller.ServeHere(ctx), caller, "count", json.RawMessage(`{"session":"remote","n":1}`)); err != nil || len(ran) != 2 {
		t.Fatalf("ServeHere: %v, ran %q", err, ran)
	}
	want := []string{"remote Bearer tok", "down Bearer tok", "local Bearer tok"}
	if len(offered) != len(want) {
		t.Fatalf("offered %q, want %q", offered, want)
	}
	for i := range want {
		if offered[i] != want[i] {
			t.Fatalf("offered %q, want %q", offered, want)
		}
	}
	// Recorded here: the refusal of the bad arguments, the declined call
	// and the one marked ServeHere.
	if len(recorded) != 3 || len(served) != 3 {
		t.Fatalf("the calls answered here: recorded %q, served %q", recorded, served)
	}
}
