package js

import (
	"strings"
	"testing"
)

// TestDeepNestingDoesNotKillTheServer runs the attack that killed the
// server when esbuild ran in it: TypeScript nested so deeply that esbuild's
// parser overflowed Go's stack (a fatal error, the whole process gone).
// esbuild now runs in a child process (internal/transpile): each attack is
// an error to the run, this test process lives, and the next TypeScript
// run works. The attack comes as run_code `ts` and as a `.ts` module the
// code requires from the workspace.
func TestDeepNestingDoesNotKillTheServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	arrows := "let x = " + strings.Repeat("a=>", 100000) + "1\n"
	nots := "let x = " + strings.Repeat("!", 256<<10) + "1\n"
	e.write(t, "deep.ts", "export "+arrows)
	tooDeep := "the code nests too deeply to compile"
	for _, tc := range []struct{ name, code string }{
		{"ts arrows", arrows},
		{"ts nots", nots},
		{"require a deep .ts", "require('./deep')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := e.run(t, "ts", tc.code)
			check{exit: 1, stderr: []string{tooDeep}}.verify(t, o)
		})
	}
	check{exactStdout: ptr("➡️ 3\n")}.verify(t, e.run(t, "ts", "const n: number = 3\nn"))
}
