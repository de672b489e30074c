// Package transpile owns esbuild's transform for the JavaScript engines
// (internal/engine/js and internal/engine/node): TypeScript's types
// stripped, import/export turned into CommonJS, a source with top-level
// await kept in ES syntax, errors with their positions.
//
// esbuild's parser recurses without a bound on nesting, and a stack
// overflow in Go is a fatal error no recover() catches: deeply nested code
// in the server's process would kill the server for every tenant. So
// esbuild never runs in the server: Transform re-executes the quro binary
// with Arg (dispatched in this package's init, before any command line is
// parsed) through sandbox.RunHelper, as nobody when the server is root,
// and the child drops every capability, sets no_new_privs and limits its
// own address space, CPU time and stack before it reads the request. The
// request is one JSON document on the child's stdin, the reply one on its
// stdout; the reply is read as hostile: bounded, decoded strictly and
// checked. A crash, a kill or the wall-clock timeout is an *Error for the
// caller, never more. One tenant's transforms (the tenant of the call's
// context) hold at most all but one of the children running at once.
package transpile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/session"
)

// Arg is the hidden first argument that makes the quro binary the esbuild
// child.
const Arg = "__quro_transpile"

// MaxSource bounds a source (run_code's code limit).
const MaxSource = 4 << 20

// DefaultTimeout is the wall-clock time a transform may take.
const DefaultTimeout = 10 * time.Second

// maxDiagnostics bounds the errors a reply carries.
const maxDiagnostics = 100

// Target is the JavaScript version esbuild writes.
type Target string

// The targets: QuickJS runs ES2022, Node the newest.
const (
	ES2022 Target = "es2022"
	ESNext Target = "esnext"
)

// Request is one transform.
type Request struct {
	Src  string `json:"src"`
	File string `json:"file"` // the name in diagnostics and the source map
	TS   bool   `json:"ts"`   // TypeScript, else JavaScript
	// Target is ES2022 or ESNext.
	Target Target `json:"target"`
	// SourceMap asks for the map from the output back to Src.
	SourceMap bool `json:"source_map"`
	// Timeout is the wall-clock bound (0: DefaultTimeout). Not sent.
	Timeout time.Duration `json:"-"`
}

// Diagnostic is one esbuild error. Line and Column are 1-based; Line is 0
// when esbuild gave no position.
type Diagnostic struct {
	Text     string `json:"text"`
	Line     int    `json:"line"`
	Column   int    `json:"column"`
	LineText string `json:"line_text"`
}

// Result is esbuild's answer: the code (and map), or the errors of a
// source it refused.
type Result struct {
	Code   string       `json:"code"`
	Map    []byte       `json:"map"`
	Errors []Diagnostic `json:"errors"`
}

// Kind is why a transform failed without esbuild's verdict.
type Kind int

const (
	// TooDeep is a child that died (its stack or memory exhausted).
	TooDeep Kind = iota + 1
	// TimedOut is a child killed at the timeout.
	TimedOut
)

// Error is a transform that did not come back: the child crashed or was
// killed at the timeout. Its text is for the model that sent the code.
type Error struct {
	Kind    Kind
	Timeout time.Duration
}

func (e *Error) Error() string {
	if e.Kind == TimedOut {
		return fmt.Sprintf("compiling took longer than %s: the code is too large or nests too deeply to compile", e.Timeout.Round(time.Second))
	}
	return "the code nests too deeply to compile (the compiler ran out of stack or memory)"
}

// slots bounds the children running at once.
var slots = make(chan struct{}, max(2, runtime.NumCPU()))

// perOwner bounds the transforms of one owner (the tenant of the call's
// context) that hold a slot at once: a source esbuild takes minutes over
// is cut only at the timeout, and one tenant's run_code calls in flight
// would otherwise hold every slot, one timeout after another, while every
// other tenant's TypeScript waited behind them. An owner's transforms
// past it wait in their own line, holding no slot.
var perOwner = max(1, cap(slots)-1)

// owner is the line of one owner's transforms.
type owner struct {
	slots   chan struct{} // at most perOwner
	entered int           // its transforms in Transform, waiting or running
}

var (
	ownersMu sync.Mutex
	ownersCh = sync.NewCond(&ownersMu) // signalled when entered changes
	owners   = map[string]*owner{}
)

// enter counts a transform of name's and returns its line.
func enter(name string) *owner {
	ownersMu.Lock()
	defer ownersMu.Unlock()
	o := owners[name]
	if o == nil {
		o = &owner{slots: make(chan struct{}, perOwner)}
		owners[name] = o
	}
	o.entered++
	ownersCh.Broadcast()
	return o
}

// leave ends the count enter began; an owner with no transform left is
// forgotten.
func leave(name string, o *owner) {
	ownersMu.Lock()
	defer ownersMu.Unlock()
	if o.entered--; o.entered == 0 {
		delete(owners, name)
	}
	ownersCh.Broadcast()
}

// acquire takes a slot of name's line, then one of the children's.
func acquire(ctx context.Context, name string) (release func(), err error) {
	o := enter(name)
	select {
	case o.slots <- struct{}{}:
	case <-ctx.Done():
		leave(name, o)
		return nil, ctx.Err()
	}
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		<-o.slots
		leave(name, o)
		return nil, ctx.Err()
	}
	return func() {
		<-slots
		<-o.slots
		leave(name, o)
	}, nil
}

// Transform runs req in a child process and returns esbuild's result. The
// error is ctx's, an *Error, or a failure to run or read the child.
func Transform(ctx context.Context, req *Request) (*Result, error) {
	if len(req.Src) > MaxSource {
		return nil, fmt.Errorf("transpile: source of %d bytes is over the limit of %d", len(req.Src), MaxSource)
	}
	if req.Target != ES2022 && req.Target != ESNext {
		return nil, fmt.Errorf("transpile: unknown target %q", req.Target)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	release, err := acquire(ctx, session.TenantFrom(ctx))
	if err != nil {
		return nil, err
	}
	defer release()

	timeout := req.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := exchange(tctx, body, replyBound(len(req.Src)))
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case tctx.Err() != nil:
		return nil, &Error{Kind: TimedOut, Timeout: timeout}
	case errors.Is(err, errDied):
		return nil, &Error{Kind: TooDeep}
	case err != nil:
		return nil, err
	}
	return decodeReply(reply)
}

// replyBound is the most a reply to a source of n bytes may hold: the code
// and its source map grow with the source.
func replyBound(n int) int { return 16*n + 1<<20 }

// decodeReply decodes and checks the child's reply.
func decodeReply(b []byte) (*Result, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r Result
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("transpile: the compiler's reply: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("transpile: the compiler's reply: data after the reply")
	}
	if len(r.Errors) > maxDiagnostics {
		return nil, fmt.Errorf("transpile: the compiler's reply has %d errors", len(r.Errors))
	}
	for _, d := range r.Errors {
		if d.Line < 0 || d.Column < 0 || (d.Line == 0) != (d.Column == 0) {
			return nil, errors.New("transpile: the compiler's reply has an error with a bad position")
		}
	}
	if len(r.Errors) > 0 && (r.Code != "" || len(r.Map) > 0) {
		return nil, errors.New("transpile: the compiler's reply has both code and errors")
	}
	return &r, nil
}

// ErrorText is the diagnostics as lines "file:line:col: text".
func ErrorText(file string, ds []Diagnostic) string {
	var b strings.Builder
	for _, d := range ds {
		if d.Line > 0 {
			fmt.Fprintf(&b, "%s:%d:%d: %s\n  %s\n", file, d.Line, d.Column, d.Text, d.LineText)
		} else {
			b.WriteString(d.Text + "\n")
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

func init() {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		os.Exit(childMain(os.Args[2:], os.Stdin, os.Stdout))
	}
}
