package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Helper is a program the server runs for its own work, outside any box
// and with the server's privileges: the embedded Python's compileall,
// debootstrap, the disk tools of internal/quota (mkfs.ext4, e2fsck,
// resize2fs), the probe of the host's python3.
// It never runs user code. RunHelper is the one way to run one, so that
// like a sandboxed run it gets a process group of its own, killed as a
// whole when ctx ends or when it exits, a parent-death signal, and a
// bounded drain of its output. cmd/quro's
// TestBypassNoProcessStartOutsideTheHelper fails on a process started any
// other way outside the sandbox's own launch of a box.
type Helper struct {
	Path string
	Args []string // without the program name
	Env  []string // the whole environment: nothing of the server's is inherited
	Dir  string   // default "/"
	// Stdin is the helper's standard input (nil: none).
	Stdin io.Reader
	// Stdout and Stderr receive the output; one writer for both is called
	// from one goroutine at a time.
	Stdout, Stderr io.Writer
	// Unprivileged runs the helper as nobody (uid and gid 65534, no
	// supplementary groups) when the server runs as root, so that it has
	// no capability; for a helper that reads hostile input (the esbuild
	// child of internal/transpile).
	Unprivileged bool
	// WaitDelay bounds how long the output is read once the helper exited
	// or was killed (a process that left its group may hold the pipe).
	// Default 5s.
	WaitDelay time.Duration
}

// nobody is the uid and gid of an Unprivileged helper.
const nobody = 65534

// RunHelper runs h and waits for it. When ctx ends the helper's whole
// process group is killed and the error wraps ctx's.
func RunHelper(ctx context.Context, h *Helper) error {
	cmd := exec.CommandContext(ctx, h.Path, h.Args...)
	cmd.Env = h.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = h.Dir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = h.Stdin, h.Stdout, h.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if h.Unprivileged && os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}
	}
	// The group's leader is not reaped before Cancel returns, so its pid
	// still names the group.
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = h.WaitDelay
	if cmd.WaitDelay <= 0 {
		cmd.WaitDelay = 5 * time.Second
	}
	var pidfd int
	askPidfd(cmd, &pidfd)
	err := cmd.Start()
	if err != nil {
		return err
	}
	err = waitCmd(cmd, watchExit(pidfd))
	// What the helper left running in its group (compileall's workers)
	// goes with it.
	_ = killGroup(cmd) // best effort: the group may be gone already (ESRCH)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
