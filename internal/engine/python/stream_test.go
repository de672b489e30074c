//go:build !slim

package python

import (
	"bytes"
	"os"
	"testing"
)

// The sync token may arrive split across reads at any point; output before
// it goes to the run, output after it waits for the next run.
func TestStreamSplitsAtToken(t *testing.T) {
	token := []byte("\x1equro-sync-0123456789abcdef\x1e")
	before := []byte("out\x1epartial \x1equro-sync-01 not it\n")
	after := []byte("late")
	all := append(append(append([]byte(nil), before...), token...), after...)
	for chunk := 1; chunk <= len(all); chunk++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		s := newStream(r)
		var got bytes.Buffer
		s.begin(&got, token)
		go s.read()
		for i := 0; i < len(all); i += chunk {
			w.Write(all[i:min(i+chunk, len(all))])
		}
		<-s.synced()
		w.Close()
		if !bytes.Equal(got.Bytes(), before) {
			t.Fatalf("chunk %d: run got %q, want %q", chunk, got.Bytes(), before)
		}
		var next bytes.Buffer
		s.begin(&next, []byte("\x1eother\x1e")) // ends at EOF
		<-s.synced()
		s.detach()
		if !bytes.Equal(next.Bytes(), after) {
			t.Fatalf("chunk %d: next run got %q, want %q", chunk, next.Bytes(), after)
		}
	}
}

func TestTokenPrefixAtEnd(t *testing.T) {
	tok := []byte("\x1eabc\x1e")
	for _, tc := range []struct {
		data string
		want int
	}{
		{"hello", 0}, {"hello\x1e", 1}, {"hello\x1eab", 3}, {"\x1eabc", 4}, {"x\x1eabd", 0}, {"", 0},
	} {
		if got := tokenPrefixAtEnd([]byte(tc.data), tok); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.data, got, tc.want)
		}
	}
}
