package terminal

import (
	"bytes"
	"os"
	"testing"
)

// pump passes on every byte, in order, whatever the sizes of the reads:
// a burst that grows its buffer, then a trickle that shrinks it.
func TestPumpKeepsEveryByte(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Repeat([]byte("0123456789abcdef"), 1<<16), "a\nb\nc"...)
	go func() {
		w.Write(want[:1<<20])
		for _, b := range want[1<<20:] {
			w.Write([]byte{b})
		}
		w.Close()
	}()
	var got bytes.Buffer
	pump(&got, r)
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("pump passed on %d bytes, want %d the same", got.Len(), len(want))
	}
}
