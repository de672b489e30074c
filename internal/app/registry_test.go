package app

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestRegistryIsTheOneSource: every capability is described for a model
// (its description and every input field), and what list_capabilities and
// help tell a model is the registry itself, so the two cannot drift. MCP
// and OpenAPI are checked against the registry in their own packages.
func TestRegistryIsTheOneSource(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	reg := a.Controller.Registry()
	want := []string{"run_code", "python_run", "terminal_exec", "create_session", "destroy_session", "send_input",
		"get_session_status", "list_sessions", "set_session_env", "get_session_env", "read_file", "write_file",
		"list_files", "create_project", "list_capabilities", "get_service_status", "get_audit_log", "help"}
	for _, name := range want {
		if _, ok := reg.Get(name); !ok {
			t.Errorf("capability %s is missing", name)
		}
	}
	for _, c := range reg.List() {
		if len(c.Description) < 40 || !strings.HasSuffix(strings.TrimSpace(c.Description), ".") {
			t.Errorf("%s: a model needs a full-sentence description, not %q", c.Name, c.Description)
		}
		for field, p := range c.InputSchema.Properties {
			if strings.TrimSpace(p.Description) == "" {
				t.Errorf("%s: input field %s has no description", c.Name, field)
			}
		}
		if c.OutputSchema == nil || c.InputSchema == nil {
			t.Errorf("%s: no schema", c.Name)
		}
	}

	reply, err := call(t, a, "list_capabilities", Empty{})
	if err != nil {
		t.Fatal(err)
	}
	listed := reply.Output.(*CapabilityList).Capabilities
	if len(listed) != len(reg.List()) {
		t.Fatalf("list_capabilities shows %d of %d", len(listed), len(reg.List()))
	}
	for i, c := range reg.List() {
		l := listed[i]
		in, _ := json.Marshal(c.InputSchema)
		lin, _ := json.Marshal(l.InputSchema)
		out, _ := json.Marshal(c.OutputSchema)
		lout, _ := json.Marshal(l.OutputSchema)
		if l.Name != c.Name || l.Description != c.Description || l.Scope != string(c.Scope) ||
			!reflect.DeepEqual(in, lin) || !reflect.DeepEqual(out, lout) {
			t.Errorf("list_capabilities' %s differs from the registry", c.Name)
		}
	}
	for _, c := range reg.List() {
		reply, err = call(t, a, "help", HelpInput{Topic: c.Name})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(reply.Text, c.Name+" (scope "+string(c.Scope)+"): "+c.Description) {
			t.Errorf("help %s does not carry its description:\n%s", c.Name, reply.Text)
		}
	}
}
