package js

import (
	"os"
	"testing"

	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/session"
)

// jsCaps are the contract snippets of JavaScript (also valid TypeScript).
// JS has no exit(N): an uncaught error is exit code 1. Strings are UTF-16,
// so what is not UTF-8 is a lone surrogate, which the engine writes as
// U+FFFD.
func jsCaps(lang string) enginetest.Caps {
	return enginetest.Caps{
		Lang:       lang,
		Print:      "console.log('contract-out'); console.error('contract-err')",
		Exit:       "console.log('bye'); throw new Error('contract-exit')",
		ExitCode:   1,
		Loop:       "console.log('before-loop'); while (true) {}",
		Huge:       "for (let i = 0; i < 100000; i++) console.log(i)",
		BadUTF8:    `console.log('a\ud800b')`,
		BadUTF8Raw: []byte("a\uFFFDb\n"),
		SetVar:     "globalThis.x = 42",
		GetVar:     "console.log(typeof x === 'undefined' ? 'unset' : x)",
	}
}

// TestContract runs the run_code engine contract over the JavaScript
// engine and its TypeScript face: a fresh VM per run (stateless).
func TestContract(t *testing.T) {
	e := New(nil)
	newSess := func(t *testing.T) *session.Session {
		s := &session.Session{ID: "c" + t.Name(), Dir: t.TempDir()}
		if err := os.MkdirAll(s.Workspace(), 0o755); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("js", func(t *testing.T) {
		enginetest.Run(t, enginetest.Target{Engine: e, NewSession: newSess, Required: true}, jsCaps("js"))
	})
	t.Run("ts", func(t *testing.T) {
		enginetest.Run(t, enginetest.Target{Engine: e.TS(), NewSession: newSess, Required: true}, jsCaps("ts"))
	})
}
