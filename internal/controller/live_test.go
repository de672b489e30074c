package controller

import (
	"strings"
	"testing"
)

// TestLiveInputShowsOnlyWhatToFollow: a live event's input has the
// command, path and packages (redacted, cut), never a file's content, a
// secret's value, variables or the bytes typed into a command.
func TestLiveInputShowsOnlyWhatToFollow(t *testing.T) {
	t.Parallel()
	redact := func(s string) string { return strings.ReplaceAll(s, "SECRET", "<secret redacted>") }
	in := liveInput([]byte(`{"command":"curl -H 'Authorization: SECRET' x; `+strings.Repeat("y", 10000)+`","path":"a.txt",
		"content":"file body","value":"hunter2","env":{"K":"V"},"data":"typed password\n","packages":["numpy","SECRET"]}`), redact)
	cmd, _ := in["command"].(string)
	if !strings.HasPrefix(cmd, "curl -H 'Authorization: <secret redacted>' x;") || len(cmd) > liveInputMax+16 || !strings.HasSuffix(cmd, "(cut)") {
		t.Fatalf("command %.80q… (%d bytes)", cmd, len(cmd))
	}
	if in["path"] != "a.txt" {
		t.Fatalf("path %v", in["path"])
	}
	if p, _ := in["packages"].([]any); len(p) != 2 || p[1] != "<secret redacted>" {
		t.Fatalf("packages %v", in["packages"])
	}
	for _, k := range []string{"content", "value", "env", "data"} {
		if _, ok := in[k]; ok {
			t.Errorf("the input shows %s", k)
		}
	}
	if liveInput([]byte(`not json`), nil) != nil {
		t.Error("bad arguments gave an input")
	}
}
