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

// FuzzBoxMsg: a box protocol message decodes to what was encoded, and any
// byte string either decodes or is refused, never panics.
func FuzzBoxMsg(f *testing.F) {
	f.Add(byte(MsgSpawn), "1", "/work/dir", "0")
	f.Add(byte(MsgExited), "17", "", "\xff")
	f.Fuzz(func(t *testing.T, kind byte, a, b, c string) {
		fields := []string{a, b, c}
		for _, x := range fields {
			for i := 0; i < len(x); i++ {
				if x[i] == 0 {
					t.Skip("a field holds no NUL")
				}
			}
		}
		k, got, err := DecodeMsg(EncodeMsg(kind, fields...))
		if err != nil || k != kind || !reflect.DeepEqual(got, fields) {
			t.Fatalf("round trip of %q: %c %q %v", fields, k, got, err)
		}
		DecodeMsg([]byte(a)) // arbitrary bytes: an error or fields, no panic
	})
}
