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

// The read buffer grows while output pours in and shrinks when it
// trickles, with the token found wherever a resize put it: a burst of
// 1 MiB, a token split across the burst's last read, a trickle, a token.
func TestStreamResizesAndKeepsEveryByte(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := newStream(r)
	go s.read()
	token := []byte("\x1equro-sync-0123456789abcdef\x1e")
	burst := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	var got bytes.Buffer
	s.begin(&got, token)
	go func() {
		w.Write(burst)
		w.Write(token[:7])
		w.Write(token[7:])
	}()
	<-s.synced()
	if !bytes.Equal(got.Bytes(), burst) {
		t.Fatalf("the burst came back as %d bytes, want %d the same", got.Len(), len(burst))
	}
	var small bytes.Buffer
	s.begin(&small, token)
	for _, p := range []string{"a", "b\n", "c"} {
		w.Write([]byte(p))
	}
	w.Write(token)
	<-s.synced()
	if small.String() != "ab\nc" {
		t.Fatalf("the trickle came back as %q", small.String())
	}
}

func TestNextChunk(t *testing.T) {
	for _, c := range []struct{ chunk, n, want int }{
		{streamSmall, streamSmall, 4 * streamSmall},
		{streamSmall, streamSmall - 1, streamSmall},
		{streamLarge, streamLarge, streamLarge},
		{streamLarge, streamLarge / 2, streamLarge},
		{streamLarge, 10, streamSmall},
		{streamSmall, 0, streamSmall},
	} {
		if got := nextChunk(c.chunk, c.n); got != c.want {
			t.Errorf("nextChunk(%d, %d) = %d, want %d", c.chunk, c.n, got, c.want)
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
