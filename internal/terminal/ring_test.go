package terminal

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestRingKeepsTheLastBytes: whatever the sizes of the writes (smaller,
// across and larger than the ring, growing or full), Bytes is the last
// size bytes written and Dropped the rest.
func TestRingKeepsTheLastBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{1, 7, 64, 1000} {
		r := NewRing(size)
		var all []byte
		for i := 0; i < 300; i++ {
			p := make([]byte, rng.IntN(3*size+2))
			for j := range p {
				p[j] = byte(rng.IntN(256))
			}
			if n, err := r.Write(p); n != len(p) || err != nil {
				t.Fatalf("Write: %d %v", n, err)
			}
			all = append(all, p...)
			want := all[max(0, len(all)-size):]
			if got := r.Bytes(); !bytes.Equal(got, want) {
				t.Fatalf("size %d after %d writes: got %d bytes, want the last %d", size, i+1, len(got), len(want))
			}
			if d := r.Dropped(); d != max(0, len(all)-size) {
				t.Fatalf("Dropped %d, want %d", d, len(all)-size)
			}
			if cap(r.buf) > size {
				t.Fatalf("the ring holds %d bytes for a size of %d", cap(r.buf), size)
			}
		}
	}
	if r := NewRing(1 << 20); cap(r.buf) != 0 {
		t.Errorf("a new ring holds %d bytes before anything is written", cap(r.buf))
	}
}
