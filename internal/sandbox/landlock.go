package sandbox

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Landlock layer, written against the kernel ABI with x/sys/unix (the
// go-landlock module needs libcap's psx package for pre-ABI-8 kernels,
// which this build cannot fetch; the calling-thread semantics it works
// around do not matter here, because the init child locks its OS thread and
// execs from that same thread, so the exec'd program inherits the domain).

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

// applyLandlock restricts the calling thread (and what it execs) with the
// best ABI the kernel has:
//   - filesystem: read and execute only beneath p.RO and p.ROFiles,
//     everything beneath p.RW, read-write-ioctl on the listed device files;
//   - network (ABI 4+): under policy "none" every TCP bind and connect is
//     refused (and UDP with ABI 10+); under "full" the network is not handled;
//   - scopes (ABI 6+): no connecting to abstract unix sockets and no signals
//     to processes outside the run's Landlock domain.
func applyLandlock(p *initPolicy) error {
	abi := landlockABI()
	if abi == 0 {
		return fmt.Errorf("landlock: not available")
	}
	fs := handledFS(abi)
	attr := unix.LandlockRulesetAttr{Handled_access_fs: fs}
	size := unsafe.Sizeof(attr.Handled_access_fs)
	if abi >= 4 {
		if p.Network != NetworkFull {
			attr.Handled_access_net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
			if abi >= 10 {
				attr.Handled_access_net |= unix.LANDLOCK_ACCESS_NET_BIND_UDP | unix.LANDLOCK_ACCESS_NET_CONNECT_SEND_UDP
			}
		}
		size += unsafe.Sizeof(attr.Handled_access_net)
	}
	if abi >= 6 {
		attr.Scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
		size += unsafe.Sizeof(attr.Scoped)
	}
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %v", errno)
	}
	defer unix.Close(int(rfd))

	add := func(path string, access uint64) error {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			if os.IsNotExist(err) {
				return nil // nothing there, nothing to allow
			}
			return fmt.Errorf("landlock: open %s: %w", path, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("landlock: stat %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			access &= llFileMask
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access & fs, Parent_fd: int32(fd)}
		_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, rfd, unix.LANDLOCK_RULE_PATH_BENEATH,
			uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		if errno != 0 {
			return fmt.Errorf("landlock_add_rule %s: %v", path, errno)
		}
		return nil
	}
	for _, d := range p.RO {
		if err := add(d, llRead); err != nil {
			return err
		}
	}
	for _, d := range p.ListDirs {
		if err := add(d, unix.LANDLOCK_ACCESS_FS_READ_DIR); err != nil {
			return err
		}
	}
	for _, f := range p.ROFiles {
		if err := add(f, llRead); err != nil {
			return err
		}
	}
	for _, d := range append(p.RW, "/dev/pts") {
		if err := add(d, fs); err != nil {
			return err
		}
	}
	for _, f := range devFiles {
		if err := add(f, llFileRW); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %v", errno)
	}
	return nil
}
