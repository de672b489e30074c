package hostpath

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"cgroup memory.max: write /sys/fs/cgroup/memory/a/quro/tenant-1/run-2/memory.max: invalid argument",
			"cgroup memory.max: write memory.max: invalid argument"},
		{"/usr/bin/bwrap: new user, pid", "bwrap: new user, pid"},
		{"made under /sys/fs/cgroup/memory/x/quro", "made under quro"},
		{"debootstrap --cache-dir=/var/lib/quro/rootfs/.cache/bookworm bookworm /var/lib/quro/rootfs/.default.partial http://deb.debian.org/debian",
			"debootstrap --cache-dir=bookworm bookworm .default.partial http://deb.debian.org/debian"},
		{`chroot "/var/lib/quro/rootfs/.default.partial" dpkg`, `chroot ".default.partial" dpkg`},
		{"(mkdir /data/x/: permission denied)", "(mkdir x: permission denied)"},
		{"a / b, n/a, 1/2, tenant acme/x", "a / b, n/a, 1/2, tenant acme/x"},
		{"no path here", "no path here"},
		{"PATH=/usr/bin:/root/.cache/quro/python/bin", "PATH=bin:bin"},
		{"open file:/var/lib/quro/x {/var/lib/quro/y}", "open file:x {y}"},
		{"fetch https://example.org/a/b and scp host:/srv/a", "fetch https://example.org/a/b and scp host:a"},
	} {
		if got := Names(tc.in); got != tc.want {
			t.Errorf("Names(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestHome(t *testing.T) {
	const ws = "/var/lib/quro/sessions/ab/workspace"
	for _, tc := range []struct{ in, want string }{
		{ws, "/home/user"},
		{ws + "/stats", "/home/user/stats"},
		{ws + "x/y", ws + "x/y"},
		{"/tmp", "/tmp"},
	} {
		if got := InHome(ws, tc.in); got != tc.want {
			t.Errorf("InHome(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if tc.want != tc.in {
			if back := FromHome(ws, tc.want); back != tc.in {
				t.Errorf("FromHome(%q) = %q, want %q", tc.want, back, tc.in)
			}
		}
	}
	if got := FromHome(ws, "/home/username"); got != "/home/username" {
		t.Errorf("FromHome(/home/username) = %q", got)
	}
	for _, tc := range []struct{ in, want string }{
		{ws + "\n", "/home/user\n"},
		{"cd " + ws + "/a: no such file", "cd /home/user/a: no such file"},
		{`File "` + ws + `/m.py", line 1`, `File "/home/user/m.py", line 1`},
		{ws + "2/a " + ws, ws + "2/a /home/user"},
		{"nothing", "nothing"},
	} {
		if got := HomeText(ws, tc.in); got != tc.want {
			t.Errorf("HomeText(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// Error's text names no host path; errors.Is still sees the error.
func TestError(t *testing.T) {
	_, err := os.Open("/root/.cache/quro/python/missing")
	h := Error(err)
	if got := h.Error(); got != "open missing: no such file or directory" {
		t.Errorf("Error: %q", got)
	}
	if !errors.Is(h, fs.ErrNotExist) {
		t.Errorf("errors.Is lost the cause: %v", h)
	}
	if Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
}
