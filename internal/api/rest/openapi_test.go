package rest_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
)

// TestOpenAPIDocument checks the served document structurally: no
// maintained OpenAPI 3.1 validator is in the module graph (the ones on the
// proxy would upgrade production dependencies for a test).
func TestOpenAPIDocument(t *testing.T) {
	a := newApp(t)
	// The real capabilities plus stand-ins for those other branches add,
	// so that every route of the table is in the document.
	reg := capability.NewRegistry()
	for _, c := range a.Controller.Registry().List() {
		reg.Register(c)
	}
	for _, c := range fakeRegistry().List() {
		if _, ok := reg.Get(c.Name); !ok {
			reg.Register(c)
		}
	}
	srv := httptest.NewServer(rest.New(controller.New(reg, nil), &rest.Options{WebSocket: nopWS}))
	defer srv.Close()
	r := do(t, "GET", srv.URL+"/v1/openapi.json", "", "")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		t.Fatalf("%d %s", r.status, trim(r.body))
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["openapi"] != "3.1.0" || get(doc, "info", "title") == nil || get(doc, "info", "version") == "" {
		t.Fatalf("header: openapi=%v info=%v", doc["openapi"], doc["info"])
	}
	if s := get(doc, "components", "securitySchemes", "bearer"); !reflect.DeepEqual(pick(s, "type", "scheme"), map[string]any{"type": "http", "scheme": "bearer"}) {
		t.Errorf("bearer scheme: %v", s)
	}
	if !reflect.DeepEqual(doc["security"], []any{map[string]any{"bearer": []any{}}}) {
		t.Errorf("security: %v", doc["security"])
	}
	errSchema := get(doc, "components", "schemas", "Error", "properties", "error", "properties", "code", "enum")
	if codes, _ := errSchema.([]any); len(codes) != len(rest.ErrorCodes) {
		t.Errorf("error codes: %v", errSchema)
	}

	// Every $ref resolves inside the document.
	walk(doc, func(m map[string]any) {
		if ref, ok := m["$ref"].(string); ok {
			if resolve(doc, ref) == nil {
				t.Errorf("dangling $ref %s", ref)
			}
		}
	})

	// Every operation: unique id, path parameters declared, an error response.
	ids := map[string]string{}
	statusRE := regexp.MustCompile(`^([1-5][0-9][0-9]|[1-5]XX|default)$`)
	paths := get(doc, "paths").(map[string]any)
	if len(paths) < len(reg.List())+10 {
		t.Fatalf("only %d paths for %d capabilities and %d routes", len(paths), len(reg.List()), len(rest.Routes))
	}
	for path, item := range paths {
		if !strings.HasPrefix(path, "/v1/") {
			t.Errorf("path %s", path)
		}
		for method, op := range item.(map[string]any) {
			op := op.(map[string]any)
			id, _ := op["operationId"].(string)
			if id == "" || ids[id] != "" {
				t.Errorf("%s %s: operationId %q (also %s)", method, path, id, ids[id])
			}
			ids[id] = method + " " + path
			var declared []string
			for _, p := range asList(op["parameters"]) {
				p := p.(map[string]any)
				if p["in"] == "path" {
					if p["required"] != true {
						t.Errorf("%s %s: path parameter %v not required", method, path, p["name"])
					}
					declared = append(declared, p["name"].(string))
				}
			}
			for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(path, -1) {
				if !slices.Contains(declared, m[1]) {
					t.Errorf("%s %s: path parameter %s not declared", method, path, m[1])
				}
			}
			resps, _ := op["responses"].(map[string]any)
			if resps["default"] == nil {
				t.Errorf("%s %s: no error response", method, path)
			}
			for code := range resps {
				if !statusRE.MatchString(code) {
					t.Errorf("%s %s: response key %q", method, path, code)
				}
			}
		}
	}

	// Every capability is POST /v1/{name}, with the registry's schemas.
	for _, c := range reg.List() {
		op := get(doc, "paths", "/v1/"+c.Name, "post")
		if op == nil {
			t.Errorf("capability %s is not in the document", c.Name)
			continue
		}
		in := resolveSchema(doc, get(op, "requestBody", "content", "application/json", "schema"))
		out := resolveSchema(doc, get(op, "responses", "200", "content", "application/json", "schema"))
		if !reflect.DeepEqual(in, plain(c.InputSchema)) || !reflect.DeepEqual(out, plain(c.OutputSchema)) {
			t.Errorf("%s: schemas are not the registry's:\nin  %v\nout %v", c.Name, in, out)
		}
		if get(op, "x-quro-scope") != string(c.Scope) {
			t.Errorf("%s: scope %v", c.Name, get(op, "x-quro-scope"))
		}
	}

	// Every route of the table, with its capability's schemas.
	for _, rt := range rest.Routes {
		path := strings.ReplaceAll(rt.Pattern, "...}", "}")
		op := get(doc, "paths", path, strings.ToLower(rt.Method))
		if op == nil {
			t.Errorf("route %s %s is not in the document", rt.Method, rt.Pattern)
			continue
		}
		if rt.WebSocket != "" {
			if get(op, "responses", "101") == nil {
				t.Errorf("%s: no 101", rt.Pattern)
			}
			if get(op, "x-quro-websocket") != string(rt.WebSocket) {
				t.Errorf("%s: x-quro-websocket %v, want %q", rt.Pattern, get(op, "x-quro-websocket"), rt.WebSocket)
			}
			continue
		}
		c, _ := reg.Get(rt.Capability)
		status := "200"
		if rt.Status == 201 {
			status = "201"
		}
		out := get(op, "responses", status, "content", "application/json", "schema")
		if rt.DirCapability != "" {
			alt, _ := reg.Get(rt.DirCapability)
			list := asList(get(out, "oneOf"))
			if len(list) != 2 || !reflect.DeepEqual(resolveSchema(doc, list[0]), plain(c.OutputSchema)) || !reflect.DeepEqual(resolveSchema(doc, list[1]), plain(alt.OutputSchema)) {
				t.Errorf("%s %s: output is not the registry's", rt.Method, rt.Pattern)
			}
		} else if !reflect.DeepEqual(resolveSchema(doc, out), plain(c.OutputSchema)) {
			t.Errorf("%s %s: output is not %s's", rt.Method, rt.Pattern, c.Name)
		}
		if rt.Body == rest.BodyJSON {
			in := resolveSchema(doc, get(op, "requestBody", "content", "application/json", "schema")).(map[string]any)
			want := plain(c.InputSchema).(map[string]any)
			wantProps := want["properties"].(map[string]any)
			gotProps := in["properties"].(map[string]any)
			for name, s := range wantProps {
				if slices.Contains(mapValues(rt.Path), name) {
					if gotProps[name] != nil {
						t.Errorf("%s %s: body still has %s, which the path gives", rt.Method, rt.Pattern, name)
					}
				} else if !reflect.DeepEqual(gotProps[name], s) {
					t.Errorf("%s %s: body field %s is not the registry's", rt.Method, rt.Pattern, name)
				}
			}
			if len(gotProps) != len(wantProps)-len(rt.Path) {
				t.Errorf("%s %s: body fields %v", rt.Method, rt.Pattern, gotProps)
			}
		}
		for _, q := range rt.Query {
			found := false
			for _, p := range asList(get(op, "parameters")) {
				p := p.(map[string]any)
				if p["in"] == "query" && p["name"] == q {
					found = reflect.DeepEqual(p["schema"], plain(c.InputSchema).(map[string]any)["properties"].(map[string]any)[q])
				}
			}
			if !found {
				t.Errorf("%s %s: query parameter %s missing or not the registry's", rt.Method, rt.Pattern, q)
			}
		}
	}
}

var nopWS = map[rest.WebSocket]http.Handler{
	rest.WebSocketPTY:    http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
	rest.WebSocketStream: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
}

func plain(v any) any {
	b, _ := json.Marshal(v)
	var out any
	json.Unmarshal(b, &out)
	return out
}

func get(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func pick(v any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		out[k] = get(v, k)
	}
	return out
}

func asList(v any) []any { l, _ := v.([]any); return l }

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func resolve(doc map[string]any, ref string) any {
	if !strings.HasPrefix(ref, "#/") {
		return nil
	}
	return get(doc, strings.Split(ref[2:], "/")...)
}

func resolveSchema(doc map[string]any, s any) any {
	if m, ok := s.(map[string]any); ok {
		if ref, ok := m["$ref"].(string); ok {
			return resolve(doc, ref)
		}
	}
	return s
}

func walk(v any, fn func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		fn(v)
		for _, x := range v {
			walk(x, fn)
		}
	case []any:
		for _, x := range v {
			walk(x, fn)
		}
	}
}
