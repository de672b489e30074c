package sandbox

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg is the hidden first argument with which the quro binary re-executes
// itself as the sandbox's init child. The child applies the limits and then
// execs the user program in its own place, so no Go code of Quro's remains
// in the process that runs user code.
//
// argv: quro __quro_sandbox_init STATUS_FD LIMITS -- PROGRAM ARGS...
const initArg = "__quro_sandbox_init"

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
	if len(args) < 4 || args[2] != "--" {
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
	prog := args[3:]
	path, err := lookPath(prog[0], os.Getenv("PATH"))
	if err != nil {
		return fail("%v", err)
	}
	if err := limits.apply(); err != nil {
		return fail("%v", err)
	}
	err = syscall.Exec(path, prog, os.Environ())
	return fail("exec %s: %v", path, err)
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
