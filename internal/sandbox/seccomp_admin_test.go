package sandbox

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// adminProbeC reports the install box's effective capabilities and what the
// calls the profile grants to CAP_DAC_READ_SEARCH and CAP_SYS_ADMIN answer.
const adminProbeC = `#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int err(long r) { return r < 0 ? errno : 0; }

int main(void) {
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) != 0) { perror("capget"); return 1; }
	printf("capeff=%llx\n", ((unsigned long long)d[1].effective << 32) | d[0].effective);
	printf("dac_read_search=%d chown=%d sys_admin=%d uid=%d\n", !!(d[0].effective & (1 << CAP_DAC_READ_SEARCH)),
		!!(d[0].effective & (1 << CAP_CHOWN)), !!(d[0].effective & (1 << CAP_SYS_ADMIN)), getuid());
	struct { struct file_handle fh; unsigned char b[128]; } fh = {.fh.handle_bytes = 128};
	int mnt;
	printf("name_to_handle_at=%d ", err(syscall(SYS_name_to_handle_at, AT_FDCWD, "/bin", &fh, &mnt, 0)));
	printf("open_by_handle_at=%d ", err(syscall(SYS_open_by_handle_at, AT_FDCWD, &fh, O_RDONLY)));
	printf("chroot=%d ", err(chroot("/")));
	printf("unshare=%d ", err(unshare(CLONE_NEWUSER)));
	printf("mount=%d ", err(mount("none", "/tmp", "tmpfs", 0, NULL)));
	printf("vsock=%d\n", err(socket(AF_VSOCK, SOCK_STREAM, 0)));
	int fd = open("/bin/written", O_CREAT | O_WRONLY, 0644);
	printf("fchown=%d\n", err(fchown(fd, 65534, 65534)));
	return 0;
}
`

// The install box keeps AdminCaps, for which moby's profile would allow
// open_by_handle_at (the "shocker" escape) and name_to_handle_at: Quro's
// denials stay on top, and the calls apt and dpkg need (chown) still work.
func TestSeccompInstallBoxKeepsDenials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the install box needs a server running as root")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc on this machine (apt-get install -y gcc libc6-dev)")
	}
	sb := fullSandbox(t)
	// A minimal rootfs: the loader and libc for the init child (this test
	// binary), and the probe, static.
	root := t.TempDir()
	for _, f := range []string{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("no %s: this test knows Debian's amd64 layout only", f)
		}
		copyFile(t, f, filepath.Join(root, f))
	}
	src := filepath.Join(t.TempDir(), "probe.c")
	os.WriteFile(src, []byte(adminProbeC), 0o644)
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libc.a"); err != nil {
		t.Skip("no static libc for the probe (apt-get install -y libc6-dev)")
	}
	os.Mkdir(filepath.Join(root, "bin"), 0o755)
	if out, err := exec.Command("gcc", "-static", "-o", filepath.Join(root, "bin", "probe"), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc -static: %v %s", err, out)
	}
	run := func(sb *Sandbox) string {
		var out bytes.Buffer
		exit, err := sb.Run(testCtx(t), &Spec{Args: []string{"/bin/probe"}, Dir: t.TempDir(), Rootfs: root, RootfsAdmin: true,
			Stdout: &out, Stderr: &out})
		if err != nil || exit.Code != 0 {
			t.Fatalf("install box: %v %+v\n%s", err, exit, out.String())
		}
		return out.String()
	}
	out := run(sb)
	t.Logf("under the filter:\n%s", out)
	// The box holds AdminCaps and nothing else (bubblewrap, run by host
	// root, would leave the box's root every capability without the
	// --cap-drop ALL before them); the filter was compiled for AdminCaps
	// and its denials hold on top.
	var want uint64
	for _, c := range []uint{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER,
		unix.CAP_FSETID, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_KILL} {
		want |= 1 << c
	}
	if !strings.Contains(out, fmt.Sprintf("capeff=%x\n", want)) {
		t.Errorf("install box capabilities: want exactly AdminCaps (capeff=%x)\n%s", want, out)
	}
	for _, want := range []string{"dac_read_search=1 chown=1 sys_admin=0", " uid=0",
		"name_to_handle_at=1 open_by_handle_at=1 chroot=1 unshare=1 mount=1 vsock=1", "fchown=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("install box lacks %q", want)
		}
	}
	// Without the filter the kernel would answer name_to_handle_at: the
	// EPERM above is the filter's.
	os.Remove(filepath.Join(root, "bin", "written"))
	out = run(noSeccompSandbox(t))
	t.Logf("without the filter:\n%s", out)
	if strings.Contains(out, "name_to_handle_at=1 ") {
		t.Errorf("name_to_handle_at is refused even without the filter: the check proves nothing\n%s", out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, r); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
