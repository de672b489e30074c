package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg is the hidden first argument with which the quro binary re-executes
// itself as the sandbox's init child (inside the bubblewrap box when that
// layer is on). The child applies, in this order, the layers that act on
// the process itself, then execs the user program in its own place, so no Go
// code of Quro's remains in the process that runs user code:
//
//  1. mark every inherited descriptor from STATUS_FD up close-on-exec;
//  2. wait for the server's go-ahead (cgroup join) when POLICY asks;
//  3. rlimits;
//  4. no_new_privs, then Landlock;
//  5. seccomp;
//  6. report "ready" on the status fd, and exec.
//
// argv: quro __quro_sandbox_init STATUS_FD LIMITS POLICY -- PROGRAM ARGS...
const initArg = "__quro_sandbox_init"

// initPolicy is the POLICY argument: what the init child applies.
type initPolicy struct {
	Landlock bool     `json:"landlock,omitempty"`
	Seccomp  bool     `json:"seccomp,omitempty"`
	Network  string   `json:"network,omitempty"`
	RO       []string `json:"ro,omitempty"` // read and execute beneath these
	ROFiles  []string `json:"ro_files,omitempty"`
	RW       []string `json:"rw,omitempty"` // read, write, execute beneath these
	ListDirs []string `json:"ls,omitempty"` // only list directories beneath these
	WaitFD   int      `json:"wait_fd,omitempty"`
	UID      int      `json:"uid,omitempty"` // switch to this uid and gid before the other layers
}

// readyByte is what the init child writes on the status fd just before it
// execs; anything else is the reason it could not.
const readyByte = 'R'

// The hook runs in package initialisation so that every binary that links
// the sandbox (quro itself and its test binaries) can serve as the init child.
func init() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case initArg:
			os.Exit(initMain(os.Args[2:]))
		case initArg + "-probe": // doctor's namespace probe: being started is the answer
			os.Exit(0)
		}
	}
}

// initMain returns only when it could not exec the program.
func initMain(args []string) int {
	// Every layer below acts on the calling thread (and Landlock and seccomp
	// on all threads); the exec must come from the same thread.
	runtime.LockOSThread()
	if len(args) < 5 || args[3] != "--" {
		fmt.Fprintln(os.Stderr, "quro sandbox init: bad arguments")
		return 127
	}
	fd, err := strconv.Atoi(args[0])
	if err != nil || fd < 3 {
		fmt.Fprintln(os.Stderr, "quro sandbox init: bad status fd")
		return 127
	}
	status := os.NewFile(uintptr(fd), "status")
	// Descriptors the server inherited without close-on-exec must not reach
	// user code: everything above the status fd closes at exec, and so does
	// the status fd itself. Below it are only 0-2 and the spec's ExtraFiles.
	if err := closeFrom(fd); err != nil {
		fmt.Fprintf(status, "close inherited descriptors: %v", err)
		return 127
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(status, format, a...)
		return 127
	}
	limits, err := decodeLimits(args[1])
	if err != nil {
		return fail("%v", err)
	}
	var pol initPolicy
	if err := json.Unmarshal([]byte(args[2]), &pol); err != nil {
		return fail("bad policy: %v", err)
	}
	if pol.WaitFD > 0 {
		// The server moves this process into the run's cgroups, then writes
		// one byte (or closes the pipe if it could not).
		var b [1]byte
		wait := os.NewFile(uintptr(pol.WaitFD), "wait")
		if n, _ := wait.Read(b[:]); n != 1 {
			return fail("the server did not let the run start")
		}
		wait.Close()
	}
	prog := args[4:]
	path, err := lookPath(prog[0], os.Getenv("PATH"))
	if err != nil {
		return fail("%v", err)
	}
	if err := limits.apply(); err != nil {
		return fail("%v", err)
	}
	if pol.UID > 0 {
		if err := dropTo(pol.UID); err != nil {
			return fail("%v", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail("no_new_privs: %v", err)
	}
	if pol.Landlock {
		if err := applyLandlock(&pol); err != nil {
			return fail("%v", err)
		}
	}
	if pol.Seccomp {
		if err := installSeccomp(); err != nil {
			return fail("%v", err)
		}
	}
	status.Write([]byte{readyByte})
	err = syscall.Exec(path, prog, os.Environ())
	// Too late for a start error: say it the way a shell would.
	fmt.Fprintf(os.Stderr, "quro sandbox: exec %s: %v\n", path, err)
	if errors.Is(err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// dropTo makes uid the process's only identity (all threads).
func dropTo(uid int) error {
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresgid %d: %w", uid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	return nil
}

// closeFrom marks every descriptor >= fd close-on-exec.
func closeFrom(fd int) error {
	err := unix.CloseRange(uint(fd), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Kernels before 5.11: walk /proc/self/fd.
	entries, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("close_range: %v; /proc/self/fd: %v", err, rerr)
	}
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= fd {
			syscall.CloseOnExec(n)
		}
	}
	return nil
}

// lookPath finds file in the sandbox's PATH (not the server's).
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		if err := executable(file); err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		return file, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w in PATH %s", file, exec.ErrNotFound, path)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("not an executable file")
	}
	return nil
}

// LookPath reports where the sandbox would find file, using the sandbox PATH.
func (s *Sandbox) LookPath(file string) (string, error) { return lookPath(file, s.path) }
