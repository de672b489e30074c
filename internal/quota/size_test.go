package quota

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"2G": 2 << 30, "2GiB": 2 << 30, "512m": 512 << 20, "1.5G": 3 << 29, "1048576": 1 << 20, "none": -1, "64MB": 64 << 20} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "-3G", "2X", "1e30G", "abc"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}
