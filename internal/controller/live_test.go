package controller

import (
	"encoding/json"
	"fmt"
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

// TestLiveInputIsBoundedAsAWhole: an event's input is bounded together,
// not only string by string. A slow viewer's queue holds a thousand
// events; a call whose lists of 64 long strings under several keys were
// each cut alone made one event of near 1 MiB, the queue near 1 GiB of
// the server's memory, from any tenant's calls.
func TestLiveInputIsBoundedAsAWhole(t *testing.T) {
	t.Parallel()
	long := make([]string, 64)
	for i := range long {
		long[i] = strings.Repeat("a", 8<<10)
	}
	list, _ := json.Marshal(long)
	args := fmt.Sprintf(`{"command":%q,"code":%q,"args":%s,"packages":%s,"cmd":%s}`, long[0], long[0], list, list, list)
	in := liveInput([]byte(args), nil)
	b, _ := json.Marshal(in)
	if len(b) > liveInputTotal+1024 {
		t.Fatalf("the input of one event is %d bytes (arguments of %d bytes), over %d", len(b), len(args), liveInputTotal)
	}
	// What fits is kept, and a cut list says so.
	if c, _ := in["command"].(string); !strings.HasPrefix(c, "aaaa") || !strings.HasSuffix(c, "(cut)") {
		t.Fatalf("command %.40q…", c)
	}
	if l, _ := in["cmd"].([]any); len(l) == 0 || l[len(l)-1] != "… (cut)" {
		t.Fatalf("cmd list %.200v", in["cmd"])
	}
}
