package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	strictschema "github.com/santhosh-tekuri/jsonschema/v6"

	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/app"
)

// compileStrict compiles a schema (raw JSON) with an independent validator:
// the schema itself is checked against the JSON Schema 2020-12 metaschema,
// with vocabularies and formats asserted.
func compileStrict(raw []byte) (*strictschema.Schema, error) {
	doc, err := strictschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := strictschema.NewCompiler()
	c.DefaultDraft(strictschema.Draft2020)
	c.AssertVocabs()
	c.AssertFormat()
	if err := c.AddResource("quro:schema.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("quro:schema.json")
}

var jsonTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

// lintSchema applies the rules strict MCP clients (the MCP Inspector's
// strict check, Claude Code's tool-list parser) hold tool schemas to, and
// returns one line per breach:
//   - the root is {"type": "object"};
//   - no subschema is a bare boolean, save `additionalProperties: false`
//     (a closed object, which every client understands);
//   - every subschema names its type (a JSON type or a list of them), and
//     a property or array item is never "nullable" (["null", T]);
//   - every object says what other properties it takes: additionalProperties
//     false or a typed schema, never true or left out;
//   - when input is set, every property has a description (a model reads
//     them to call the tool).
func lintSchema(raw []byte, input bool) []string {
	var root any
	if err := json.Unmarshal(raw, &root); err != nil {
		return []string{err.Error()}
	}
	var out []string
	bad := func(path, format string, a ...any) { out = append(out, path+": "+fmt.Sprintf(format, a...)) }
	if m, ok := root.(map[string]any); !ok || m["type"] != "object" {
		bad("$", "the root must be {\"type\": \"object\"}")
	}
	var walk func(s any, path string, role string)
	walk = func(s any, path, role string) {
		m, ok := s.(map[string]any)
		if !ok {
			if b, isBool := s.(bool); !(isBool && !b && role == "additionalProperties") {
				bad(path, "a bare %v is not a schema strict clients accept", s)
			}
			return
		}
		composed := false
		for _, k := range []string{"anyOf", "oneOf", "allOf", "$ref", "enum", "const"} {
			if _, ok := m[k]; ok {
				composed = true
			}
		}
		switch t := m["type"].(type) {
		case string:
			if !slices.Contains(jsonTypes, t) {
				bad(path, "unknown type %q", t)
			}
		case []any:
			var ts []string
			for _, x := range t {
				xs, _ := x.(string)
				if !slices.Contains(jsonTypes, xs) {
					bad(path, "unknown type %v", x)
				}
				ts = append(ts, xs)
			}
			if len(ts) == 2 && slices.Contains(ts, "null") && (role == "property" || role == "items") {
				bad(path, "nullable type %v: a property or item has one type", ts)
			}
		case nil:
			if !composed {
				bad(path, "no type")
			}
		default:
			bad(path, "type %v is neither a name nor a list", t)
		}
		if m["type"] == "object" {
			switch ap := m["additionalProperties"].(type) {
			case nil:
				bad(path, "an object without additionalProperties (false or a typed schema)")
			case bool:
				if ap {
					bad(path, "additionalProperties true: say what the other properties are")
				}
			}
		}
		if input && role == "property" {
			if d, _ := m["description"].(string); strings.TrimSpace(d) == "" {
				bad(path, "no description")
			}
		}
		if props, ok := m["properties"].(map[string]any); ok {
			for name, p := range props {
				walk(p, path+".properties."+name, "property")
			}
		}
		if it, ok := m["items"]; ok {
			walk(it, path+".items", "items")
		}
		if ap, ok := m["additionalProperties"]; ok {
			walk(ap, path+".additionalProperties", "additionalProperties")
		}
		for _, k := range []string{"anyOf", "oneOf", "allOf", "prefixItems"} {
			list, _ := m[k].([]any)
			for i, x := range list {
				walk(x, fmt.Sprintf("%s.%s[%d]", path, k, i), k)
			}
		}
		if n, ok := m["not"]; ok {
			walk(n, path+".not", "not")
		}
		if defs, ok := m["$defs"].(map[string]any); ok {
			for name, d := range defs {
				walk(d, path+".$defs."+name, "def")
			}
		}
	}
	walk(root, "$", "root")
	slices.Sort(out)
	return out
}

// Every tool's input and output schema, as a client receives them from
// tools/list, compiles against the 2020-12 metaschema and passes the
// strict clients' rules; every tool has a description. In every profile:
// full lists every capability, a compact one its members' short forms.
func TestToolSchemasStrict(t *testing.T) {
	a := newApp(t)
	for _, profile := range a.Controller.Registry().ProfileNames() {
		t.Run(profile, func(t *testing.T) { checkSchemasStrict(t, a, profile) })
	}
}

func checkSchemasStrict(t *testing.T, a *app.App, profile string) {
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := quromcp.NewServer(a.Controller, quromcp.LocalCaller, &quromcp.Options{Tools: profile})
	if err != nil {
		t.Fatal(err)
	}
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "schema-test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if strings.TrimSpace(tl.Description) == "" {
			t.Errorf("%s: no description", tl.Name)
		}
		for _, sc := range []struct {
			kind   string
			schema any
		}{{"input", tl.InputSchema}, {"output", tl.OutputSchema}} {
			raw, err := json.Marshal(sc.schema)
			if err != nil || sc.schema == nil {
				t.Errorf("%s: %s schema: %v (%s)", tl.Name, sc.kind, err, raw)
				continue
			}
			if _, err := compileStrict(raw); err != nil {
				t.Errorf("%s: %s schema does not compile against the 2020-12 metaschema: %v", tl.Name, sc.kind, err)
			}
			for _, p := range lintSchema(raw, sc.kind == "input") {
				t.Errorf("%s: %s schema %s", tl.Name, sc.kind, p)
			}
		}
	}
	slices.Sort(names)
	if profile != "full" {
		return
	}
	if want := a.Controller.Registry().Names(); !slices.Equal(names, want) {
		t.Fatalf("tools/list gave %v, the registry has %v", names, want)
	}
}

// The rules catch what the Inspector reported (a bare `true` for
// call_js_function's args.items) and the other shapes they forbid, so
// TestToolSchemasStrict can fail.
func TestLintSchemaCatches(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"object","properties":{"args":{"type":"array","items":true,"description":"a"}},"additionalProperties":false}`, "args.items: a bare true"},
		{`{"type":"object","properties":{"x":{"description":"a"}},"additionalProperties":false}`, "properties.x: no type"},
		{`{"type":"object","properties":{"x":{"type":["null","array"],"items":{"type":"string"},"description":"a"}},"additionalProperties":false}`, "nullable type"},
		{`{"type":"object","properties":{"m":{"type":"object","additionalProperties":true,"description":"a"}},"additionalProperties":false}`, "additionalProperties true"},
		{`{"type":"object","properties":{"m":{"type":"object","description":"a"}},"additionalProperties":false}`, "properties.m: an object without additionalProperties"},
		{`{"type":"object","properties":{"x":{"type":"string"}},"additionalProperties":false}`, "properties.x: no description"},
		{`{"type":["null","object"],"additionalProperties":false}`, "the root must be"},
	} {
		got := strings.Join(lintSchema([]byte(tc.schema), true), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: lint said %q, want %q", tc.schema, got, tc.want)
		}
	}
	if _, err := compileStrict([]byte(`{"type":"object","properties":{"x":{"type":"strin"}}}`)); err == nil {
		t.Error("the metaschema check let an unknown type through")
	}
	if got := lintSchema([]byte(`{"type":"object","properties":{"x":{"type":"string","description":"d"}},"additionalProperties":false}`), true); len(got) != 0 {
		t.Errorf("a clean schema: %v", got)
	}
}
