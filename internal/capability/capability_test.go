package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

type in struct {
	Name  string `json:"name" jsonschema:"who"`
	Count int    `json:"count,omitempty"`
}

type out struct {
	Greeting string `json:"greeting"`
}

func (o out) Text() string { return o.Greeting }

func greet() *Capability {
	return New("greet", "Say hello.", ScopeRead, func(ctx context.Context, i in) (out, error) {
		return out{Greeting: strings.Repeat("hi "+i.Name+" ", max(i.Count, 1))}, nil
	})
}

func TestSchemasComeFromTypes(t *testing.T) {
	c := greet()
	if len(c.InputSchema.Required) != 1 || c.InputSchema.Required[0] != "name" {
		t.Errorf("required %v", c.InputSchema.Required)
	}
	if c.InputSchema.Properties["name"].Description != "who" {
		t.Errorf("description not carried: %+v", c.InputSchema.Properties["name"])
	}
	if c.OutputSchema.Properties["greeting"] == nil {
		t.Error("output schema has no greeting")
	}
}

func TestCallDecodesStrictly(t *testing.T) {
	c := greet()
	for _, tc := range []struct {
		args string
		ok   bool
		msg  string
	}{
		{`{"name":"a"}`, true, ""},
		{`{"name":"a","count":2}`, true, ""},
		{`{}`, false, "name"},
		{``, false, "name"},
		{`null`, false, "name"},
		{`{"name":"a","extra":1}`, false, `unknown field "extra"`},
		{`{"name":5}`, false, `field "name" must be a string`},
		{`{"name":"a"}{}`, false, "after the JSON object"},
		{`[1]`, false, "bad arguments"},
	} {
		res, err := c.Call(context.Background(), json.RawMessage(tc.args))
		if tc.ok {
			if err != nil {
				t.Errorf("%s: %v", tc.args, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Code != InvalidArgument || !strings.Contains(ce.Message, tc.msg) {
			t.Errorf("%s: got %v %v; want invalid_argument with %q", tc.args, res, err, tc.msg)
		}
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	r.Register(greet())
	if _, ok := r.Get("greet"); !ok {
		t.Fatal("not found")
	}
	defer func() {
		if recover() == nil {
			t.Error("registering twice did not panic")
		}
	}()
	r.Register(greet())
}

func TestScopes(t *testing.T) {
	for _, tc := range []struct {
		have, need Scope
		ok         bool
	}{
		{ScopeAdmin, ScopeExec, true}, {ScopeAdmin, ScopeRead, true}, {ScopeExec, ScopeRead, true},
		{ScopeExec, ScopeAdmin, false}, {ScopeRead, ScopeExec, false}, {"", ScopeRead, false},
		// install is beside exec, not beneath it: only admin or install itself covers it.
		{ScopeExec, ScopeInstall, false}, {ScopeRead, ScopeInstall, false}, {ScopeAdmin, ScopeInstall, true},
		{ScopeInstall, ScopeInstall, true}, {ScopeInstall, ScopeRead, true}, {ScopeInstall, ScopeExec, false},
		{"exec,install", ScopeInstall, true}, {"exec,install", ScopeExec, true}, {"exec,install", ScopeAdmin, false},
		{"read,install", ScopeExec, false}, {"exec,", ScopeInstall, false}, {",", ScopeRead, false}, {"execinstall", ScopeExec, false},
	} {
		if got := tc.have.Covers(tc.need); got != tc.ok {
			t.Errorf("%q covers %q = %v", tc.have, tc.need, got)
		}
	}
}

// A pointer output is an object (a success always has a value), and a
// json.RawMessage field accepts any JSON value, not an array of bytes.
func TestSchemaShapes(t *testing.T) {
	type rawIn struct {
		Args []json.RawMessage `json:"args,omitempty"`
	}
	c := New("raw", "Raw.", ScopeRead, func(ctx context.Context, i rawIn) (*out, error) {
		return &out{Greeting: fmt.Sprint(len(i.Args))}, nil
	})
	if c.OutputSchema.Type != "object" || c.OutputSchema.Types != nil {
		t.Errorf("output root type %q %v, want object", c.OutputSchema.Type, c.OutputSchema.Types)
	}
	if _, err := c.Call(context.Background(), json.RawMessage(`{"args":[1,"two",{"three":3},null,[4]]}`)); err != nil {
		t.Errorf("any JSON values as args: %v", err)
	}
}

type runIn struct {
	Code      string `json:"code" jsonschema:"the source to run"`
	Lang      string `json:"lang,omitempty" jsonschema:"language"`
	Session   string `json:"session" jsonschema:"session id or name"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

func runner() *Capability {
	return New("run_code", "Run code.", ScopeExec, func(ctx context.Context, i runIn) (out, error) {
		return out{Greeting: i.Code}, nil
	})
}

// TestErrorsSayWhatToFix: each kind of bad argument gets a message that
// says what to change, in the words a model can act on.
func TestErrorsSayWhatToFix(t *testing.T) {
	c := runner()
	for _, tc := range []struct{ args, want string }{
		{``, `run_code needs "code" (the source to run) and "session" (session id or name)`},
		{`{}`, `run_code needs "code" (the source to run) and "session" (session id or name)`},
		{`{"code":"1"}`, `run_code needs "session" (session id or name)`},
		{`{"code":"1","session":"s","lang_":"sh"}`, `unknown field "lang_"; did you mean "lang"?`},
		{`{"code":"1","session":"s","Code":"x"}`, `unknown field "Code"; did you mean "code"?`},
		{`{"code":"1","session":"s","timeout":5}`, `unknown field "timeout"; did you mean "timeout_ms"?`},
		{`{"code":"1","session":"s","zzzzzz":5}`, `unknown field "zzzzzz"; the fields are code, lang, session, timeout_ms`},
		{"{\n  \"code\": \"1\",\n  \"session\": \"s\"\n  \"lang\": \"sh\"\n}", `invalid JSON at line 4, column 3: invalid character '"' after object key:value pair`},
		{`{"code":"1",}`, `invalid JSON at line 1, column 13: invalid character '}'`},
		{"{\"code\":\n\"1\"", `invalid JSON: it ends at line 2, column 4 before the value is complete`},
		{`"print(1)"`, `the arguments must be a JSON object, not a string`},
		{`[1]`, `the arguments must be a JSON object, not an array`},
	} {
		_, err := c.Call(context.Background(), json.RawMessage(tc.args))
		var ce *Error
		if !errors.As(err, &ce) || ce.Code != InvalidArgument || !strings.Contains(ce.Message, tc.want) {
			t.Errorf("%q: got %v; want invalid_argument containing %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "validating root") {
			t.Errorf("%q: schema-validator jargon leaked: %v", tc.args, err)
		}
	}
}

func TestPosition(t *testing.T) {
	for _, tc := range []struct {
		data      string
		off       int64
		line, col int
	}{
		{`{x`, 2, 1, 2},
		{"{\n x", 4, 2, 2},
		{"{\"é\":1,x", 9, 1, 8}, // columns count characters, not bytes
		{``, 0, 1, 1},
	} {
		if l, c := Position([]byte(tc.data), tc.off); l != tc.line || c != tc.col {
			t.Errorf("Position(%q, %d) = %d:%d, want %d:%d", tc.data, tc.off, l, c, tc.line, tc.col)
		}
	}
}

func TestClosest(t *testing.T) {
	known := []string{"code", "lang", "session", "timeout_ms"}
	for in, want := range map[string]string{"lang_": "lang", "sesion": "session", "LANG": "lang", "timeout": "timeout_ms", "x": "", "language_model": ""} {
		if got := Closest(in, known); got != want {
			t.Errorf("Closest(%q) = %q, want %q", in, got, want)
		}
	}
}
