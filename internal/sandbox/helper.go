package sandbox

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Helper is a program the server runs for its own work, outside any box
// and with the server's privileges: the embedded Python's compileall,
// debootstrap, the disk tools of internal/quota (mkfs.ext4, mount,
// losetup, resize2fs, e2fsck, findmnt), the probe of the host's python3.
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
	// Stdout and Stderr receive the output; one writer for both is called
	// from one goroutine at a time.
	Stdout, Stderr io.Writer
	// WaitDelay bounds how long the output is read once the helper exited
	// or was killed (a process that left its group may hold the pipe).
	// Default 5s.
	WaitDelay time.Duration
}

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
	cmd.Stdout, cmd.Stderr = h.Stdout, h.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
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
