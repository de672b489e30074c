package sandbox

import (
	"fmt"
	"slices"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
	"golang.org/x/sys/unix"
)

// The Landlock layer, written against the kernel ABI (the go-landlock module
// needs libcap's psx package for pre-ABI-8 kernels, which this build cannot
// fetch; the calling-thread semantics it works around do not matter here,
// because the init child locks its OS thread and execs from that same
// thread, so the exec'd program inherits the domain). The server compiles
// the rules here; the init child (boxinit) makes the system calls.

// devFiles are the device nodes of bubblewrap's minimal /dev that user code
// may read, write and (for terminals) ioctl.
var devFiles = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"}

const (
	llRead     = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	llFileRW   = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	llFileMask = unix.LANDLOCK_ACCESS_FS_EXECUTE | llFileRW
)

// landlockABI is the kernel's Landlock ABI version, 0 without Landlock.
func landlockABI() int {
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(abi)
}

// handledFS is every filesystem right the ABI knows (up to ABI 8).
func handledFS(abi int) uint64 {
	fs := uint64(unix.LANDLOCK_ACCESS_FS_MAKE_SYM<<1 - 1) // ABI 1: execute … make_sym
	if abi >= 2 {
		fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return fs
}

// compileLandlock fills bp's Landlock fields from p for the best ABI the
// kernel has; the init child applies them (boxinit):
//   - filesystem: read and execute only beneath p.RO and p.ROFiles,
//     everything beneath p.RW, read-write-ioctl on the listed device files;
//   - network (ABI 4+): under policy "none" without a network namespace of
//     the box's own (minimal isolation, no bubblewrap) every TCP bind and
//     connect is refused (and UDP with ABI 10+); in a box of its own
//     namespace (loopback only) and under "full" the network is not
//     handled;
//   - scopes (ABI 6+): no connecting to abstract unix sockets and no signals
//     to processes outside the run's Landlock domain.
func compileLandlock(p *initPolicy, bp *boxinit.Policy) error {
	abi := landlockABI()
	if abi == 0 {
		return fmt.Errorf("landlock: not available")
	}
	fs := handledFS(abi)
	bp.LLFS, bp.LLFileMask = fs, llFileMask
	if abi >= 4 && p.Network != NetworkHost && !p.OwnNetns {
		bp.LLNet = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
		if abi >= 10 {
			bp.LLNet |= unix.LANDLOCK_ACCESS_NET_BIND_UDP | unix.LANDLOCK_ACCESS_NET_CONNECT_SEND_UDP
		}
	}
	if abi >= 6 {
		bp.LLScoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
	}
	add := func(paths []string, access uint64) {
		for _, path := range paths {
			bp.Rules = append(bp.Rules, boxinit.Rule{Path: path, Access: access})
		}
	}
	add(p.RO, llRead)
	add(p.ListDirs, unix.LANDLOCK_ACCESS_FS_READ_DIR)
	add(p.ROFiles, llRead)
	add(append(slices.Clone(p.RW), "/dev/pts"), fs)
	add(devFiles, llFileRW)
	return nil
}
