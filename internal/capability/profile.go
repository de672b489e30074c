package capability

import (
	"maps"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
)

// Hints say what a capability does, by meaning, as MCP's tool annotations
// do: a client may run a read-only tool without asking, and ask before a
// destructive one. Declared once per capability (internal/app's hints
// table) and shown by every access path that shows hints.
type Hints struct {
	// ReadOnly: the call changes nothing (a session, a file, a token).
	ReadOnly bool
	// Destructive: the call may delete or overwrite what was there (a
	// file, a session, a token, a running process). Meaningful only when
	// not ReadOnly.
	Destructive bool
	// Idempotent: calling again with the same arguments changes nothing
	// more than the first call did.
	Idempotent bool
	// OpenWorld: the call may reach past Quro — the internet, a package
	// index, code a model wrote running with the session's network.
	OpenWorld bool
}

// Brief sets the short description and the essential inputs a compact
// profile lists for c (see Profile.Compact), and returns c. The call still
// accepts every field of the input: a compact listing only leaves the
// others unsaid. Brief panics if a property is not one of the input's, or
// if it leaves out a required one (a programmer error).
func (c *Capability) Brief(short string, props ...string) *Capability {
	for _, p := range props {
		if _, ok := c.InputSchema.Properties[p]; !ok {
			panic("capability " + c.Name + ": Brief names no input field " + p)
		}
	}
	// A listing that left out a required input would be one no model
	// could call as listed.
	for _, r := range c.InputSchema.Required {
		if r != "session" && !slices.Contains(props, r) {
			panic("capability " + c.Name + ": Brief leaves out the required input " + r)
		}
	}
	c.Short, c.Essential = short, props
	return c
}

// Listing is how p lists c to a model: its description and input schema
// in full, or, in a compact profile, its short description (Brief) and a
// schema of its essential inputs only (and its session, when p is
// WithSession). The schema keeps additionalProperties false, as strict
// clients want, but the call still accepts every input: a model told of
// another (help {tool}) may send it. A capability without a Brief is
// listed in full.
func (c *Capability) Listing(p Profile) (description string, input *jsonschema.Schema) {
	if !p.Compact || c.Short == "" {
		return c.Description, c.InputSchema
	}
	props := c.Essential
	if _, ok := c.InputSchema.Properties["session"]; ok && p.WithSession && !slices.Contains(props, "session") {
		props = append(slices.Clip(props), "session")
	}
	s := *c.InputSchema
	s.Properties = make(map[string]*jsonschema.Schema, len(props))
	s.PropertyOrder = nil
	for _, p := range props {
		s.Properties[p] = c.InputSchema.Properties[p]
		s.PropertyOrder = append(s.PropertyOrder, p)
	}
	s.Required = nil
	for _, r := range c.InputSchema.Required {
		if _, ok := s.Properties[r]; ok {
			s.Required = append(s.Required, r)
		}
	}
	return c.Short, &s
}

// Profile is a set of capabilities listed together to a model (MCP's
// tools/list): a small one for agents, the whole registry, one for
// operators. A profile only chooses what is listed; what a caller may call
// is its scope's.
type Profile struct {
	Name string
	// Summary says in a line whom the profile is for.
	Summary string
	// Tools are the members, in the order listed; nil: every capability.
	// A member the registry does not have is skipped.
	Tools []string
	// Compact lists each member's Brief (short description, essential
	// inputs) instead of its full description and input schema.
	Compact bool
	// WithSession adds the session input to a compact listing: for a
	// model that works in more than the default session.
	WithSession bool
}

// DefaultProfile is the profile listed when the caller chooses none.
const DefaultProfile = "agent"

// FullProfile lists every capability the caller may call, in full.
const FullProfile = "full"

// AddProfile adds p; a second profile of the same name panics.
func (r *Registry) AddProfile(p Profile) {
	if r.profiles == nil {
		r.profiles = map[string]*Profile{}
	}
	if _, dup := r.profiles[p.Name]; dup {
		panic("profile added twice: " + p.Name)
	}
	p.Tools = slices.Clone(p.Tools)
	r.profiles[p.Name] = &p
}

// Profile returns the named profile. FullProfile is always there, even in
// a registry that declared none.
func (r *Registry) Profile(name string) (Profile, bool) {
	if p, ok := r.profiles[name]; ok {
		return *p, true
	}
	if name == FullProfile {
		return Profile{Name: FullProfile, Summary: "every capability, described in full"}, true
	}
	return Profile{}, false
}

// ProfileNames returns the sorted names of the profiles, FullProfile
// among them.
func (r *Registry) ProfileNames() []string {
	names := slices.Collect(maps.Keys(r.profiles))
	if !slices.Contains(names, FullProfile) {
		names = append(names, FullProfile)
	}
	slices.Sort(names)
	return names
}

// Members returns the capabilities p lists to a caller holding scope, in
// p's order: the members the registry has and the scope covers.
func (r *Registry) Members(p Profile, scope Scope) []*Capability {
	var out []*Capability
	if p.Tools == nil {
		for _, c := range r.List() {
			if scope.Covers(c.Scope) {
				out = append(out, c)
			}
		}
		return out
	}
	for _, n := range p.Tools {
		if c, ok := r.byName[n]; ok && scope.Covers(c.Scope) {
			out = append(out, c)
		}
	}
	return out
}
