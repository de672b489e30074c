package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/engine/js"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/workspace"
)

// RunJSFileInput is run_js_file's input.
type RunJSFileInput struct {
	Path      string `json:"path" jsonschema:"workspace-relative path of a .js or .ts file"`
	Session   string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds; default 30000"`
}

// CallJSFunctionInput is call_js_function's input.
type CallJSFunctionInput struct {
	Path      string            `json:"path" jsonschema:"workspace-relative path of a .js or .ts module"`
	Function  string            `json:"function" jsonschema:"name of the exported function to call (\"default\" for the default export)"`
	Args      []json.RawMessage `json:"args,omitempty" jsonschema:"the arguments, each a JSON value"`
	Session   string            `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	TimeoutMS int64             `json:"timeout_ms,omitempty" jsonschema:"time budget in milliseconds; default 30000"`
}

// registerJS declares the JS engine's workspace entry points. Both run as a
// line of generated JavaScript through run_code's runner (language js), so
// their time budget, output caps and result text are run_code's.
func (a *App) registerJS(reg *capability.Registry, eng *js.Engine) {
	limit := fmt.Sprintf("%d MiB", eng.MemoryLimit()>>20)
	reg.Register(capability.New("run_js_file",
		"Run a .js or .ts file of the session workspace in the embedded JavaScript sandbox (QuickJS, no node), as node runs a file: "+
			"CommonJS (require of other workspace files by relative path; ES import/export and TypeScript are transpiled), console output, and what the file exports as the ➡️ result. "+
			"The host API is Tools.Files (workspace only), Tools.Net.fetch (when the session's network policy allows), Tools.System and Tools.calc. "+
			"Memory is capped at "+limit+"; on timeout the code is interrupted and the output so far returned.",
		capability.ScopeExec, func(ctx context.Context, in RunJSFileInput) (*runcode.Result, error) {
			return a.runJSEntry(ctx, in.Path, in.TimeoutMS, func(rel string) (string, error) {
				return js.FileEntry(rel), nil
			})
		}).InSession(capability.UseBusy))
	reg.Register(capability.New("call_js_function",
		"Call an exported function of a .js or .ts module of the session workspace with JSON arguments, in the embedded JavaScript sandbox; "+
			"a returned Promise is awaited and the value shown as the ➡️ result (pretty JSON), with the function's console output before it. "+
			"The module is loaded fresh for each call; memory is capped at "+limit+".",
		capability.ScopeExec, func(ctx context.Context, in CallJSFunctionInput) (*runcode.Result, error) {
			return a.runJSEntry(ctx, in.Path, in.TimeoutMS, func(rel string) (string, error) {
				return js.CallEntry(rel, in.Function, in.Args)
			})
		}).InSession(capability.UseBusy))
}

func (a *App) runJSEntry(ctx context.Context, path string, timeoutMS int64, code func(rel string) (string, error)) (*runcode.Result, error) {
	if _, err := runcode.MillisTimeout(timeoutMS, 0, a.Runner.Options().MaxTimeout); err != nil {
		return nil, err
	}
	sess, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	rel, err := js.CheckFile(sess.Workspace(), path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, capability.Errorf(capability.NotFound, "%v", err)
	case errors.Is(err, workspace.ErrOutside):
		return nil, capability.Errorf(capability.PermissionDenied, "%v", err)
	case err != nil:
		return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	src, err := code(rel)
	if err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "%v", err)
	}
	res, err := a.Runner.Run(ctx, runcode.Input{
		Code: src, Lang: "js", Session: sess, Timeout: time.Duration(timeoutMS) * time.Millisecond,
	})
	// The entry line is JavaScript whatever the file; the result says what
	// the file was written in (its TypeScript is transpiled on require).
	if err == nil && (strings.HasSuffix(rel, ".ts") || strings.HasSuffix(rel, ".mts") || strings.HasSuffix(rel, ".cts")) {
		res.Lang = "ts"
	}
	return res, err
}
