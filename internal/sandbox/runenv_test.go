package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunEnv: Options.RunEnv's variables come over the whitelist (PATH
// too) and under the Spec's own, and its read-only paths are in the box,
// not writable.
func TestRunEnv(t *testing.T) {
	ro := t.TempDir()
	os.WriteFile(filepath.Join(ro, "f"), []byte("data"), 0o644)
	var seen []string
	sb, err := New(&Options{SessionBoxes: true, RunEnv: func(spec *Spec, network string) RunEnv {
		seen = append(seen, network)
		return RunEnv{Env: map[string]string{"PATH": "/first:" + DefaultPath, "A": "default", "B": "default"}, ReadOnly: []string{ro}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.CloseBoxes)
	out, errOut, exit := run(t, sb, testCtx(t), `echo "$PATH|$A|$B"; cat `+ro+`/f; echo; echo x > `+ro+`/f && echo WROTE`, func(s *Spec) {
		s.Env = map[string]string{"B": "spec"}
	})
	lines := strings.Split(out, "\n")
	if len(lines) < 2 || lines[0] != "/first:"+DefaultPath+"|default|spec" || lines[1] != "data" || strings.Contains(out, "WROTE") || exit.Code == 0 {
		t.Fatalf("RunEnv: exit %d, %q %q", exit.Code, out, errOut)
	}
	if len(seen) != 1 || seen[0] != NetworkNone {
		t.Fatalf("RunEnv was asked %v", seen)
	}
}
