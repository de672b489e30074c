package transpile

import (
	"bytes"
	"testing"
)

// FuzzReply feeds any bytes as a child's stdout: readFrame and
// decodeReply answer an error or a reply within the bounds, never more.
func FuzzReply(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x0c{\"code\":\"x\"}"))
	f.Add([]byte("\x00\x00\x00\x2f{\"errors\":[{\"text\":\"a\",\"line\":1,\"column\":2}]}"))
	f.Add([]byte("\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const bound = 1 << 10
		body, err := readFrame(bytes.NewReader(b), bound)
		if err != nil {
			return
		}
		if len(body) > bound {
			t.Fatalf("frame of %d bytes over the bound", len(body))
		}
		r, err := decodeReply(body)
		if err != nil {
			return
		}
		if len(r.Errors) > maxDiagnostics || (len(r.Errors) > 0 && r.Code != "") {
			t.Fatalf("accepted %+v", r)
		}
		for _, d := range r.Errors {
			if d.Line < 0 || d.Column < 0 {
				t.Fatalf("bad position %+v", d)
			}
		}
	})
}
