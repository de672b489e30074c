package e2b_test

import (
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/engine/python"
)

// TestEnvdPythonIsTheInterpreters: E2B's commands (envd's Start: `bash -l
// -c`, whose /etc/profile sets Debian's PATH) find the code
// interpreter's Python as python and python3: the same executable and
// version as /execute reports, so what `pip install` puts there runCode
// imports.
func TestEnvdPythonIsTheInterpreters(t *testing.T) {
	if python.PipVersion == "" {
		t.Skip("a slim build has no embedded Python")
	}
	e := newEnv(t, nil)
	id := e.newSession(t)
	const probe = `import sys; print(sys.executable, sys.version.split()[0])`
	var want string
	for _, l := range ofType(e.execute(t, id, map[string]any{"code": probe}), "stdout") {
		want += l["text"].(string)
	}
	want = strings.TrimSpace(want)
	if !strings.HasPrefix(want, python.BoxTree+"/bin/python3") {
		t.Fatalf("/execute's Python is not at its box path %s: %q", python.BoxTree, want)
	}
	ev := e.start(t, id, bash(`python -c '`+probe+`'; python3 -c '`+probe+`'; command -v pip pip3`, false), nil)
	ev.startPid(t)
	end, stdout, stderr := ev.end(t)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if end.GetExitCode() != 0 || len(lines) != 4 || lines[0] != want || lines[1] != want ||
		!strings.HasSuffix(lines[2], "/quro-bin/pip") || !strings.HasSuffix(lines[3], "/quro-bin/pip3") {
		t.Fatalf("commands' python, python3, pip, pip3 are not the interpreter's (%s): %v\nstdout:\n%s\nstderr:\n%s", want, end, stdout, stderr)
	}
}
