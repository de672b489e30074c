package terminal

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The sealed copies live in one directory per user, shared by every server
// process, so that each start does not leave a copy of bash behind; a
// directory there that someone else could write is never used.
func TestSealedDirIsSharedAndChecked(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	a, err := sealedDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := sealedDir()
	if err != nil {
		t.Fatal(err)
	}
	if a != b || filepath.Dir(a) != tmp || !strings.HasPrefix(filepath.Base(a), "quro-sealed-") {
		t.Fatalf("sealed dirs %q and %q, want one shared dir in %s", a, b, tmp)
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("%v %v", fi.Mode(), err)
	}
	// Someone made it writable by others (or planted it so): not used.
	if err := os.Chmod(a, 0o777); err != nil {
		t.Fatal(err)
	}
	c, err := sealedDir()
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Fatalf("a world-writable %s was used", a)
	}
	// A link in its place is not followed either.
	os.Remove(a)
	if err := os.Symlink(t.TempDir(), a); err != nil {
		t.Fatal(err)
	}
	if d, err := sealedDir(); err != nil || d == a {
		t.Fatalf("a link at %s was used: %v", a, err)
	}
}
