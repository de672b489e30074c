package sandbox

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// legacySeccompProgram is the deny list the allowlist replaced, kept to
// measure against.
func legacySeccompProgram() []unix.SockFilter {
	eperm := retEPERM
	p := []unix.SockFilter{
		stmt(ldAbs, offArch),
		jump(jeqK, auditArch[runtime.GOARCH], 1, 0),
		stmt(retK, retKill),
		stmt(ldAbs, offNR),
	}
	if runtime.GOARCH == "amd64" {
		p = append(p, jump(jgeK, 0x40000000, 0, 1), stmt(retK, retKill))
	}
	for _, d := range deniedSyscalls {
		p = append(p, jump(jeqK, uint32(d.nr), 0, 1), stmt(retK, eperm))
	}
	p = append(p, jump(jeqK, unix.SYS_CLONE3, 0, 1), stmt(retK, retENOSYS))
	p = append(p,
		jump(jeqK, unix.SYS_CLONE, 0, 3),
		stmt(ldAbs, offArgs),
		jump(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, namespaceCloneFlags, 0, 1),
		stmt(retK, eperm),
		stmt(ldAbs, offNR),
	)
	p = append(p,
		jump(jeqK, unix.SYS_IOCTL, 0, 4),
		stmt(ldAbs, offArgs+8),
		jump(jeqK, unix.TIOCSTI, 1, 0),
		jump(jeqK, unix.TIOCLINUX, 0, 1),
		stmt(retK, eperm),
	)
	return append(p, stmt(retK, retAllow))
}

// seccompBenchC attaches the filter in argv[1] ("-" for none) and reports
// the attach time (in 200 fresh children) and the time of calls the kernel's
// action cache answers (getpid), that run the filter (ioctl on a bad fd: the
// filter reads its request), and that the filter refuses (number 1000).
const seccompBenchC = `#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct sock_fprog prog;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void attach(void) {
	if (!prog.len) return;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) { perror("seccomp"); _exit(1); }
}

int main(int argc, char **argv) {
	if (argv[1][0] != '-') {
		FILE *f = fopen(argv[1], "rb");
		static struct sock_filter buf[4096];
		prog.len = fread(buf, sizeof buf[0], 4096, f);
		prog.filter = buf;
	}
	double *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	const int kids = 200, n = 2000000;
	for (int i = 0; i < kids; i++) {
		pid_t p = fork();
		if (p == 0) { double t = now(); attach(); shared[0] += now() - t; _exit(0); }
		waitpid(p, NULL, 0);
	}
	pid_t p = fork();
	if (p == 0) {
		attach();
		int x;
		double t = now();
		for (int i = 0; i < n; i++) syscall(SYS_getpid);
		shared[1] = (now() - t) / n;
		t = now();
		for (int i = 0; i < n; i++) ioctl(-1, FIONREAD, &x);
		shared[2] = (now() - t) / n;
		t = now();
		for (int i = 0; i < n; i++) syscall(1000);
		shared[3] = (now() - t) / n;
		_exit(0);
	}
	waitpid(p, NULL, 0);
	printf("attach_ns %.0f getpid_ns %.1f ioctl_ns %.1f nosys_ns %.1f\n", shared[0] / kids, shared[1], shared[2], shared[3]);
	return 0;
}
`

func filterBytes(p []unix.SockFilter) []byte {
	var b []byte
	for _, f := range p {
		b = binary.LittleEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.LittleEndian.AppendUint32(b, f.K)
	}
	return b
}

// BenchmarkSeccompFilter runs the probe in a box without the seccomp layer,
// so that only the filter under test is attached: none, the old deny list,
// the allowlist.
//
//	go test -run '^$' -bench BenchmarkSeccompFilter -benchtime 3x ./internal/sandbox/
func BenchmarkSeccompFilter(b *testing.B) {
	if _, err := exec.LookPath("gcc"); err != nil {
		b.Skip("no gcc")
	}
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "bench.c"), []byte(seccompBenchC), 0o644)
	if out, err := exec.Command("gcc", "-O2", "-o", filepath.Join(dir, "bench"), filepath.Join(dir, "bench.c")).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v %s", err, out)
	}
	allow, err := seccompProgram(nil)
	if err != nil {
		b.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "old.bpf"), filterBytes(legacySeccompProgram()), 0o644)
	os.WriteFile(filepath.Join(dir, "new.bpf"), filterBytes(allow), 0o644)
	sb := noSeccompSandbox(b)
	for _, tc := range []struct{ name, file string }{{"none", "-"}, {"old", "old.bpf"}, {"new", "new.bpf"}} {
		b.Run(tc.name, func(b *testing.B) {
			sums := map[string]float64{}
			for range b.N {
				var out bytes.Buffer
				exit, err := sb.Run(b.Context(), &Spec{Args: []string{"./bench", tc.file}, Dir: dir, Stdout: &out, Stderr: &out})
				if err != nil || exit.Code != 0 {
					b.Fatalf("%v %+v %s", err, exit, out.String())
				}
				f := strings.Fields(out.String())
				for i := 0; i+1 < len(f); i += 2 {
					v, _ := strconv.ParseFloat(f[i+1], 64)
					sums[f[i]] += v
				}
			}
			for k, v := range sums {
				b.ReportMetric(v/float64(b.N), k)
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
