package boxfs

import (
	"context"
	"io"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/quro-dev/quro/internal/workspace"
)

// FuzzReply feeds the server's side of the helper protocol whatever a
// session could make the helper write (its code runs as the same uid and
// may trace or replace it): every operation must answer an error or a
// result within the bounds, never panic, and never name more than it was
// given.
func FuzzReply(f *testing.F) {
	for _, seed := range []string{
		`{"entry":{"mode":420,"size":3,"mtime":1,"uid":1000,"gid":1000},"n":3}` + "\nabc",
		`{"entries":[{"rel":"a","mode":2147484141,"size":4096},{"rel":"a/b","mode":134218239,"target":"/etc/shadow"}]}` + "\n",
		`{"entries":[{"rel":"../x","mode":420}]}` + "\n",
		`{"entry":{"mode":134218239,"target":"y","target_type":"dir"}}` + "\n",
		`{"entry":{"mode":134218239,"target":"y","target_type":"../etc"}}` + "\n",
		`{"errno":2}` + "\n",
		`{"errno":13,"where":"dst"}` + "\n",
		`{"entry":{"mode":420},"n":99}` + "\nshort",
		`{"entry":{"mode":420},"bogus":1}` + "\n",
		"\n", "", "{}\n{}\n",
	} {
		f.Add([]byte(seed), 0)
	}
	f.Fuzz(func(t *testing.T, out []byte, exit int) {
		run := func(_ context.Context, _ []string, _ []byte, _ int64, stdout io.Writer) (int, error) {
			_, _ = stdout.Write(out)
			return exit % 3, nil
		}
		b := New(context.Background(), run, workspace.Options{MaxRead: 64})
		if c, err := b.Read("/tmp/f", 0, 0); err == nil && (int64(len(c.Data)) > 64 || c.Path != "/tmp/f") {
			t.Fatalf("read: %d bytes at %q", len(c.Data), c.Path)
		}
		if l, err := b.List("/tmp", workspace.ListOptions{Depth: 2, MaxEntries: 10}); err == nil {
			if len(l.Entries) > 10 {
				t.Fatalf("list: %d entries", len(l.Entries))
			}
			for _, e := range l.Entries {
				if !strings.HasPrefix(e.Path, "/tmp/") || slices.Contains(strings.Split(e.Path, "/"), "..") || path.Clean(e.Path) != e.Path {
					t.Fatalf("list named %q", e.Path)
				}
			}
		}
		_, _ = b.Info("/tmp/f")
		_, _ = b.Write("/tmp/f", []byte("x"), false)
		_, _, _ = b.MakeDir("/tmp/d")
		_, _ = b.Move("/tmp/a", "/tmp/b")
		_, _ = b.Remove("/tmp/f")
	})
}
