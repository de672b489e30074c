package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

const samplePackages = "Package: cowsay\nVersion: 3.03+dfsg2-8\nArchitecture: all\nDescription: configurable talking cow\n long text\n\n" +
	"Package: jq\r\nArchitecture: amd64\r\nVersion: 1.6-2.1\r\n\r\n" +
	"Package: Bad Name\nVersion: 1\n\n" +
	"Package: g++\nVersion: 4:12.2.0-3\nArchitecture: amd64\n"

func TestParsePackages(t *testing.T) {
	av := Available{}
	long := "Package: zz\nDescription: " + strings.Repeat("x", 2<<20) + "\nVersion: 9\n\n"
	if err := ParsePackages(strings.NewReader(samplePackages+"\n"+long), av); err != nil {
		t.Fatal(err)
	}
	if o := av["cowsay"]; o == nil || !slices.Equal(o.Archs, []string{"all"}) || !slices.Equal(o.Versions, []string{"3.03+dfsg2-8"}) {
		t.Errorf("cowsay: %+v", o)
	}
	if o := av["jq"]; o == nil || !slices.Equal(o.Versions, []string{"1.6-2.1"}) {
		t.Errorf("jq (CRLF): %+v", o)
	}
	if av["g++"] == nil || av["Bad Name"] != nil || len(av) != 4 {
		t.Errorf("names: %v", slices.Sorted(func(yield func(string) bool) {
			for k := range av {
				if !yield(k) {
					return
				}
			}
		}))
	}
	// The line too long to keep is skipped, not fatal; the rest of its
	// stanza still counts.
	if o := av["zz"]; o == nil || !slices.Equal(o.Versions, []string{"9"}) {
		t.Errorf("zz: %+v", o)
	}
	if near := av.Closest("cowsa.", 3); len(near) == 0 || near[0] != "cowsay" {
		t.Errorf("closest to cowsa.: %q", near)
	}
	if near := av.Closest("python3-numpy", 3); len(near) != 0 {
		t.Errorf("closest to python3-numpy: %q", near)
	}
}

// The lists are read out of a rootfs that maintainer scripts (root in it)
// may have changed: a symlink, a FIFO or a directory named like a list is
// never read, and the lists directory itself cannot lead out of the
// rootfs.
func TestAptListsDefensive(t *testing.T) {
	root := t.TempDir()
	lists := filepath.Join(root, AptListsDir)
	if err := os.MkdirAll(lists, 0o755); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "host_Packages")
	if err := os.WriteFile(host, []byte("Package: host-secret\nVersion: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(lists, "deb_dists_bookworm_main_binary-amd64_Packages"), []byte(samplePackages), 0o644))
	must(os.Symlink(host, filepath.Join(lists, "link_Packages")))
	must(syscall.Mkfifo(filepath.Join(lists, "fifo_Packages"), 0o644))
	must(os.Mkdir(filepath.Join(lists, "dir_Packages"), 0o755))
	must(os.WriteFile(filepath.Join(lists, "deb_dists_bookworm_Release"), []byte("Package: release-not-a-list\n"), 0o644))
	av, n, err := AptLists(root)
	if err != nil || n != 1 || av["cowsay"] == nil || av["host-secret"] != nil || av["release-not-a-list"] != nil {
		t.Fatalf("%d files, %v: %v", n, err, av)
	}
	// The lists directory a symlink out of the rootfs: refused, never read.
	must(os.RemoveAll(lists))
	must(os.Symlink(filepath.Dir(host), lists))
	if av, _, err := AptLists(root); err == nil && av["host-secret"] != nil {
		t.Fatalf("read through a symlink out of the rootfs: %v", av)
	}
	// No lists at all: nothing, no error.
	must(os.Remove(lists))
	if av, n, err := AptLists(root); err != nil || n != 0 || len(av) != 0 {
		t.Fatalf("no lists: %v %d %v", av, n, err)
	}
}

func TestUnsettled(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "var/lib/dpkg"), 0o755))
	st := "Package: ok\nStatus: install ok installed\nVersion: 1\n\n" +
		"Package: half\nStatus: install ok half-configured\n\n" +
		"Package: unp\nStatus: install ok unpacked\n\n" +
		"Package: gone\nStatus: deinstall ok config-files\n\n" +
		"Package: req\nStatus: install reinstreq half-installed\n\n" +
		"Package: trig\nStatus: install ok triggers-pending\n"
	must(os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), []byte(st), 0o644))
	bad, err := Unsettled(root)
	want := []string{"half (half-configured)", "req (reinstreq, half-installed)", "trig (triggers-pending)", "unp (unpacked)"}
	if err != nil || !slices.Equal(bad, want) {
		t.Fatalf("%q %v, want %q", bad, err, want)
	}
	// A status that is a symlink (to anything) is not read: the state is
	// unknown, which is an error, never "clean".
	must(os.Remove(filepath.Join(root, "var/lib/dpkg/status")))
	must(os.Symlink("/etc/hostname", filepath.Join(root, "var/lib/dpkg/status")))
	if _, err := Unsettled(root); err == nil {
		t.Fatal("a symlinked status was read")
	}
}

// FuzzParsePackages: whatever a list holds, parsing ends without a panic,
// and every name kept is a Debian package name with bounded fields.
func FuzzParsePackages(f *testing.F) {
	f.Add([]byte(samplePackages))
	f.Add([]byte("Package: a\n"))
	f.Add([]byte("Package:\nVersion:\n\n\n"))
	f.Add([]byte("Package: x.\nArchitecture: " + strings.Repeat("a", 40) + "\n"))
	f.Add([]byte("\x00\xff\nPackage: -o\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		av := Available{}
		if err := ParsePackages(strings.NewReader(string(data)), av); err != nil {
			return
		}
		for k, o := range av {
			if !packageNameRE().MatchString(k) || o == nil {
				t.Fatalf("kept %q", k)
			}
			for _, a := range o.Archs {
				if a == "" || len(a) > 32 {
					t.Fatalf("arch %q", a)
				}
			}
			for _, v := range o.Versions {
				if v == "" || len(v) > 128 {
					t.Fatalf("version %q", v)
				}
			}
		}
	})
}

// BenchmarkParsePackages reads a list the size of bookworm main's (63 000
// stanzas of about 1 KiB); each install reads it once.
func BenchmarkParsePackages(b *testing.B) {
	var sb strings.Builder
	for i := range 63000 {
		fmt.Fprintf(&sb, "Package: pkg%d\nSource: src%d\nVersion: 1.%d-1\nInstalled-Size: 100\nMaintainer: Someone <someone@example.org>\nArchitecture: amd64\nDepends: libc6 (>= 2.34), libfoo%d\n"+
			"Description: a package\nMulti-Arch: foreign\nHomepage: https://example.org/\nDescription-md5: 0123456789abcdef0123456789abcdef\nTag: devel::lang, role::program\nSection: utils\nPriority: optional\n"+
			"Filename: pool/main/p/pkg%d/pkg%d_1.%d-1_amd64.deb\nSize: 12345\nMD5sum: 0123456789abcdef0123456789abcdef\nSHA256: %s\n\n", i, i, i, i, i, i, i, strings.Repeat("ab", 32))
	}
	data := sb.String()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		av := Available{}
		if err := ParsePackages(strings.NewReader(data), av); err != nil || len(av) != 63000 {
			b.Fatal(err, len(av))
		}
	}
}
