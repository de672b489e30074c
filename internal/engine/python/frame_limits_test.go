//go:build !slim

package python

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestFrameShapeIsBoundedBeforeDecoding: a frame of 2 MB holding a
// million empty objects as artifacts is refused by counting, before the
// decoder builds a million Artifact values; 300 artifacts (few containers)
// are refused after decoding; braces, brackets, commas and escaped quotes
// inside strings are not counted.
func TestFrameShapeIsBoundedBeforeDecoding(t *testing.T) {
	const n = 1 << 20
	body := `{"op":"done","id":1,"status":"ok","exit_code":0,"artifacts":[` + strings.Repeat(`{},`, n-1) + `{}]}`
	w := frameReader(t, encodeFrame(body))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := w.readFrame()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, errBadFrame) || !strings.Contains(err.Error(), "JSON objects and arrays") {
		t.Fatalf("a frame of %d empty objects: %v", n, err)
	}
	// The 2 MB body itself, grown as it arrived; not the decoded values.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("refusing the frame allocated %d MiB", grew>>20)
	}
	if w.refused == nil {
		t.Fatal("the worker was not given up")
	}

	many := `{"op":"done","id":1,"artifacts":[` + strings.Repeat(`{"kind":"text","data":"x"},`, 300) + `{}]}`
	if _, err := frameReader(t, encodeFrame(many)).readFrame(); !errors.Is(err, errBadFrame) || !strings.Contains(err.Error(), "301 artifacts") {
		t.Fatalf("301 artifacts: %v", err)
	}

	text := strings.Repeat(`{[,\"`, 200000)
	ok := `{"op":"done","id":1,"artifacts":[{"kind":"text","name":"a.txt","data":"` + text + `"}],"notes":["a, b"]}`
	f, err := frameReader(t, encodeFrame(ok)).readFrame()
	if err != nil || len(f.Artifacts) != 1 || f.Artifacts[0].Data != strings.ReplaceAll(text, `\"`, `"`) {
		t.Fatalf("a text artifact full of JSON punctuation: %v", err)
	}
}

// TestForgedReplyFrameIsRefused: session code owns the worker's
// interpreter; it replaces quro_worker._send to reply with a "done" frame
// of a million empty artifacts (the review's attack), or raises the
// worker's own caps to send 100 MiB of image. The server refuses each
// frame, says so, gives the worker up, and the session's next run works.
func TestForgedReplyFrameIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, code, note string }{
		{"empty objects", `import sys
w = sys.modules['quro_worker']
orig = w._send
def forged(obj):
    if obj.get("op") == "done":
        body = b'{"op":"done","id":%d,"status":"ok","exit_code":0,"artifacts":[' % obj["id"] + b'{},' * ((1 << 20) - 1) + b'{}]}'
        mv = memoryview(len(body).to_bytes(4, "big") + body)
        while mv:
            mv = mv[w._os_write(w.REP_FD, mv):]
        return
    orig(obj)
w._send = forged
print("armed")`, "JSON objects and arrays"},
		{"raised caps", `import sys
w = sys.modules['quro_worker']
w._ARTIFACT_MAX = w._RICH_MAX = 1 << 30
display(b'\x89PNG\r\n\x1a\n' + b'A' * (100 << 20), mime='image/png')
print("sent")`, "of artifacts and rich results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t)
			run(t, testEng, s, "v = 1", 0)
			// Building and sending a 100 MiB reply is not the property;
			// it took over the default minute at a load of 15 on 2 cores.
			r := run(t, testEng, s, tc.code, 5*time.Minute)
			if !hasNote(r, "reply was refused") || !hasNote(r, tc.note) || len(r.Artifacts) != 0 {
				t.Fatalf("exit %d, %d artifacts, notes %q", r.ExitCode, len(r.Artifacts), r.Notes)
			}
			r = run(t, testEng, s, "print('alive')\n'v' in globals()", 0)
			if r.out != "alive\nFalse\n" {
				t.Fatalf("next run: out %q err %q", r.out, r.err)
			}
		})
	}
}
