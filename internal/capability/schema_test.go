package capability

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

type schemaIn struct {
	Args []json.RawMessage  `json:"args,omitempty" jsonschema:"each a JSON value"`
	Any  any                `json:"any,omitempty" jsonschema:"anything"`
	Env  map[string]*string `json:"env,omitempty" jsonschema:"null unsets"`
}

type schemaItem struct {
	N int `json:"n"`
}

type schemaOut struct {
	List  []string       `json:"list"`
	Items []*schemaItem  `json:"items"`
	Ptr   *schemaItem    `json:"ptr"`
	Map   map[string]any `json:"map"`
}

// The derived schemas have no bare boolean and no ["null", T] property or
// item; a map's values keep their null.
func TestSchemasTightened(t *testing.T) {
	c := New("s", "d", ScopeRead, func(context.Context, schemaIn) (*schemaOut, error) { return &schemaOut{}, nil })
	b, _ := json.Marshal(c.InputSchema)
	if strings.Contains(string(b), "true") {
		t.Errorf("input schema has a bare true: %s", b)
	}
	in := c.InputSchema.Properties
	if in["args"].Type != "array" || in["args"].Items == nil || len(in["args"].Items.Types) < 6 {
		t.Errorf("args: %s", b)
	}
	if len(in["any"].Types) < 6 {
		t.Errorf("any: %s", b)
	}
	if ap := in["env"].AdditionalProperties; ap == nil || !slices.Equal(ap.Types, []string{"null", "string"}) {
		t.Errorf("env: %s", b)
	}
	o := c.OutputSchema
	ob, _ := json.Marshal(o)
	if o.Properties["list"].Type != "array" || o.Properties["items"].Items.Type != "object" || o.Properties["ptr"].Type != "object" ||
		o.Properties["map"].Type != "object" || strings.Contains(string(ob), "true") {
		t.Errorf("output: %s", ob)
	}
	if !slices.Equal(o.Required, []string{"list", "items", "map"}) {
		t.Errorf("required %v: a nil pointer is left out, so it cannot be required", o.Required)
	}
}

// Structured turns a nil list into [] and a nil map into {}, and leaves a
// nil pointer out,
// so the output matches its schema.
func TestStructuredMatchesTheSchema(t *testing.T) {
	c := New("s", "d", ScopeRead, func(context.Context, schemaIn) (*schemaOut, error) { return &schemaOut{}, nil })
	r, err := c.OutputSchema.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*schemaOut{{}, {List: []string{"a"}, Items: []*schemaItem{{N: 1}}, Ptr: &schemaItem{N: 2}, Map: map[string]any{"k": nil}}} {
		b, err := c.Structured(v)
		if err != nil {
			t.Fatal(err)
		}
		var g any
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		if err := r.Validate(g); err != nil {
			t.Errorf("%s: %v", b, err)
		}
	}
	if b, _ := c.Structured(&schemaOut{}); string(b) != `{"items":[],"list":[],"map":{}}` {
		t.Errorf("empty output: %s", b)
	}
}
