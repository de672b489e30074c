package boxinit

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// ZygoteArg is the argument that makes quro a zygote. The zygote: the
// box init keeps one init child started ahead (the quro binary
// re-executed and its Go runtime up) while the box is in use, so
// that a spawn costs a message and the program's own exec instead of an
// exec of quro first. It waits on its own socket pair with the box init
// for one spawn request — the same fields and descriptors as MsgSpawn —
// then becomes that process: a new session, the descriptors in place, the
// directory, the terminal, and the init child's work (initMain) from
// there. A zygote unused for zygoteIdle is let go (its socket closed: it
// exits); the next spawn starts one again.
//
//	quro __quro_zygote SOCK_FD
const ZygoteArg = "__quro_zygote"

// zygoteIdle is how long a box keeps an unused zygote.
const zygoteIdle = 30 * time.Second

type zygote struct {
	pid  int
	sock int // the box init's end
}

// startZygote starts a zygote if the box has none. Called without b.mu,
// from the goroutine that reads the server's messages (the only one that
// sets b.zyg, so no other zygote is started meanwhile). A zygote that
// dies before it is recorded is reaped as an orphan; the spawn handed to
// it then fails to send (its socket's other end is gone) and forks the
// init child itself.
func (b *boxInit) startZygote() {
	b.mu.Lock()
	have := b.zyg != nil
	b.mu.Unlock()
	if have || b.self == "" {
		return
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	attr := &syscall.ProcAttr{Dir: "/", Env: syscall.Environ(), Files: []uintptr{0, 1, 2, uintptr(pair[1])}}
	pid, err := syscall.ForkExec(b.self, []string{b.self, ZygoteArg, "3"}, attr)
	syscall.Close(pair[1])
	if err != nil {
		syscall.Close(pair[0])
		return
	}
	b.mu.Lock()
	b.zyg = &zygote{pid: pid, sock: pair[0]}
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// armZygoteIdle lets the zygote go after zygoteIdle without a spawn.
// Called with b.mu held.
func (b *boxInit) armZygoteIdle() {
	b.lastSpawn++
	n := b.lastSpawn
	time.AfterFunc(zygoteIdle, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.lastSpawn == n && b.zyg != nil {
			syscall.Close(b.zyg.sock)
			b.zyg = nil
		}
	})
}

// handOff gives the spawn request msg (with fds) to the zygote and returns
// its pid, or 0 when there is no zygote or it is gone. Called with b.mu
// held.
func (b *boxInit) handOff(msg []byte, fds []int) int {
	z := b.zyg
	if z == nil {
		return 0
	}
	b.zyg = nil
	err := syscall.Sendmsg(z.sock, msg, syscall.UnixRights(fds...), nil, 0)
	syscall.Close(z.sock)
	if err != nil {
		return 0
	}
	return z.pid
}

func zygoteMain(args []string) int {
	runtime.LockOSThread()
	if len(args) != 1 {
		return 127
	}
	sock, err := strconv.Atoi(args[0])
	if err != nil || sock < 3 {
		return 127
	}
	buf := make([]byte, MaxMsg)
	oob := make([]byte, syscall.CmsgSpace(MaxMsgFDs*4))
	var n, oobn int
	for {
		n, oobn, _, _, err = syscall.Recvmsg(sock, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil || n == 0 {
		return 0 // let go
	}
	syscall.Close(sock)
	var fds []int
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	kind, f, err := DecodeMsg(buf[:n])
	// f: dir, tty, argv (argv[0] the quro binary, argv[1] Arg).
	if err != nil || kind != MsgSpawn || len(f) < 4 || f[3] != Arg || len(fds) == 0 {
		return 127
	}
	dir, tty, argv := f[0], f[1] == "1", f[2:]
	if _, err := syscall.Setsid(); err != nil {
		return 127
	}
	// The descriptors to 0..n-1, as ForkExec would put them: first all
	// at n or above (the lowest free numbers there: growing the
	// descriptor table of a process with threads waits for an RCU grace
	// period, milliseconds), then each in its place (without
	// close-on-exec).
	tmp := make([]int, len(fds))
	for i, fd := range fds {
		nfd, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, uintptr(len(fds)))
		if errno != 0 {
			return 127
		}
		tmp[i] = int(nfd)
		syscall.Close(fd)
	}
	for i, fd := range tmp {
		if err := syscall.Dup3(fd, i, 0); err != nil {
			return 127
		}
		syscall.Close(fd)
	}
	if tty {
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, 0, syscall.TIOCSCTTY, 0); errno != 0 {
			os.Stderr.WriteString("quro sandbox init: controlling terminal: " + errno.Error() + "\n")
			return 127
		}
	}
	if err := syscall.Chdir(dir); err != nil {
		os.Stderr.WriteString("quro sandbox init: chdir " + dir + ": " + err.Error() + "\n")
		return 127
	}
	return initMain(argv[2:])
}
