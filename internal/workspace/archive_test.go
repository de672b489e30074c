package workspace

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
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
	sparse := func(name string, data int64, m, size string) *tar.Header {
		h := reg(name, data)
		h.Typeflag = typeSparse
		h.PAXRecords = map[string]string{sparseMapKey: m, sparseSizeKey: size}
		return h
	}
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		want    error
	}{
		{"dot-dot", []*tar.Header{reg("../out.txt", 1)}, ErrUnsafeArchive},
		{"dot-dot inside", []*tar.Header{reg("a/../../out.txt", 1)}, ErrUnsafeArchive},
		{"absolute", []*tar.Header{reg("/tmp/out.txt", 1)}, ErrUnsafeArchive},
		{"through a link", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d"}, reg("l/x", 1)}, ErrUnsafeArchive},
		{"through a link out", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, reg("l/x", 1)}, ErrUnsafeArchive},
		{"a directory over a link out", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "l/", Typeflag: tar.TypeDir, Mode: 0o777}}, ErrUnsafeArchive},
		{"a file over a file", []*tar.Header{reg("f", 1), reg("f", 1)}, ErrUnsafeArchive},
		{"link with no target", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink}}, ErrUnsafeArchive},
		{"hard link to a file not made", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}}, ErrUnsafeArchive},
		{"hard link out", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../out"}}, ErrUnsafeArchive},
		{"hard link to the host", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}, ErrUnsafeArchive},
		{"hard link to a directory", []*tar.Header{{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "d"}}, ErrUnsafeArchive},
		{"hard link to a symbolic link", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "l"}}, ErrUnsafeArchive},
		{"hard link through a link", []*tar.Header{reg("f", 1), {Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "l/h", Typeflag: tar.TypeLink, Linkname: "f"}}, ErrUnsafeArchive},
		{"holes past the size", []*tar.Header{sparse("s", 1, "0+1", "0")}, ErrUnsafeArchive},
		{"holes overlapping", []*tar.Header{sparse("s", 2, "0+1,0+1", "10")}, ErrUnsafeArchive},
		{"holes out of order", []*tar.Header{sparse("s", 2, "5+1,0+1", "10")}, ErrUnsafeArchive},
		{"holes not adding up", []*tar.Header{sparse("s", 2, "0+1", "10")}, ErrUnsafeArchive},
		{"holes overflowing", []*tar.Header{sparse("s", 1, "9223372036854775807+1", "9223372036854775807")}, ErrUnsafeArchive},
		{"holes of a negative size", []*tar.Header{sparse("s", 0, "", "-1")}, ErrUnsafeArchive},
		{"holes with no size", []*tar.Header{sparse("s", 0, "", "")}, ErrUnsafeArchive},
		{"sparse with no map", []*tar.Header{{Name: "s", Typeflag: typeSparse, Size: 1, Mode: 0o644}}, ErrUnsafeArchive},
		{"holes as garbage", []*tar.Header{sparse("s", 1, "zero", "10")}, ErrUnsafeArchive},
		{"holes over budget", []*tar.Header{sparse("s", 1001, "0+1001", "1099511627776")}, ErrBudget},
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
				if (h.Typeflag == tar.TypeReg || h.Typeflag == typeSparse) && h.Size < 1<<20 {
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

// TestArchiveMovesWhatABoxMakes: what a session's code makes in its
// workspace in a few commands — a huge sparse file, one file under many
// names, links out of /home/user (a virtualenv's bin/python), a name
// with a newline — travels at the cost of its data, not of its size or
// its names, and arrives as it was.
func TestArchiveMovesWhatABoxMakes(t *testing.T) {
	t.Parallel()
	src, dst := t.TempDir(), t.TempDir()
	const huge = 1 << 40
	f, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("middle"), 1<<30)
	f.Truncate(huge)
	f.Close()
	os.WriteFile(filepath.Join(src, "holes-only"), nil, 0o644)
	os.Truncate(filepath.Join(src, "holes-only"), huge)
	os.WriteFile(filepath.Join(src, "one"), bytes.Repeat([]byte("x"), 1<<20), 0o640)
	os.Mkdir(filepath.Join(src, "d"), 0o755)
	const names = 200
	for i := range names {
		if err := os.Link(filepath.Join(src, "one"), filepath.Join(src, "d", fmt.Sprint("name", i))); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("/usr/bin/python3", filepath.Join(src, "python"))
	os.Symlink("../../etc/passwd", filepath.Join(src, "d", "up"))
	os.WriteFile(filepath.Join(src, "new\nline"), []byte("nl"), 0o600)
	var buf bytes.Buffer
	wst, err := WriteArchive(context.Background(), capped{&buf, 4 << 20}, src)
	if err != nil {
		t.Fatalf("the stream of 1 MiB and two blocks of data: %v", err)
	}
	// A sparse file is no regular-file entry: a reader that knows no map
	// of holes (a node of an earlier version) refuses it rather than take
	// its data as the whole file.
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if sparse := h.Name == "sparse" || h.Name == "holes-only"; sparse != (h.Typeflag == typeSparse) {
			t.Fatalf("%q is an entry of type %q", h.Name, h.Typeflag)
		}
	}
	st, err := Extract(context.Background(), &buf, dst, ExtractOptions{Budget: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 4 || st.Hardlinks != names || st.Symlinks != 2 || st.Bytes != wst.Bytes || st.Bytes > 1<<20+2+2*(64<<10) {
		t.Fatalf("extracted %+v, written %+v", st, wst)
	}
	for _, name := range []string{"sparse", "holes-only"} {
		fi, err := os.Stat(filepath.Join(dst, name))
		if err != nil || fi.Size() != huge {
			t.Fatalf("%s: %v %v", name, fi, err)
		}
		if blocks := fi.Sys().(*syscall.Stat_t).Blocks; blocks*512 > 1<<20 {
			t.Fatalf("%s takes %d bytes of disk", name, blocks*512)
		}
	}
	g, _ := os.Open(filepath.Join(dst, "sparse"))
	head, mid := make([]byte, 5), make([]byte, 7)
	g.ReadAt(head, 0)
	g.ReadAt(mid, 1<<30-1)
	g.Close()
	if string(head) != "head\x00" || string(mid) != "\x00middle" {
		t.Fatalf("the sparse file's data: %q %q", head, mid)
	}
	fi, err := os.Stat(filepath.Join(dst, "d", "name7"))
	if err != nil || fi.Sys().(*syscall.Stat_t).Nlink != names+1 || fi.Mode().Perm() != 0o640 {
		t.Fatalf("a file of many names: %v %v", fi, err)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "python")); l != "/usr/bin/python3" {
		t.Fatalf("a link out: %q", l)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "new\nline")); string(b) != "nl" {
		t.Fatalf("a name with a newline: %q", b)
	}
}

// TestCoalesceKeepsTheMapBounded: a file of more data segments than a map
// holds sends its smallest holes as zeros, and nothing else.
func TestCoalesceKeepsTheMapBounded(t *testing.T) {
	t.Parallel()
	segs := []segment{{0, 1}, {10, 1}, {12, 1}, {100, 1}, {103, 1}}
	got := coalesce(segs, 3)
	want := []segment{{0, 1}, {10, 3}, {100, 4}}
	if !slices.Equal(got, want) {
		t.Fatalf("coalesce: %v, want %v", got, want)
	}
}

// capped fails a write that takes buf past max bytes.
type capped struct {
	buf *bytes.Buffer
	max int
}

func (c capped) Write(p []byte) (int, error) {
	if c.buf.Len()+len(p) > c.max {
		return 0, fmt.Errorf("the stream passes %d bytes", c.max)
	}
	return c.buf.Write(p)
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

// TestArchiveSizeIsWhatTheMoveCharges: the size a drain offers a receiver
// is what the stream carries and Extract charges against its budget: a
// file with twenty names once, a 100 MiB sparse file by its data; a
// directory of the tree swapped for a link to the host's tree is not
// followed.
func TestArchiveSizeIsWhatTheMoveCharges(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	data := bytes.Repeat([]byte("0123456789"), 100_000)
	if err := os.WriteFile(filepath.Join(src, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := os.Link(filepath.Join(src, "f"), filepath.Join(src, fmt.Sprintf("l%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	sp, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.WriteAt([]byte("tail"), 100<<20); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	os.Symlink("/usr", filepath.Join(src, "usr"))
	size, err := ArchiveSize(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	wst, err := WriteArchive(context.Background(), &buf, src)
	if err != nil {
		t.Fatal(err)
	}
	if size != wst.Bytes || size < 1_000_004 || size > 1_000_000+64<<10 {
		t.Fatalf("ArchiveSize %d, the stream carries %d bytes of data (%+v)", size, wst.Bytes, wst)
	}
	if _, err := Extract(context.Background(), &buf, t.TempDir(), ExtractOptions{Budget: size}); err != nil {
		t.Fatalf("within the size as budget: %v", err)
	}
}
