package toolchaintest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSharedGoCache: without the variable each build is cold; with it, a
// failed first build leaves nothing, the first that succeeds leaves its
// cache, and the next starts from a copy of it.
func TestSharedGoCache(t *testing.T) {
	entry := filepath.Join("01", "0123-a")
	build := func(t *testing.T, dst string, ok bool, built *[]bool) func() bool {
		return func() bool {
			_, err := os.Stat(filepath.Join(dst, entry))
			*built = append(*built, err == nil) // whether it found the entry
			if ok {
				if err := os.MkdirAll(filepath.Join(dst, "01"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dst, entry), []byte("output"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			return ok
		}
	}
	var built []bool
	t.Setenv(Env, "")
	dst := filepath.Join(t.TempDir(), "go-build")
	if SharedGoCache(t, dst, -1, build(t, dst, true, &built)) || built[0] {
		t.Fatalf("without %s: warm, or the build found an entry (%v)", Env, built)
	}

	t.Setenv(Env, t.TempDir())
	built = nil
	for i, tc := range []struct {
		ok, warm bool
	}{
		{ok: false, warm: false}, // fails: leaves nothing
		{ok: true, warm: false},  // cold, leaves its cache
		{ok: true, warm: true},   // starts from the copy
		{ok: true, warm: true},
	} {
		dst := filepath.Join(t.TempDir(), ".cache", "go-build")
		if warm := SharedGoCache(t, dst, -1, build(t, dst, tc.ok, &built)); warm != tc.warm || built[i] != tc.warm {
			t.Fatalf("build %d: warm %v, found the entry %v; want %v", i, warm, built[i], tc.warm)
		}
	}
	if b, err := os.ReadFile(filepath.Join(os.Getenv(Env), "go-build", entry)); err != nil || string(b) != "output" {
		t.Fatalf("the shared cache: %q %v", b, err)
	}
}
