package controller_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

type inSession struct {
	Session string `json:"session,omitempty"`
	N       int    `json:"n,omitempty" jsonschema:"a count"`
}

func (in inSession) SessionRef() string { return in.Session }

type enteredKey struct{}

type count struct {
	N       int    `json:"n"`
	Entered string `json:"entered"`
}

// A capability declared InSession runs only inside the session its input
// names, entered by the controller in the declared mode, and the entry is
// released when it returns — on Call (JSON) and Invoke (typed) alike.
func TestControllerEntersTheSessionBeforeTheHandler(t *testing.T) {
	var log []string
	enter := func(ctx context.Context, ref string, use capability.Use) (context.Context, func(), error) {
		log = append(log, "enter "+ref+" "+use.String())
		return context.WithValue(ctx, enteredKey{}, ref), func() { log = append(log, "leave "+ref) }, nil
	}
	reg := newRegistry(t, capability.New("count", "count in a session", capability.ScopeExec,
		func(ctx context.Context, in inSession) (*count, error) {
			ref, _ := ctx.Value(enteredKey{}).(string)
			log = append(log, "run")
			return &count{N: in.N + 1, Entered: ref}, nil
		}).InSession(capability.UseBusy))
	c := controller.New(reg, &controller.Options{Enter: enter})
	caller := controller.Caller{Path: "test", Scope: capability.ScopeExec}

	reply, err := c.Call(context.Background(), caller, "count", json.RawMessage(`{"session":"s1","n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if out := reply.Output.(*count); out.N != 2 || out.Entered != "s1" {
		t.Fatalf("Call: %+v", out)
	}
	reply, err = c.Invoke(context.Background(), caller, "count", inSession{Session: "s2", N: 41})
	if err != nil {
		t.Fatal(err)
	}
	if out := reply.Output.(*count); out.N != 42 || out.Entered != "s2" {
		t.Fatalf("Invoke: %+v", out)
	}
	want := []string{"enter s1 busy", "run", "leave s1", "enter s2 busy", "run", "leave s2"}
	if len(log) != len(want) {
		t.Fatalf("log %q, want %q", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("log %q, want %q", log, want)
		}
	}
	// A wrong input type is the access path's bug (internal); bad
	// arguments are refused before the session is entered.
	if _, err := c.Invoke(context.Background(), caller, "count", struct{ N int }{1}); code(t, err) != capability.Internal {
		t.Errorf("Invoke with a foreign type: %v", err)
	}
	log = nil
	if _, err := c.Call(context.Background(), caller, "count", json.RawMessage(`{"session":"s1","n":"x"}`)); code(t, err) != capability.InvalidArgument {
		t.Errorf("bad arguments: %v", err)
	}
	if len(log) != 0 {
		t.Errorf("bad arguments entered the session: %q", log)
	}
}

// A refused entry (a session being destroyed) is the call's answer: the
// handler never runs.
func TestControllerRefusedEntryRunsNothing(t *testing.T) {
	ran := false
	reg := newRegistry(t, capability.New("count", "count in a session", capability.ScopeExec,
		func(ctx context.Context, in inSession) (*count, error) {
			ran = true
			return &count{}, nil
		}).InSession(capability.UseHold))
	c := controller.New(reg, &controller.Options{Enter: func(ctx context.Context, ref string, use capability.Use) (context.Context, func(), error) {
		return nil, nil, capability.Errorf(capability.NotFound, "session %s is being destroyed", ref)
	}})
	_, err := c.Call(context.Background(), controller.Caller{Scope: capability.ScopeExec}, "count", json.RawMessage(`{"session":"gone"}`))
	if code(t, err) != capability.NotFound || ran {
		t.Errorf("err %v, ran %v", err, ran)
	}
	// Without an Enter, a capability that uses a session is refused.
	c = controller.New(reg, nil)
	if _, err := c.Call(context.Background(), controller.Caller{Scope: capability.ScopeExec}, "count", nil); code(t, err) != capability.Internal || ran {
		t.Errorf("no Enter: err %v, ran %v", err, ran)
	}
}

// InSession on an input that names no session is a programmer error.
func TestInSessionNeedsASessionInput(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("InSession accepted an input without SessionRef")
		}
	}()
	capability.New("x", "x", capability.ScopeRead, func(ctx context.Context, in empty) (*count, error) { return nil, nil }).InSession(capability.UseRead)
}
