package sandbox

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The seccomp layer is a small classic-BPF program built by hand, so that it
// can be audited in one screen. It is a deny list on top of the other layers:
// everything not named here is allowed, because the namespaces, Landlock and
// the missing capabilities already stop what these calls could otherwise do;
// the list removes the kernel attack surface that user code has no business
// reaching (and that has carried most container-escape bugs).
//
// Denied calls fail with EPERM, except clone3 (ENOSYS, so that libc falls
// back to clone, whose flags a filter can inspect) and calls from a foreign
// syscall ABI (the process is killed).

// deniedSyscalls fail with EPERM.
var deniedSyscalls = []struct {
	name string
	nr   uintptr
}{
	// debugging other processes and reading their memory
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"kcmp", unix.SYS_KCMP},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
	// the mount family, old and new API
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"chroot", unix.SYS_CHROOT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	// new namespaces
	{"unshare", unix.SYS_UNSHARE},
	{"setns", unix.SYS_SETNS},
	// kernel keyrings, BPF, perf, userfaultfd, io_uring
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER},
	{"io_uring_register", unix.SYS_IO_URING_REGISTER},
	// the machine itself
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"reboot", unix.SYS_REBOOT},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"acct", unix.SYS_ACCT},
	{"syslog", unix.SYS_SYSLOG},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT},
}

// namespaceCloneFlags are the clone(2) flags that create namespaces.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccomp_data offsets
const (
	offNR   = 0
	offArch = 4
	offArgs = 16 // args[i] at 16+8*i; the low 32 bits come first on little-endian machines
)

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	ldAbs  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	jgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	retK   = unix.BPF_RET | unix.BPF_K
	retErr = unix.SECCOMP_RET_ERRNO
)

// seccompProgram builds the filter for this machine's architecture.
func seccompProgram() ([]unix.SockFilter, error) {
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: no filter for GOARCH %s", runtime.GOARCH)
	}
	eperm := retErr | uint32(unix.EPERM)
	var p []unix.SockFilter
	// A foreign ABI (e.g. 32-bit calls on amd64) would bypass the numbers
	// below: kill.
	p = append(p,
		stmt(ldAbs, offArch),
		jump(jeqK, arch, 1, 0),
		stmt(retK, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(ldAbs, offNR),
	)
	if runtime.GOARCH == "amd64" { // x32 syscalls have bit 30 set
		p = append(p, jump(jgeK, 0x40000000, 0, 1), stmt(retK, unix.SECCOMP_RET_KILL_PROCESS))
	}
	for _, d := range deniedSyscalls {
		p = append(p, jump(jeqK, uint32(d.nr), 0, 1), stmt(retK, eperm))
	}
	// clone3 passes its flags in memory a filter cannot read: say it does not
	// exist, and libc falls back to clone.
	p = append(p, jump(jeqK, unix.SYS_CLONE3, 0, 1), stmt(retK, retErr|uint32(unix.ENOSYS)))
	// clone: refuse namespace flags (flags are args[0] on amd64 and arm64).
	p = append(p,
		jump(jeqK, unix.SYS_CLONE, 0, 3),
		stmt(ldAbs, offArgs),
		jump(jsetK, namespaceCloneFlags, 0, 1),
		stmt(retK, eperm),
		stmt(ldAbs, offNR), // restore the number for the ioctl check
	)
	// ioctl(fd, TIOCSTI | TIOCLINUX): the request is compared on its low 32
	// bits only, as the kernel does, so high garbage cannot slip past.
	p = append(p,
		jump(jeqK, unix.SYS_IOCTL, 0, 4),
		stmt(ldAbs, offArgs+8),
		jump(jeqK, unix.TIOCSTI, 1, 0),
		jump(jeqK, unix.TIOCLINUX, 0, 1),
		stmt(retK, eperm),
	)
	p = append(p, stmt(retK, unix.SECCOMP_RET_ALLOW))
	return p, nil
}

var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

// seccompBytes is the filter in the kernel's struct sock_filter layout, as
// the init child loads it (boxinit); built once per process.
var seccompBytes = sync.OnceValues(func() ([]byte, error) {
	prog, err := seccompProgram()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		b = binary.LittleEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.LittleEndian.AppendUint32(b, f.K)
	}
	return b, nil
})
