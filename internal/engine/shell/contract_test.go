package shell_test

import (
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/engine/shell"
	"github.com/quro-dev/quro/internal/runcode/enginetest"
	"github.com/quro-dev/quro/internal/session"
)

// shellCaps are the contract snippets of a POSIX shell (bash and sh alike).
func shellCaps(lang string) enginetest.Caps {
	return enginetest.Caps{
		Lang:     lang,
		Print:    "echo contract-out; echo contract-err >&2",
		Exit:     "echo bye; exit 3",
		ExitCode: 3,
		Loop:     "echo before-loop; while :; do sleep 1; done",
		// Each run is a fresh process in the box, which the warm-up does
		// not start ahead: the budget covers its spawn, which passed the
		// default 3 s at a load of 80 ("canceled while the sandbox was
		// starting"). The loop sleeps, so the budget costs no CPU.
		LoopTimeout: 15 * time.Second,
		Huge:        "i=0; while [ $i -lt 100000 ]; do echo $i; i=$((i+1)); done",
		BadUTF8:     `printf 'a\377\376b\n'`,
		BadUTF8Raw:  []byte("a\xff\xfeb\n"),
		SetVar:      "x=42",
		GetVar:      `echo "${x:-unset}"`,
	}
}

// TestContract runs the run_code engine contract over shell/bash and
// shell/sh, each a fresh process per run in the box (stateless).
func TestContract(t *testing.T) {
	sb := newSandbox(t)
	newSess := func(t *testing.T) *session.Session { return newSession(t, "") }
	t.Run("bash", func(t *testing.T) {
		enginetest.Run(t, enginetest.Target{Engine: shell.Bash(sb, nil), NewSession: newSess, Required: true}, shellCaps("bash"))
	})
	t.Run("sh", func(t *testing.T) {
		enginetest.Run(t, enginetest.Target{Engine: shell.New(sb, nil), NewSession: newSess, Required: true}, shellCaps("sh"))
	})
}
