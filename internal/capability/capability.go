// Package capability is the registry of what Quro can do. A capability is
// declared once — name, description for models, scope, input and output JSON
// schemas derived from its Go types, and handler — and every access path
// (REST routes, MCP tools, the CLI, help and list_capabilities) is generated
// from that one declaration, so descriptions and behaviour cannot drift.
package capability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Scope is the permission a caller needs to use a capability. A caller's
// scope may also be a comma-separated set ("exec,install"): install is
// not part of the read ⊂ exec ⊂ admin chain, so a token can hold exec
// without it, or both.
type Scope string

const (
	ScopeRead  Scope = "read"  // status, lists, output
	ScopeExec  Scope = "exec"  // running code and commands
	ScopeAdmin Scope = "admin" // tokens, destroying, repairing a rootfs
	// ScopeInstall changes a shared rootfs (install_packages, installing a
	// missing rootfs on first use): what it adds every session of that
	// rootfs sees, across tenants, so exec does not imply it.
	ScopeInstall Scope = "install"
)

// Covers reports whether a caller holding s (one scope or a
// comma-separated set) may use a capability needing need: admin covers
// everything, exec covers read, install covers read.
func (s Scope) Covers(need Scope) bool {
	for _, h := range strings.Split(string(s), ",") {
		switch Scope(h) {
		case ScopeAdmin:
			return true
		case ScopeExec, ScopeInstall:
			if need == Scope(h) || need == ScopeRead {
				return true
			}
		case ScopeRead:
			if need == ScopeRead {
				return true
			}
		}
	}
	return false
}

// Texter is implemented by outputs that have a model-facing text form.
type Texter interface{ Text() string }

// Capability is one declared capability.
type Capability struct {
	Name         string
	Description  string
	Scope        Scope
	InputSchema  *jsonschema.Schema
	OutputSchema *jsonschema.Schema

	input   *jsonschema.Resolved
	handler func(ctx context.Context, args json.RawMessage) (any, error)
}

// New declares a capability with typed input and output. The schemas are
// derived from In and Out (field tags `json` and `jsonschema`); fields
// without omitempty are required. New panics on a programmer error (a type
// that has no schema).
func New[In, Out any](name, description string, scope Scope, h func(ctx context.Context, in In) (Out, error)) *Capability {
	in, err := jsonschema.For[In](schemaOptions)
	if err != nil {
		panic(fmt.Sprintf("capability %s: input schema: %v", name, err))
	}
	in.AdditionalProperties = &jsonschema.Schema{Not: &jsonschema.Schema{}}
	tighten(in)
	out, err := jsonschema.For[Out](schemaOptions)
	if err != nil {
		panic(fmt.Sprintf("capability %s: output schema: %v", name, err))
	}
	tighten(out)
	// A successful call always returns a value, so the output of a pointer
	// type is an object, never null. MCP requires an output schema whose
	// root is {"type":"object"}, and clients check it.
	if len(out.Types) == 2 && slices.Contains(out.Types, "null") && slices.Contains(out.Types, "object") {
		out.Types, out.Type = nil, "object"
	}
	resolved, err := in.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("capability %s: input schema: %v", name, err))
	}
	return &Capability{
		Name: name, Description: description, Scope: scope,
		InputSchema: in, OutputSchema: out, input: resolved,
		handler: func(ctx context.Context, args json.RawMessage) (any, error) {
			var v In
			if err := decodeStrict(args, &v); err != nil {
				return nil, Errorf(InvalidArgument, "bad arguments for %s: %v", name, err)
			}
			var generic any
			if err := json.Unmarshal(normalize(args), &generic); err == nil {
				if err := resolved.Validate(generic); err != nil {
					return nil, Errorf(InvalidArgument, "bad arguments for %s: %v", name, err)
				}
			}
			return h(ctx, v)
		},
	}
}

// Call decodes args strictly (unknown fields and trailing data are errors),
// validates them against the input schema and runs the handler.
func (c *Capability) Call(ctx context.Context, args json.RawMessage) (any, error) {
	return c.handler(ctx, args)
}

// HasRequiredInput reports whether the capability needs any argument.
func (c *Capability) HasRequiredInput() bool { return len(c.InputSchema.Required) > 0 }

func normalize(args json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(args); len(t) == 0 || string(t) == "null" {
		return json.RawMessage("{}")
	}
	return args
}

func decodeStrict(args json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(normalize(args)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("field %q must be %s, not %s", te.Field, kindName(te.Type), te.Value)
		}
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice:
		return "an array"
	}
	return t.String()
}

// Registry holds the declared capabilities. Register everything before
// serving; after that it is read-only and safe for concurrent use.
type Registry struct {
	byName map[string]*Capability
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{byName: map[string]*Capability{}} }

// Register adds c; a second capability of the same name panics.
func (r *Registry) Register(c *Capability) {
	if _, dup := r.byName[c.Name]; dup {
		panic("capability registered twice: " + c.Name)
	}
	r.byName[c.Name] = c
}

// Get returns the named capability.
func (r *Registry) Get(name string) (*Capability, bool) {
	c, ok := r.byName[name]
	return c, ok
}

// List returns the capabilities sorted by name.
func (r *Registry) List() []*Capability {
	out := make([]*Capability, 0, len(r.byName))
	for _, c := range r.byName {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Names returns the sorted capability names.
func (r *Registry) Names() []string {
	var n []string
	for _, c := range r.List() {
		n = append(n, c.Name)
	}
	return n
}

// Code is a stable error code that access paths translate into a status.
type Code string

const (
	InvalidArgument   Code = "invalid_argument"
	NotFound          Code = "not_found"
	AlreadyExists     Code = "already_exists"
	PermissionDenied  Code = "permission_denied"
	Unauthenticated   Code = "unauthenticated"
	ResourceExhausted Code = "resource_exhausted"
	Busy              Code = "busy" // the session is still running something
	Unavailable       Code = "unavailable"
	Canceled          Code = "canceled"
	DeadlineExceeded  Code = "deadline_exceeded"
	Internal          Code = "internal"
)

// Error is a failure of a capability call (not of the user's code).
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// RetryAfter, for ResourceExhausted, is how many seconds a caller
	// should wait before trying again (0: not said).
	RetryAfter int `json:"retry_after_seconds,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error.
func Errorf(code Code, format string, a ...any) *Error {
	return &Error{Code: code, Message: strings.TrimSpace(fmt.Sprintf(format, a...))}
}
