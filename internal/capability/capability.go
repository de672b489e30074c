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
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
)

// Scope is the permission a caller needs to use a capability. A caller's
// scope may also be a comma-separated set ("exec,install"): install is
// not part of the read ⊂ exec ⊂ admin chain, so a token can hold exec
// without it, or both.
type Scope string

// The scopes: read ⊂ exec ⊂ admin, and install beside them.
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
	// Streams: the handler reports output as it arrives, to the
	// runcode.OutputFunc of its context, so an access path may pass it on
	// before the result (GET /v1/stream/{capability}). Declared at
	// registration with Streaming.
	Streams bool

	// Short and Essential are what a compact profile lists (Brief): a
	// description of a few sentences and the inputs a model needs most.
	Short     string
	Essential []string
	// Hints say what the capability does, by meaning (MCP annotations).
	Hints Hints

	// Use is how the capability uses the session its input names
	// (InSession): the controller enters that session, in this mode,
	// before the handler runs. UseNone: the handler names none.
	Use Use

	input  *jsonschema.Resolved
	decode func(args json.RawMessage) (any, error)
	run    func(ctx context.Context, in any) (any, error)
	zero   any // a zero value of the input's type
	// output decodes an output's JSON form into a value of Out.
	output func(data json.RawMessage) (any, error)
}

// Use is how a call uses the session its input names. The controller
// enters the session in that mode before the handler runs and leaves it
// when the handler returns (session.Life), for every access path: no
// handler enters a session itself.
type Use uint8

// The uses, weakest first.
const (
	// UseNone: the capability names no session (create_session, the
	// service and admin capabilities).
	UseNone Use = iota
	// UseRead looks the session up and refuses one being destroyed; the call
	// is not waited for by a destroy (it changes nothing).
	UseRead
	// UseHold counts the call in the session: a destroy cancels it and waits
	// for it. The session is neither resumed nor marked used, and a pause
	// goes ahead with it running (a snapshot, a watch, following output).
	UseHold
	// UseBusy is UseHold that may run something in the box and wait for it:
	// the session is marked used and resumed if paused, and a pause waits
	// for the call (a run, a command, terminal input).
	UseBusy
)

// String names the use.
func (u Use) String() string {
	switch u {
	case UseRead:
		return "read"
	case UseHold:
		return "hold"
	case UseBusy:
		return "busy"
	}
	return "none"
}

// SessionInput is implemented by the input of a capability that uses a
// session (InSession): SessionRef is the session's id or name as the
// caller gave it ("": the caller's default session).
type SessionInput interface{ SessionRef() string }

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
		decode: func(args json.RawMessage) (any, error) {
			var v In
			if err := checkArgs(name, in, resolved, args, &v); err != nil {
				return nil, err
			}
			return v, nil
		},
		run: func(ctx context.Context, v any) (any, error) {
			typed, ok := v.(In)
			if !ok {
				return nil, Errorf(Internal, "%s takes %T, not %T", name, typed, v)
			}
			return h(ctx, typed)
		},
		zero: *new(In),
		output: func(data json.RawMessage) (any, error) {
			var v Out
			if err := json.Unmarshal(data, &v); err != nil {
				return nil, Errorf(Internal, "the output of %s is not its JSON form: %v", name, err)
			}
			return v, nil
		},
	}
}

// InSession declares that c uses the session its input names, in mode
// use, and returns c: reg.Register(capability.New(...).InSession(UseBusy)).
// The input type must implement SessionInput (New panics otherwise: a
// programmer error).
func (c *Capability) InSession(use Use) *Capability {
	if _, ok := c.zero.(SessionInput); !ok && use != UseNone {
		panic(fmt.Sprintf("capability %s: InSession(%s), but its input does not name a session (SessionInput)", c.Name, use))
	}
	c.Use = use
	return c
}

// RunsCode reports whether a call of c runs what its caller wrote in a
// session (run_code, terminal_exec, start_process…): it needs scope exec
// and its hints are destructive and open-world, as internal/app's
// runsCode (a capability given no hints there is assumed to be one).
// Such a call takes one of its tenant's run slots while it is in flight
// (controller.Limits); the others (files, kill, status, lists, sessions)
// take none.
func (c *Capability) RunsCode() bool {
	return c.Scope == ScopeExec && c.Hints.Destructive && c.Hints.OpenWorld && !c.Hints.ReadOnly
}

// Streaming declares that c reports its output as it arrives (Streams)
// and returns c: reg.Register(capability.New(...).Streaming()).
func (c *Capability) Streaming() *Capability {
	c.Streams = true
	return c
}

// Call decodes args strictly (unknown fields and trailing data are errors),
// validates them against the input schema and runs the handler. It enters
// no session: the controller does (Decode, then Run).
func (c *Capability) Call(ctx context.Context, args json.RawMessage) (any, error) {
	v, err := c.decode(args)
	if err != nil {
		return nil, err
	}
	return c.run(ctx, v)
}

// Decode decodes args strictly and validates them against the input
// schema, returning the typed input (a value of the handler's In).
func (c *Capability) Decode(args json.RawMessage) (any, error) { return c.decode(args) }

// Check checks in, a typed input for c (controller.Invoke), against the
// input schema, through its JSON form args (encoding's error: jsonErr),
// as Decode checks JSON arguments. It returns in.
func (c *Capability) Check(in any, args json.RawMessage, jsonErr error) (any, error) {
	if reflect.TypeOf(in) != reflect.TypeOf(c.zero) {
		return nil, Errorf(Internal, "%s takes %T, not %T", c.Name, c.zero, in)
	}
	if jsonErr != nil {
		return nil, Errorf(InvalidArgument, "bad arguments for %s: %v", c.Name, jsonErr)
	}
	var generic any
	if err := json.Unmarshal(normalize(args), &generic); err != nil {
		return nil, Errorf(InvalidArgument, "bad arguments for %s: %v", c.Name, err)
	}
	if err := c.input.Validate(generic); err != nil {
		return nil, Errorf(InvalidArgument, "bad arguments for %s: %s", c.Name, strings.TrimPrefix(err.Error(), "validating root: "))
	}
	return in, nil
}

// DecodeOutput decodes data, an output of c in its JSON form (as the REST
// route of another node answered it), into a value of the handler's Out:
// what Run would have returned, for a call another node ran.
func (c *Capability) DecodeOutput(data json.RawMessage) (any, error) { return c.output(data) }

// Run runs the handler on in, a value of its input type (from Decode, or
// built by an access path that calls with typed inputs).
func (c *Capability) Run(ctx context.Context, in any) (any, error) { return c.run(ctx, in) }

// SessionOptional is a SessionInput that may name no session at all
// (fork_session of a snapshot): then no session is entered.
type SessionOptional interface {
	SessionInput
	NamesSession() bool
}

// SessionRef is the session in (a value of c's input type) names and
// whether the call enters it: false for a capability not InSession, or an
// input that names none (SessionOptional).
func (c *Capability) SessionRef(in any) (ref string, enter bool) {
	si, ok := in.(SessionInput)
	if !ok || c.Use == UseNone {
		return "", false
	}
	if so, ok := in.(SessionOptional); ok && !so.NamesSession() {
		return "", false
	}
	return si.SessionRef(), true
}

// HasRequiredInput reports whether the capability needs any argument.
func (c *Capability) HasRequiredInput() bool { return len(c.InputSchema.Required) > 0 }

func normalize(args json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(args); len(t) == 0 || string(t) == "null" {
		return json.RawMessage("{}")
	}
	return args
}

// checkArgs decodes args into v and validates them against the input
// schema, with errors a model can act on: where the JSON is broken, which
// required fields are missing and what they are, which known field an
// unknown one was probably meant to be.
func checkArgs(name string, schema *jsonschema.Schema, resolved *jsonschema.Resolved, args json.RawMessage, v any) *Error {
	bad := func(err error) *Error {
		return Errorf(InvalidArgument, "bad arguments for %s: %v", name, err)
	}
	if err := decodeStrict(args, v); err != nil {
		var uf *unknownFieldError
		if errors.As(err, &uf) {
			return bad(errors.New(uf.describe(schema)))
		}
		return bad(err)
	}
	var generic any
	if err := json.Unmarshal(normalize(args), &generic); err != nil {
		return bad(err)
	}
	if obj, ok := generic.(map[string]any); ok {
		// encoding/json matches field names in any case, so "Code" got
		// past decodeStrict: the schema's names are exact.
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			if _, ok := schema.Properties[k]; !ok {
				return bad(errors.New((&unknownFieldError{k}).describe(schema)))
			}
		}
		var missing []string
		for _, f := range schema.Required {
			if _, ok := obj[f]; !ok {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			return Errorf(InvalidArgument, "%s", MissingFields(name, schema, missing))
		}
	}
	if err := resolved.Validate(generic); err != nil {
		return bad(errors.New(strings.TrimPrefix(err.Error(), "validating root: ")))
	}
	return nil
}

// MissingFields says, in words, which required fields of a capability's
// input are missing: `run_code needs "code" (the source code to run)`.
func MissingFields(name string, schema *jsonschema.Schema, missing []string) string {
	parts := make([]string, len(missing))
	for i, f := range missing {
		parts[i] = strconv.Quote(f)
		if p := schema.Properties[f]; p != nil && p.Description != "" {
			parts[i] += " (" + p.Description + ")"
		}
	}
	list := parts[0]
	if n := len(parts); n > 1 {
		list = strings.Join(parts[:n-1], ", ") + " and " + parts[n-1]
	}
	return name + " needs " + list
}

// unknownFieldError is a field the input type does not have.
type unknownFieldError struct{ field string }

func (e *unknownFieldError) Error() string { return fmt.Sprintf("unknown field %q", e.field) }

// describe names the closest known field, or lists them all.
func (e *unknownFieldError) describe(schema *jsonschema.Schema) string {
	known := slices.Sorted(maps.Keys(schema.Properties))
	if s := Closest(e.field, known); s != "" {
		return fmt.Sprintf("unknown field %q; did you mean %q?", e.field, s)
	}
	if len(known) == 0 {
		return fmt.Sprintf("unknown field %q; this capability takes no arguments", e.field)
	}
	return fmt.Sprintf("unknown field %q; the fields are %s", e.field, strings.Join(known, ", "))
}

// Closest returns the candidate nearest to s (a typo, a different case, a
// prefix such as "timeout" for "timeout_ms"), or "" when none is close.
func Closest(s string, candidates []string) string {
	best, bestD := "", -1
	ls := strings.ToLower(s)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		d := editDistance(ls, lc)
		if lc == ls {
			d = 0
		} else if short, long := min(len(ls), len(lc)), max(len(ls), len(lc)); short >= 3 && 2*short >= long &&
			(strings.HasPrefix(lc, ls) || strings.HasPrefix(ls, lc)) {
			d = 1
		}
		if d > max(1, min(len(s), len(c))/3) {
			continue
		}
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// JSONError describes an error of decoding data as JSON for a person: a
// syntax error says where (line and column, counted from 1), the end of
// data before the value is complete says so.
func JSONError(data []byte, err error) error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		if strings.Contains(se.Error(), "end of JSON input") {
			return endedEarly(data)
		}
		line, col := Position(data, se.Offset)
		return fmt.Errorf("invalid JSON at line %d, column %d: %s", line, col, se.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return endedEarly(data)
	}
	return err
}

func endedEarly(data []byte) error {
	t := bytes.TrimRight(data, " \t\r\n")
	line, col := Position(append(t[:len(t):len(t)], ' '), int64(len(t)+1))
	return fmt.Errorf("invalid JSON: it ends at line %d, column %d before the value is complete (a missing }, ] or \")", line, col)
}

// Position turns a byte offset of data into a line and column, both
// counted from 1. json.SyntaxError's offset counts the bytes read before
// the error, the offending byte included: that byte's column.
func Position(data []byte, offset int64) (line, col int) {
	offset = max(0, min(offset, int64(len(data))))
	before := data[:offset]
	if offset > 0 {
		before = data[:offset-1] // the offending byte itself
	}
	line = bytes.Count(before, []byte("\n")) + 1
	col = utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return line, col
}

func decodeStrict(args json.RawMessage, v any) error {
	data := normalize(args)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field != "" {
				return fmt.Errorf("field %q must be %s, not %s", te.Field, kindName(te.Type), te.Value)
			}
			return fmt.Errorf("the arguments must be a JSON object, not %s", jsonKind(te.Value))
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			if name, err := strconv.Unquote(f); err == nil {
				return &unknownFieldError{name}
			}
		}
		return JSONError(data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

func jsonKind(v string) string {
	switch v {
	case "array", "object":
		return "an " + v
	case "string", "number":
		return "a " + v
	case "bool":
		return "true or false"
	}
	return v
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
	byName   map[string]*Capability
	profiles map[string]*Profile
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

// Streaming returns the sorted names of the capabilities that stream
// their output (Capability.Streams).
func (r *Registry) Streaming() []string {
	var n []string
	for _, c := range r.List() {
		if c.Streams {
			n = append(n, c.Name)
		}
	}
	return n
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

// The codes; rest.Status maps each to its HTTP status.
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
	// RetryAfter, for ResourceExhausted or Unavailable, is how many seconds a caller
	// should wait before trying again (0: not said).
	RetryAfter int `json:"retry_after_seconds,omitempty"`
	// cause is the domain error the controller classified (never sent:
	// an access path in the same process tests it with errors.Is).
	cause error
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Unwrap is the domain error e was classified from (nil when none).
func (e *Error) Unwrap() error { return e.cause }

// WithCause sets the domain error e was classified from and returns e.
func (e *Error) WithCause(err error) *Error {
	e.cause = err
	return e
}

// Errorf returns an *Error.
func Errorf(code Code, format string, a ...any) *Error {
	return &Error{Code: code, Message: strings.TrimSpace(fmt.Sprintf(format, a...))}
}
