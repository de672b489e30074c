package quota

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

func TestTmpCreateAtN(t *testing.T) {
	d, data := newDisks(t)
	med := func(from, n int) (time.Duration, time.Duration) {
		var c, r []time.Duration
		for i := from; i < from+n; i++ {
			dir := filepath.Join(data, "sessions", fmt.Sprint("m", i))
			t0 := time.Now()
			if err := d.Create(dir, 64<<20); err != nil {
				t.Fatal(err)
			}
			c = append(c, time.Since(t0))
			if i >= from+n/2 {
				t0 = time.Now()
				d.Remove(dir)
				r = append(r, time.Since(t0))
			}
		}
		sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
		sort.Slice(r, func(i, j int) bool { return r[i] < r[j] })
		return c[len(c)/2], r[len(r)/2]
	}
	c0, r0 := med(0, 20)
	for i := 1000; i < 1300; i++ {
		if err := d.Create(filepath.Join(data, "sessions", fmt.Sprint("f", i)), 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	c1, r1 := med(2000, 20)
	t.Logf("create p50 at 0: %v, at 300: %v; remove p50 %v / %v", c0, c1, r0, r1)
	for i := 1000; i < 1300; i++ {
		d.Remove(filepath.Join(data, "sessions", fmt.Sprint("f", i)))
	}
	for i := 0; i < 10; i++ {
		d.Remove(filepath.Join(data, "sessions", fmt.Sprint("m", i)))
		d.Remove(filepath.Join(data, "sessions", fmt.Sprint("m", 2000+i)))
	}
}
