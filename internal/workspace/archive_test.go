package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestArchiveRoundTrip(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(src, "a/b/c"), 0o750)
	os.WriteFile(filepath.Join(src, "a/b/c/f.txt"), []byte("leaf"), 0o640)
	os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("0123456789"), 300_000), 0o600)
	os.Symlink("a/b", filepath.Join(src, "link"))
	os.Symlink("/home/user/a", filepath.Join(src, "abs"))
	// A venv: links out of /home/user travel as links, never followed.
	os.MkdirAll(filepath.Join(src, "venv/bin"), 0o755)
	os.Symlink("/usr/bin/python3", filepath.Join(src, "venv/bin/python"))
	os.Symlink("python", filepath.Join(src, "venv/bin/python3"))
	os.Symlink("/etc/shadow", filepath.Join(src, "shadow"))
	os.Symlink("../../../../..", filepath.Join(src, "venv/up"))
	var buf bytes.Buffer
	wst, err := WriteArchive(context.Background(), &buf, src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Extract(context.Background(), &buf, dst, ExtractOptions{Budget: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.Symlinks != 6 || st.Bytes != wst.Bytes || st.Bytes != 3_000_004 {
		t.Fatalf("extracted %+v, written %+v", st, wst)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a/b/c/f.txt")); string(b) != "leaf" {
		t.Fatalf("nested file: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "a/b" {
		t.Fatalf("link: %q", l)
	}
	for link, want := range map[string]string{"venv/bin/python": "/usr/bin/python3", "venv/bin/python3": "python",
		"shadow": "/etc/shadow", "venv/up": "../../../../.."} {
		fi, err := os.Lstat(filepath.Join(dst, link))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("%s is not a link: %v %v", link, fi, err)
		}
		if got, _ := os.Readlink(filepath.Join(dst, link)); got != want {
			t.Fatalf("%s points to %q, not %q", link, got, want)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dst, "a")); fi == nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("a directory's mode: %v", fi)
	}
	if fi, _ := os.Lstat(filepath.Join(dst, "a/b/c/f.txt")); fi == nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("a file's mode: %v", fi)
	}
}

// TestExtractRefusesHostileEntries: each stream is refused as a whole,
// and nothing lands outside the directory.
func TestExtractRefusesHostileEntries(t *testing.T) {
	t.Parallel()
	reg := func(name string, size int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size, Mode: 0o644}
	}
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		want    error
	}{
		{"dot-dot", []*tar.Header{reg("../out.txt", 1)}, ErrUnsafeArchive},
		{"dot-dot inside", []*tar.Header{reg("a/../../out.txt", 1)}, ErrUnsafeArchive},
		{"absolute", []*tar.Header{reg("/tmp/out.txt", 1)}, ErrUnsafeArchive},
		{"symlink with no target", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink}}, ErrUnsafeArchive},
		{"twice", []*tar.Header{reg("f", 1), reg("f", 1)}, ErrUnsafeArchive},
		{"through a link", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d"}, reg("l/x", 1)}, ErrUnsafeArchive},
		{"hard link", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}}, ErrUnsafeArchive},
		{"fifo", []*tar.Header{{Name: "p", Typeflag: tar.TypeFifo}}, ErrUnsafeArchive},
		{"block device", []*tar.Header{{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}}, ErrUnsafeArchive},
		{"over budget", []*tar.Header{reg("a", 600), reg("b", 600)}, ErrBudget},
		{"over budget at once", []*tar.Header{reg("huge", 1<<40)}, ErrBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "ws")
			os.Mkdir(dst, 0o755)
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entries {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Typeflag == tar.TypeReg && h.Size < 1<<20 {
					tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
				}
			}
			tw.Flush()
			_, err := Extract(context.Background(), &buf, dst, ExtractOptions{Budget: 1000})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Fatalf("something landed beside the workspace: %v", ents)
			}
		})
	}
}

// TestExtractNeverWritesThroughALink is the attack on links carried as
// links: an entry made after a link to a directory or a file outside
// the workspace, under it or in its place, is refused, and nothing
// outside the workspace is written (the outside file keeps its bytes,
// the outside directory stays empty).
func TestExtractNeverWritesThroughALink(t *testing.T) {
	t.Parallel()
	reg := func(name string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 5, Mode: 0o644}
	}
	for _, tc := range []struct {
		name  string
		entry func(outDir, outFile string) []*tar.Header
	}{
		{"a file under a link to a directory", func(d, _ string) []*tar.Header {
			return []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: d}, reg("l/x")}
		}},
		{"a directory under a link to a directory", func(d, _ string) []*tar.Header {
			return []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: d}, {Name: "l/sub/", Typeflag: tar.TypeDir, Mode: 0o755}}
		}},
		{"a link under a link to a directory", func(d, _ string) []*tar.Header {
			return []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: d}, {Name: "l/x", Typeflag: tar.TypeSymlink, Linkname: "y"}}
		}},
		{"a file in place of a link to a file", func(_, f string) []*tar.Header {
			return []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: f}, reg("l")}
		}},
		{"a directory in place of a link to a directory", func(d, _ string) []*tar.Header {
			return []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: d}, {Name: "l/", Typeflag: tar.TypeDir, Mode: 0o777}}
		}},
		{"a file under a relative link that climbs out", func(_, _ string) []*tar.Header {
			return []*tar.Header{{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: "../../out"}, reg("a/l/x")}
		}},
		{"a file under a link made implicitly a parent", func(d, _ string) []*tar.Header {
			return []*tar.Header{{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: d}, reg("a/l/b/x")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			dst := filepath.Join(parent, "ws")
			outDir := filepath.Join(parent, "out")
			outFile := filepath.Join(parent, "secret")
			for _, d := range []string{dst, outDir} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(outFile, []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range tc.entry(outDir, outFile) {
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Typeflag == tar.TypeReg {
					tw.Write([]byte("owned"))
				}
			}
			tw.Close()
			_, err := Extract(context.Background(), &buf, dst, ExtractOptions{})
			if !errors.Is(err, ErrUnsafeArchive) {
				t.Fatalf("err %v, want ErrUnsafeArchive", err)
			}
			if ents, _ := os.ReadDir(outDir); len(ents) != 0 {
				t.Fatalf("written through the link: %v", ents)
			}
			if b, _ := os.ReadFile(outFile); string(b) != "keep" {
				t.Fatalf("the outside file now holds %q", b)
			}
			if fi, _ := os.Stat(outDir); fi.Mode().Perm() != 0o755 {
				t.Fatalf("the outside directory's mode changed: %v", fi.Mode())
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 3 {
				t.Fatalf("something landed beside the workspace: %v", ents)
			}
		})
	}
}
