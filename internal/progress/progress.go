// Package progress carries a call's progress reporter in its context: an
// access path (MCP, WebSocket, CLI) that can show progress puts a reporter
// in the call's context, and slow work deep down (the first extraction of
// the embedded Python) reports into it, without either knowing the other.
package progress

import "context"

// Func receives one progress message: a short line saying what is being
// done and how far it got ("preparing the embedded Python: compiling 40%").
// It must be quick and safe for concurrent use.
type Func func(msg string)

type key struct{}

// With returns ctx carrying f; Report(ctx) calls it. A nil f leaves ctx as
// it is.
func With(ctx context.Context, f Func) context.Context {
	if f == nil {
		return ctx
	}
	return context.WithValue(ctx, key{}, f)
}

// From returns the reporter in ctx, nil when there is none.
func From(ctx context.Context) Func {
	f, _ := ctx.Value(key{}).(Func)
	return f
}

// Report tells the reporter in ctx, if any, msg.
func Report(ctx context.Context, msg string) {
	if f := From(ctx); f != nil {
		f(msg)
	}
}
