package proc

import (
	"bytes"
	"testing"
)

func TestRingKeepsTheLatestAndCountsTheDropped(t *testing.T) {
	var r ring
	r.write([]byte("hello "))
	if o := r.read(0); string(o.Data) != "hello " || o.Next != 6 || o.Dropped != 0 {
		t.Fatalf("%+v", o)
	}
	if o := r.read(6); len(o.Data) != 0 || o.Next != 6 {
		t.Fatalf("nothing new: %+v", o)
	}
	if o := r.read(99); len(o.Data) != 0 || o.From != 6 || o.Next != 6 {
		t.Fatalf("past the end: %+v", o)
	}
	// Wrap around, in pieces of odd sizes.
	var all bytes.Buffer
	all.WriteString("hello ")
	for i := 0; all.Len() < 3*RingSize; i++ {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, 1+i*7%5000)
		r.write(p)
		all.Write(p)
	}
	total := int64(all.Len())
	o := r.read(0)
	if o.Next != total || o.From != total-RingSize || o.Dropped != total-RingSize || !bytes.Equal(o.Data, all.Bytes()[total-RingSize:]) {
		t.Fatalf("wrapped: from %d next %d dropped %d len %d (total %d)", o.From, o.Next, o.Dropped, len(o.Data), total)
	}
	o = r.read(total - 10)
	if o.Dropped != 0 || !bytes.Equal(o.Data, all.Bytes()[total-10:]) {
		t.Fatalf("tail: %+v", o)
	}
	// One write larger than the ring.
	big := bytes.Repeat([]byte("z"), RingSize+5)
	r.write(big)
	if o := r.read(total); o.Dropped != 5 || len(o.Data) != RingSize || o.Next != total+RingSize+5 {
		t.Fatalf("big: dropped %d len %d", o.Dropped, len(o.Data))
	}
}
