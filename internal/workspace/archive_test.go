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
	var buf bytes.Buffer
	wst, err := WriteArchive(context.Background(), &buf, src)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Extract(context.Background(), &buf, dst, ExtractOptions{Budget: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 2 || st.Symlinks != 2 || st.Bytes != wst.Bytes || st.Bytes != 3_000_004 {
		t.Fatalf("extracted %+v, written %+v", st, wst)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a/b/c/f.txt")); string(b) != "leaf" {
		t.Fatalf("nested file: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "link")); l != "a/b" {
		t.Fatalf("link: %q", l)
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
		{"symlink out absolute", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}, ErrUnsafeArchive},
		{"symlink out relative", []*tar.Header{{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: "../../x"}}, ErrUnsafeArchive},
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
