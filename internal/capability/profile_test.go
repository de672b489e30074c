package capability

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
)

type sessIn struct {
	Session string `json:"session,omitempty" jsonschema:"the session"`
	Path    string `json:"path" jsonschema:"a path"`
	Limit   int    `json:"limit,omitempty" jsonschema:"at most"`
}

// A compact profile lists a capability's brief: its short description
// and its essential inputs (with the session when asked), leaving the
// full declaration and what a call accepts as they are; Members keeps a
// profile's order, skips names the registry lacks and scopes cannot call.
func TestProfileListing(t *testing.T) {
	reg := NewRegistry()
	read := New("read", "Read a file, with every detail a model may want.", ScopeRead, func(ctx context.Context, i sessIn) (out, error) { return out{}, nil }).Brief("Read a file.", "path")
	reg.Register(read)
	reg.Register(New("admin_only", "Only for admins.", ScopeAdmin, func(ctx context.Context, i in) (out, error) { return out{}, nil }))
	reg.Register(greet())

	desc, schema := read.Listing(Profile{Compact: true})
	if desc != "Read a file." || len(schema.Properties) != 1 || schema.Properties["path"] == nil || !slices.Equal(schema.Required, []string{"path"}) {
		t.Errorf("compact: %q %+v", desc, schema)
	}
	if _, s := read.Listing(Profile{Compact: true, WithSession: true}); len(s.Properties) != 2 || s.Properties["session"] == nil {
		t.Errorf("compact with session: %+v", s.Properties)
	}
	if d, s := read.Listing(Profile{}); d != read.Description || s != read.InputSchema {
		t.Error("a full profile lists the declaration as it is")
	}
	if len(read.InputSchema.Properties) != 3 {
		t.Errorf("the declaration changed: %+v", read.InputSchema.Properties)
	}
	// A field left out of the listing is still accepted.
	if _, err := read.Decode(json.RawMessage(`{"path":"a","limit":3}`)); err != nil {
		t.Error(err)
	}

	p := Profile{Name: "p", Tools: []string{"read", "missing", "admin_only", "greet"}}
	reg.AddProfile(p)
	var names []string
	for _, c := range reg.Members(p, ScopeExec) {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"read", "greet"}) {
		t.Errorf("members for exec: %v", names)
	}
	if got := reg.ProfileNames(); !slices.Equal(got, []string{FullProfile, "p"}) {
		t.Errorf("profiles: %v", got)
	}
	if full, ok := reg.Profile(FullProfile); !ok || len(reg.Members(full, ScopeAdmin)) != 3 {
		t.Errorf("full: %+v", full)
	}
	defer func() {
		if recover() == nil {
			t.Error("a brief naming no input field did not panic")
		}
	}()
	greet().Brief("x", "nope")
}

// A brief that leaves out a required input is refused at declaration: no
// model could call the tool as it would be listed.
func TestBriefKeepsRequiredInputs(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("a brief without the required path was accepted")
		}
	}()
	New("read", "Read a file.", ScopeRead, func(ctx context.Context, i sessIn) (out, error) { return out{}, nil }).Brief("Read.", "limit")
}
