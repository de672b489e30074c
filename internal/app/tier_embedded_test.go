//go:build !slim

package app

import "testing"

// wantPython is the engine that answers Python in this build.
const wantPython = "python/embedded"

func TestTrailingExpressionIsShown(t *testing.T) {
	t.Parallel()
	a := newApp(t, nil)
	if res := runCode(t, a, RunCodeInput{Code: "x = 20\nx * 2 + 2"}); res.Stdout != "42\n" {
		t.Fatalf("%+v", res)
	}
}
