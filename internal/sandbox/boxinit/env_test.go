package boxinit

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseEnvRoundTrip(t *testing.T) {
	env := []string{"A=1", "PATH=/usr/bin:/bin", "EMPTY=", "EQ=a=b"}
	got, err := ParseEnv(EncodeEnv(env))
	if err != nil || strings.Join(got, "\n") != strings.Join(env, "\n") {
		t.Fatalf("%q %v", got, err)
	}
	if v := lookupEnv(got, "PATH"); v != "/usr/bin:/bin" {
		t.Errorf("PATH %q", v)
	}
}

func TestParseEnvRefusesMalformed(t *testing.T) {
	for _, b := range []string{
		"A=1",         // unterminated
		"A\x00",       // no =
		"=1\x00",      // empty name
		"A=1\x00\x00", // empty entry
		"A=1\x00A=2\x00",
		strings.Repeat("A", MaxEnvBytes) + "=\x00",
		strings.Repeat("A=\x00", MaxEnvVars+1),
	} {
		if env, err := ParseEnv([]byte(b)); err == nil || !strings.HasPrefix(err.Error(), "bad environment: ") {
			t.Errorf("%.40q: %q %v", b, env, err)
		}
	}
}

// FuzzParseEnv: whatever the descriptor holds, the parser returns an error
// or entries NAME=VALUE with a non-empty name, no NUL, no name twice, that
// encode back to exactly the input.
func FuzzParseEnv(f *testing.F) {
	for _, s := range []string{"", "A=1\x00", "A=1\x00B=\x00", "A", "=\x00", "A=1\x00A=1\x00", "\x00\x00", "X=\xff\xfe\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		env, err := ParseEnv(b)
		if err != nil {
			return
		}
		if len(b) > MaxEnvBytes || len(env) > MaxEnvVars {
			t.Fatalf("accepted %d bytes in %d variables", len(b), len(env))
		}
		seen := map[string]bool{}
		for _, kv := range env {
			name, _, ok := strings.Cut(kv, "=")
			if !ok || name == "" || strings.Contains(kv, "\x00") || seen[name] {
				t.Fatalf("bad entry %q", kv)
			}
			seen[name] = true
		}
		if !bytes.Equal(EncodeEnv(env), b) {
			t.Fatalf("%q does not encode back to %q", env, b)
		}
	})
}
