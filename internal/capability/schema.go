package capability

import (
	"encoding/json"
	"reflect"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
)

// anyJSON is the schema of a value that may be any JSON value. It names
// every JSON type instead of being the bare `true` (or `{}`) that
// jsonschema-go derives for json.RawMessage and interface types: strict
// clients (the MCP Inspector, Claude Code) reject a bare boolean subschema
// and warn on an untyped property.
func anyJSON() *jsonschema.Schema {
	return &jsonschema.Schema{Types: []string{"object", "array", "string", "number", "boolean", "null"}}
}

// schemaOptions derive the schemas: a json.RawMessage or an interface
// value (any) is any JSON value — left to themselves they would be an
// array of bytes and a bare `true`.
var schemaOptions = &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[json.RawMessage](): anyJSON(),
	reflect.TypeFor[any]():             anyJSON(),
}}

// tighten rewrites a derived schema into the form strict MCP clients
// accept, in place. jsonschema-go marks every Go slice, map and pointer as
// nullable (`"type": ["null", "array"]`); a property's null only ever
// means "empty" or "not there" (a nil slice, a nil pointer), so a
// property or an array item gets its one real type. An array stays
// required (Structured turns its null into []); an object or scalar that
// was nullable is no longer required (Structured drops its null). A map's
// values keep their null: there it is a value of its own (set_session_env
// unsets a variable whose value is null).
func tighten(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	for name, p := range s.Properties {
		if t, ok := nonNull(p); ok {
			p.Type, p.Types = t, nil
			if t != "array" {
				s.Required = slices.DeleteFunc(s.Required, func(r string) bool { return r == name })
			}
		}
		tighten(p)
	}
	if s.Items != nil {
		if t, ok := nonNull(s.Items); ok {
			s.Items.Type, s.Items.Types = t, nil
		}
		tighten(s.Items)
	}
	tighten(s.AdditionalProperties)
}

// nonNull reports the one type of a schema typed ["null", T].
func nonNull(s *jsonschema.Schema) (string, bool) {
	if len(s.Types) != 2 || !slices.Contains(s.Types, "null") {
		return "", false
	}
	for _, t := range s.Types {
		if t != "null" {
			return t, true
		}
	}
	return "", false
}

// Structured is out as JSON that matches the capability's output schema:
// where the schema (tightened) says a property is an array, a null (a nil
// Go slice) becomes []; a required object's null (a nil map) becomes {};
// any other null property the schema does not allow (a nil pointer, not
// required) is left out. Access paths that promise
// the output schema (MCP's structuredContent) send this.
func (c *Capability) Structured(out any) (json.RawMessage, error) {
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	if !fillNulls(c.OutputSchema, v) {
		return b, nil
	}
	return json.Marshal(v)
}

// fillNulls rewrites the nulls of v (decoded JSON) along s; it reports
// whether it changed anything.
func fillNulls(s *jsonschema.Schema, v any) bool {
	if s == nil {
		return false
	}
	changed := false
	switch v := v.(type) {
	case map[string]any:
		for name, val := range v {
			p := s.Properties[name]
			if p == nil {
				if s.AdditionalProperties != nil && fillNulls(s.AdditionalProperties, val) {
					changed = true
				}
				continue
			}
			if val == nil && p.Type != "" && p.Type != "null" {
				switch {
				case p.Type == "array":
					v[name] = []any{}
				case p.Type == "object" && slices.Contains(s.Required, name):
					v[name] = map[string]any{} // a nil map
				default:
					delete(v, name)
				}
				changed = true
				continue
			}
			if fillNulls(p, val) {
				changed = true
			}
		}
	case []any:
		for _, it := range v {
			if fillNulls(s.Items, it) {
				changed = true
			}
		}
	}
	return changed
}
