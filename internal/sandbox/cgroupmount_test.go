package sandbox

import "testing"

// TestUnderRoot: a cgroup path from /proc, read in a container whose v1
// hierarchy is mounted from the container's own cgroup (containerd on a
// cgroup v1 Kubernetes node), is found below the mount.
func TestUnderRoot(t *testing.T) {
	t.Parallel()
	pod := "/kubepods/burstable/pod1/c0ffee"
	for _, c := range []struct{ root, p, want string }{
		{"/", "/user.slice/x", "/user.slice/x"},
		{"", "/user.slice/x", "/user.slice/x"},
		{pod, pod, "/"},
		{pod, pod + "/quro/run-1", "/quro/run-1"},
		{pod, "/kubepods/burstable/pod1/c0ffee2", "/kubepods/burstable/pod1/c0ffee2"}, // not below root: as it was
	} {
		if got := underRoot(c.root, c.p); got != c.want {
			t.Errorf("underRoot(%q, %q) = %q, want %q", c.root, c.p, got, c.want)
		}
	}
}
