package boxinit

import (
	"reflect"
	"testing"
)

func TestPolicyRoundTrip(t *testing.T) {
	for _, p := range []*Policy{
		{},
		{WaitFD: 7, UID: 1000, LLFS: 1<<16 - 1, LLNet: 3, LLScoped: 3, LLFileMask: 0x8007,
			Rules:   []Rule{{"/usr", 13}, {"/a b,c\"d", 1}, {"/x=y \n rule=1,\"/\"", 2}},
			Seccomp: []byte{0, 1, 0xfe, 0xff, 0x20, 0, 0, 0}},
	} {
		got, err := DecodePolicy(p.Encode())
		if err != nil {
			t.Fatalf("%q: %v", p.Encode(), err)
		}
		if !reflect.DeepEqual(got, p) {
			t.Errorf("round trip of %q:\n got %+v\nwant %+v", p.Encode(), got, p)
		}
	}
	for _, bad := range []string{"x=1", "uid=a", "rule=1,\"/a", "ll=1,2", "seccomp=abc", "landlock"} {
		if _, err := DecodePolicy(bad); err == nil {
			t.Errorf("DecodePolicy(%q) accepted", bad)
		}
	}
}
