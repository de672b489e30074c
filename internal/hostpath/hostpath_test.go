package hostpath

import "testing"

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
	} {
		if got := Names(tc.in); got != tc.want {
			t.Errorf("Names(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
