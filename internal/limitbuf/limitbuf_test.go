package limitbuf

import "testing"

func TestBufferKeepsTheFirstBytes(t *testing.T) {
	b := &Buffer{Max: 5}
	if n, err := b.Write([]byte("abc")); n != 3 || err != nil || b.Over() {
		t.Fatalf("%d %v %v", n, err, b.Over())
	}
	if n, err := b.Write([]byte("defgh")); n != 5 || err != nil {
		t.Fatalf("a write past Max must still succeed: %d %v", n, err)
	}
	if b.String() != "abcde" || !b.Over() {
		t.Errorf("%q over=%v, want \"abcde\" over", b.String(), b.Over())
	}
	b.Write([]byte("x"))
	if string(b.Bytes()) != "abcde" {
		t.Errorf("%q", b.Bytes())
	}
	exact := &Buffer{Max: 2}
	exact.Write([]byte("ab"))
	if exact.Over() {
		t.Error("exactly Max is not over")
	}
}
