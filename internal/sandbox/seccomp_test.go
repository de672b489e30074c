package sandbox

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// runFilter interprets prog (the subset of classic BPF that seccompProgram
// emits) on one seccomp_data, as the kernel would.
func runFilter(t *testing.T, prog []unix.SockFilter, auditArch uint32, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	var data [64]byte
	le := func(off int, v uint32) {
		data[off], data[off+1], data[off+2], data[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	le(offNR, nr)
	le(offArch, auditArch)
	for i, a := range args {
		le(offArgs+8*i, uint32(a))
		le(offArgs+8*i+4, uint32(a>>32))
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case ldAbs:
			k := int(in.K)
			acc = uint32(data[k]) | uint32(data[k+1])<<8 | uint32(data[k+2])<<16 | uint32(data[k+3])<<24
		case andK:
			acc &= in.K
		case ja:
			pc += int(in.K)
		case jeqK, jgtK, jgeK:
			var ok bool
			switch in.Code {
			case jeqK:
				ok = acc == in.K
			case jgtK:
				ok = acc > in.K
			case jgeK:
				ok = acc >= in.K
			}
			if ok {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case retK:
			return in.K
		default:
			t.Fatalf("instruction %d: unexpected code %#x", pc, in.Code)
		}
	}
	t.Fatal("the program ran off its end")
	return 0
}

func TestSeccompProgramDecisions(t *testing.T) {
	archID := auditArch[runtime.GOARCH]
	info, err := arch.GetInfo(runtime.GOARCH)
	if err != nil {
		t.Skip(err)
	}
	nr := func(name string) uint32 {
		n, ok := info.SyscallNames[name]
		if !ok {
			t.Fatalf("no system call %s on %s", name, runtime.GOARCH)
		}
		return uint32(n)
	}
	for _, caps := range [][]string{nil, AdminCaps} {
		prog, err := seccompProgram(caps)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("caps %v: %d instructions", caps, len(prog))
		if len(prog) > maxSeccompInsns {
			t.Fatalf("%d instructions", len(prog))
		}
		dec := func(name string, args ...uint64) uint32 {
			var a [6]uint64
			copy(a[:], args)
			return runFilter(t, prog, archID, nr(name), a)
		}
		check := func(what string, got, want uint32) {
			t.Helper()
			if got != want {
				t.Errorf("caps %v: %s: got %#x, want %#x", caps, what, got, want)
			}
		}
		// Every call the resolved profile allows unconditionally is allowed,
		// but for Quro's denials.
		spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
		prof, err := mobyseccomp.GetDefaultProfile(spec)
		if err != nil {
			t.Fatal(err)
		}
		denied := map[uint32]bool{unix.SYS_CLONE3: true, unix.SYS_IOCTL: true}
		for _, d := range deniedSyscalls {
			denied[uint32(d.nr)] = true
			check(d.name, dec(d.name), retEPERM)
		}
		allowed := 0
		for _, r := range prof.Syscalls {
			if r.Action != specs.ActAllow || len(r.Args) > 0 {
				continue
			}
			for _, name := range r.Names {
				if n, ok := info.SyscallNames[name]; ok && !denied[uint32(n)] {
					check(name, dec(name), retAllow)
					allowed++
				}
			}
		}
		if allowed < 300 {
			t.Errorf("only %d calls allowed", allowed)
		}
		check("clone3", dec("clone3"), retENOSYS)
		check("clone for a thread", dec("clone", unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD|unix.CLONE_SYSVSEM), retAllow)
		check("clone for fork", dec("clone", uint64(unix.SIGCHLD)), retAllow)
		for _, f := range []uint64{unix.CLONE_NEWUSER, unix.CLONE_NEWNS, unix.CLONE_NEWNET, unix.CLONE_NEWPID | uint64(unix.SIGCHLD), unix.CLONE_NEWCGROUP, unix.CLONE_NEWIPC, unix.CLONE_NEWUTS} {
			check(fmt.Sprintf("clone %#x", f), dec("clone", f), retEPERM)
		}
		check("ioctl TCGETS", dec("ioctl", 0, unix.TCGETS), retAllow)
		check("ioctl FIONREAD", dec("ioctl", 3, unix.TIOCINQ), retAllow)
		check("ioctl TIOCSTI", dec("ioctl", 0, unix.TIOCSTI), retEPERM)
		check("ioctl TIOCSTI with high bits", dec("ioctl", 0, unix.TIOCSTI|1<<32), retEPERM)
		check("ioctl TIOCLINUX", dec("ioctl", 0, unix.TIOCLINUX), retEPERM)
		check("ioctl TIOCLINUX with high bits", dec("ioctl", 0, unix.TIOCLINUX|0xffffffff00000000), retEPERM)
		// btrfs's ioctls (a subvolume of the box's own would escape the
		// session's quota group), but not the generic reflink ones.
		for name, req := range map[string]uint64{"BTRFS_IOC_SUBVOL_CREATE": 0x5000940e, "BTRFS_IOC_SUBVOL_CREATE_V2": 0x50009418,
			"BTRFS_IOC_SNAP_CREATE_V2": 0x50009417, "BTRFS_IOC_SNAP_DESTROY": 0x5000940f, "BTRFS_IOC_QGROUP_LIMIT": 0x8030942b,
			"BTRFS_IOC_QUOTA_CTL": 0xc0109428, "BTRFS_IOC_TREE_SEARCH": 0xd0009411, "a btrfs ioctl with high bits": 0x5000940e | 1<<32} {
			check("ioctl "+name, dec("ioctl", 3, req), retEPERM)
		}
		for _, req := range []uint64{unix.FICLONE, unix.FICLONERANGE, unix.FIDEDUPERANGE, unix.FS_IOC_GETFLAGS} {
			check(fmt.Sprintf("ioctl %#x", req), dec("ioctl", 3, req), retAllow)
		}
		for _, af := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK, unix.AF_PACKET} {
			check(fmt.Sprintf("socket %d", af), dec("socket", af, unix.SOCK_STREAM), retAllow)
		}
		check("socket AF_VSOCK", dec("socket", unix.AF_VSOCK, unix.SOCK_STREAM), retEPERM)
		check("socket AF_UNIX with high bits", dec("socket", unix.AF_UNIX|1<<32, unix.SOCK_STREAM), retEPERM)
		check("socket 0", dec("socket", 0), retAllow) // AF_UNSPEC: the kernel refuses it
		for _, p := range []uint64{0, 8, 0x20000, 0x20008, 0xffffffff} {
			check(fmt.Sprintf("personality %#x", p), dec("personality", p), retAllow)
		}
		check("personality READ_IMPLIES_EXEC", dec("personality", 0x0400000), retEPERM)
		check("personality 0xffffffff with high bits", dec("personality", 0xffffffff|1<<40), retEPERM)
		// The profile names these only under capabilities the box lacks.
		for _, name := range []string{"quotactl", "sethostname", "vhangup", "clock_settime", "mbind", "lookup_dcookie"} {
			check(name, dec(name), retEPERM)
		}
		// Numbers the profile does not name: ENOSYS, so libc falls back.
		check("uselib", dec("uselib"), retENOSYS)
		check("number 1000", runFilter(t, prog, archID, 1000, [6]uint64{}), retENOSYS)
		check("number 2^30-1", runFilter(t, prog, archID, 1<<30-1, [6]uint64{}), retENOSYS)
		// Foreign ABIs die.
		check("i386", runFilter(t, prog, unix.AUDIT_ARCH_I386, 20, [6]uint64{}), retKill)
		if runtime.GOARCH == "amd64" {
			check("x32", runFilter(t, prog, archID, 0x40000000|39, [6]uint64{}), retKill)
			check("x32 max", runFilter(t, prog, archID, 0xffffffff, [6]uint64{}), retKill)
		}
	}
}

func TestSeccompOpsCompile(t *testing.T) {
	// Each comparison, on both words of a 64-bit argument.
	for _, tc := range []struct {
		c    scCond
		arg  uint64
		want bool
	}{
		{scCond{op: opEq, value: 5}, 5, true},
		{scCond{op: opEq, value: 5}, 5 | 1<<32, false},
		{scCond{op: opEq, value: 1 << 33}, 1 << 33, true},
		{scCond{op: opEq, value: 1 << 33}, 0, false},
		{scCond{op: opLt, value: 10}, 9, true},
		{scCond{op: opLt, value: 10}, 10, false},
		{scCond{op: opLt, value: 10}, 1 << 32, false},
		{scCond{op: opLt, value: 1<<32 | 10}, 0xffffffff, true},
		{scCond{op: opLt, value: 1<<32 | 10}, 1<<32 | 9, true},
		{scCond{op: opLt, value: 1<<32 | 10}, 1<<32 | 10, false},
		{scCond{op: opLt, value: 1<<32 | 10}, 2 << 32, false},
		{scCond{op: opMaskedEq, mask: 0xf0, value: 0}, 0x0f, true},
		{scCond{op: opMaskedEq, mask: 0xf0, value: 0}, 0x1f, false},
		{scCond{op: opMaskedEq, mask: 1<<40 | 1, value: 1 << 40}, 1<<40 | 2, true},
		{scCond{op: opMaskedEq, mask: 1<<40 | 1, value: 1 << 40}, 2, false},
		{scCond{op: opNe32, value: 7}, 7 | 1<<32, false},
		{scCond{op: opNe32, value: 7}, 8, true},
		{scCond{op: opMaskedNe32, mask: 0xff00, value: 0x9400}, 0x5000940e, false},
		{scCond{op: opMaskedNe32, mask: 0xff00, value: 0x9400}, 0x5000940e | 1<<40, false},
		{scCond{op: opMaskedNe32, mask: 0xff00, value: 0x9400}, 0x5401, true},
		{scCond{op: opEq32, value: 9}, 9 | 1<<32, true},
		{scCond{op: opEq32, value: 9}, 10, false},
	} {
		for _, arg := range []uint32{0, 3, 5} {
			tc.c.arg = arg
			h := &scHandler{rules: []scRule{{conds: []scCond{tc.c}, ret: retAllow}}, fallback: retEPERM}
			code, err := handlerCode(h)
			if err != nil {
				t.Fatal(err)
			}
			var args [6]uint64
			args[arg] = tc.arg
			got := runFilter(t, code, 0, 0, args) == retAllow
			if got != tc.want {
				t.Errorf("%+v on %#x: got %v", tc.c, tc.arg, got)
			}
		}
	}
}
