package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// Waiting for a process to end without holding an OS thread.
//
// os/exec's Wait blocks in waitid(2) on the thread that calls it, and the
// Go runtime never ends an idle thread: a server that waited on a
// thousand processes at once (a session box each, or a thousand live
// one-shot runs) kept a thousand threads, and their stacks, for the rest
// of its life. Here each started process's pidfd is registered in the
// runtime's poller instead: the waiting goroutine parks until the kernel
// reports the process ended (a pidfd polls readable then), and only then
// does Cmd.Wait reap it, at once.
//
// Nothing here ends a thread: the thread that forked a child must outlive
// it (Pdeathsig, see startInside).

// exitWatch is a started process's pidfd, or nil when the kernel has none
// (before Linux 5.3) or it could not be registered in the poller: then
// waiting falls back to Cmd.Wait alone.
type exitWatch struct{ f *os.File }

// askPidfd makes cmd's start also return a pidfd of the child, into *fd
// (-1 when the kernel gives none). The caller owns it after a successful
// Start: watchExit takes it; on a failed Start it is closed already.
func askPidfd(cmd *exec.Cmd, fd *int) {
	*fd = -1
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.PidFD = fd
}

// watchExit takes the pidfd askPidfd asked for, once Start succeeded.
func watchExit(fd int) *exitWatch {
	if fd < 0 {
		return nil
	}
	// The poller only takes a descriptor in non-blocking mode.
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil
	}
	return &exitWatch{f: os.NewFile(uintptr(fd), "pidfd")}
}

// wait parks the calling goroutine until the process has ended (it is a
// zombie, ready to be reaped), then closes the pidfd. Without a pidfd, or
// when the poller cannot take it, it returns at once and the caller's
// Cmd.Wait blocks as before.
func (w *exitWatch) wait() {
	if w == nil {
		return
	}
	defer w.f.Close()
	w.ended()
}

// ended parks the calling goroutine until the process has ended (true),
// or the poll failed or the pidfd was closed (false).
func (w *exitWatch) ended() bool {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return false
	}
	// Read runs the function when the poller says the descriptor may be
	// readable (and once first); false parks until the next edge. An
	// exit that comes between the check and the park is not lost: the
	// descriptor was registered before, so its edge marks it ready.
	// Closing the file wakes it with an error.
	ended := false
	_ = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == syscall.EINTR {
				continue
			}
			// Ended (POLLIN), or the poll failed (then Cmd.Wait decides).
			ended = err == nil && n > 0
			return err != nil || n > 0
		}
	})
	return ended
}

// WatchPid calls exited once the process pid (in the server's numbering)
// has ended — a zombie its parent has not reaped counts — watched on a
// pidfd in the runtime's poller, without a thread; a pid that is gone
// already counts as ended. stop ends the watch (the process may live on)
// and returns once exited will not be called. Without pidfds (before
// Linux 5.3) nothing is watched. The caller must know pid is still the
// process it means (e.g. its parent has not reaped it).
func WatchPid(pid int, exited func()) (stop func()) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, syscall.ESRCH) {
		exited()
		return func() {}
	}
	if err != nil {
		return func() {}
	}
	w := &exitWatch{f: os.NewFile(uintptr(fd), "pidfd")}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if w.ended() {
			exited()
		}
	}()
	return func() {
		w.f.Close()
		<-done
	}
}

// waitCmd is cmd.Wait without holding a thread while the process runs.
func waitCmd(cmd *exec.Cmd, w *exitWatch) error {
	w.wait()
	return cmd.Wait()
}
