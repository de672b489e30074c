package boxinit

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// SpawnerArg is the argument that makes quro a box's spawner: an init
// child made long-lived. The box init starts one for a policy once a
// spawn with that policy went the init child's way; the spawner takes the
// first request it is handed, applies to itself, once, every layer that
// a fork and an exec keep — the rlimits, no_new_privs, Landlock (on the
// thread that forks), seccomp (every thread) — and from then on starts
// each program of that policy by fork+exec (package syscall's ForkExec:
// no Go code runs in the child) with what is the spawn's own: its new
// session, terminal, descriptors, environment and the switch to the
// session's uid (SysProcAttr.Credential). It forks with CLONE_PARENT, so
// every program is the box init's child, reaped and reported by it as
// before; it answers the box init with the program's pid and a pidfd of
// it, which the box init hands the server on the spawn's status socket
// (the server reads the program's host pid from it). It stays the box's
// root with the box init's capabilities (the box's programs, another uid,
// can neither signal nor trace it; it is not dumpable), holds nothing but
// its socket pair with the box init, and exits when the box init closes
// that (unused for spawnerIdle, or the box ends) or once it has used half
// the CPU seconds its policy's RLIMIT_CPU allows (it carries that limit:
// its programs inherit it).
//
//	quro __quro_spawner SOCK_FD
//
// Requests are MsgSpawn without the id (dir, tty, argv — the init child's
// argv — and the descriptors). Answers: spawnedOK pid last (SCM_RIGHTS: a
// pidfd of the program; last "1": the spawner exits now), spawnFailed
// reason (the program did not start; what the init child would have
// written on the status socket), spawnerUnfit reason (the spawner cannot
// serve this request: the box init starts the program the init child's
// way).
const SpawnerArg = "__quro_spawner"

// BySpawner is the third field of a MsgStarted for a program the box's
// spawner started.
const BySpawner = "spawner"

// Answers of a spawner.
const (
	spawnedOK    = 'p'
	spawnFailed  = 'f'
	spawnerUnfit = 'e'
)

// spawnerIdle is how long a box keeps an unused spawner; maxSpawners how
// many policies a box keeps one for (the least recently used is let go).
const (
	spawnerIdle = 30 * time.Second
	maxSpawners = 4
)

type spawner struct {
	key  string
	pid  int
	sock int // the box init's end
	used uint64
	// busy: a spawn is at the spawner (one at a time; the box's other
	// spawns of its policy go the init child's way meanwhile). gone: let
	// go; a busy spawner's socket is closed when its spawn is answered.
	busy, gone bool
}

// spawnPlan is what a spawner needs of an init child's argv
// (quro Arg STATUS_FD LIMITS POLICY -- PROGRAM...): the key of its policy
// (the limits and the policy but its env_fd, which differ per spawn only
// in number), the policy, and the status fd's number. ok is false for a
// spawn the spawner's way cannot serve: one that waits for the server's
// go-ahead (a cgroup join of its own), or a malformed one.
func spawnPlan(argv []string, nfds int) (key string, pol *Policy, status int, ok bool) {
	if len(argv) < 7 || argv[1] != Arg || argv[5] != "--" {
		return "", nil, 0, false
	}
	status, err := strconv.Atoi(argv[2])
	if err != nil || status < 3 || status >= nfds {
		return "", nil, 0, false
	}
	pol, err = DecodePolicy(argv[4])
	if err != nil || pol.WaitFD != 0 || pol.EnvFD < 0 || pol.EnvFD >= nfds || (pol.EnvFD > 0 && pol.EnvFD <= status) {
		return "", nil, 0, false
	}
	envFD := pol.EnvFD
	pol.EnvFD = 0
	key = argv[3] + "\x00" + pol.Encode()
	pol.EnvFD = envFD
	return key, pol, status, true
}

// startSpawner starts a spawner for key if the box has none and may.
// Called without b.mu from the goroutine that reads the server's
// messages (the only one that adds spawners).
func (b *boxInit) startSpawner(key string) {
	b.mu.Lock()
	have := b.spawners[key] != nil || b.unfit[key]
	b.mu.Unlock()
	if have || b.self == "" {
		return
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	attr := &syscall.ProcAttr{Dir: "/", Env: syscall.Environ(), Files: []uintptr{0, 1, 2, uintptr(pair[1])}}
	// b.forking: killStrays does not take the new spawner for a stray
	// before its pid is recorded.
	b.forking.Lock()
	pid, err := syscall.ForkExec(b.self, []string{b.self, SpawnerArg, "3"}, attr)
	syscall.Close(pair[1])
	if err != nil {
		b.forking.Unlock()
		syscall.Close(pair[0])
		return
	}
	sp := &spawner{key: key, pid: pid, sock: pair[0]}
	b.mu.Lock()
	b.spawnerPids[pid] = true
	b.forking.Unlock()
	if len(b.spawners) >= maxSpawners {
		var lru *spawner
		for _, s := range b.spawners {
			if lru == nil || s.used < lru.used {
				lru = s
			}
		}
		b.dropSpawner(lru)
	}
	b.spawners[key] = sp
	b.armSpawnerIdle(sp)
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// armSpawnerIdle marks sp used now and lets it go after spawnerIdle
// without another use. Called with b.mu held.
func (b *boxInit) armSpawnerIdle(sp *spawner) {
	b.lastSpawn++
	sp.used = b.lastSpawn
	n := sp.used
	time.AfterFunc(spawnerIdle, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if sp.used == n {
			b.dropSpawner(sp)
		}
	})
}

// dropSpawner lets sp go: its socket closed, it exits (the reaper reaps
// it). Called with b.mu held.
func (b *boxInit) dropSpawner(sp *spawner) {
	if sp == nil || sp.gone {
		return
	}
	if b.spawners[sp.key] == sp {
		delete(b.spawners, sp.key)
	}
	sp.gone = true
	if !sp.busy {
		syscall.Close(sp.sock)
	}
}

// spawnerStall is how long the box init waits for a spawner's answer
// before it looks for the spawn's child stopped before its exec.
const spawnerStall = time.Second

// viaSpawner starts the spawn id (req as the spawner reads it, fds the
// program's descriptors) through sp. handled is false when sp could not
// take it, with nothing started: the caller starts it the init child's
// way. Otherwise the spawn is answered (Started or Failed), its status
// socket written and fds closed. Called without b.mu, on a goroutine of
// its own, with sp marked busy and b.pending counted for this spawn (the
// reaper leaves children it does not know alone until the spawner's
// answer is in).
//
// A spawn's child can be stalled before its exec: between its switch to
// the session's uid and the exec, a program of the session may stop it
// (SIGSTOP), and the spawner, which waits for the exec, with it. While
// the answer does not come, every spawnerStall the box init kills such a
// child (killStalled); the spawner then answers, and the spawn ends as a
// program killed by SIGKILL. If the spawner ends without an answer (it
// was killed: the box's memory limit, its CPU limit), the program it may
// have started is killed (killStrays): no process of the box runs that
// the server does not know of.
func (b *boxInit) viaSpawner(sp *spawner, id string, req []byte, fds []int, status int) (handled bool) {
	since := bootTicks()
	done := func() {
		sp.busy = false
		if sp.gone {
			syscall.Close(sp.sock)
		}
		b.pending--
		b.pendingDone.Broadcast()
	}
	if err := syscall.Sendmsg(sp.sock, req, syscall.UnixRights(fds...), nil, 0); err != nil {
		// The spawner is gone (it died, or was let go): it has read
		// nothing.
		b.mu.Lock()
		b.dropSpawner(sp)
		done()
		b.mu.Unlock()
		return false
	}
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4))
	var n, oobn int
	var err error
	for !readable(sp.sock, spawnerStall) {
		b.killStalled(sp, since)
	}
	for {
		n, oobn, _, _, err = syscall.Recvmsg(sp.sock, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err != syscall.EINTR {
			break
		}
	}
	var pidfd = -1
	if err == nil && oobn > 0 {
		if msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				if f, perr := syscall.ParseUnixRights(&m); perr == nil {
					for _, fd := range f {
						if pidfd < 0 {
							pidfd = fd
						} else {
							syscall.Close(fd)
						}
					}
				}
			}
		}
	}
	kind, f, derr := DecodeMsg(buf[:n])
	b.mu.Lock()
	switch {
	case err != nil || n == 0 || derr != nil:
		// The spawner ended with the request read: whether it started
		// the program is not known, so it is not started again, and a
		// program it started is killed before the reaper may reap it
		// (b.pending still counts this spawn).
		b.dropSpawner(sp)
		b.mu.Unlock()
		b.killStrays(since, "")
		b.mu.Lock()
		done()
		b.mu.Unlock()
		b.spawnerFailed(id, fds, status, pidfd, "the box's spawner ended while it started the program")
		return true
	case kind == spawnerUnfit:
		b.unfit[sp.key] = true
		b.dropSpawner(sp)
		done()
		b.mu.Unlock()
		if pidfd >= 0 {
			syscall.Close(pidfd)
		}
		return false
	case kind == spawnedOK && len(f) == 2 && pidfd >= 0:
		pid, perr := strconv.Atoi(f[0])
		if perr != nil || pid <= 0 {
			break
		}
		b.byID[id], b.ids[pid] = pid, id
		if f[1] == "1" {
			b.dropSpawner(sp)
		} else {
			b.armSpawnerIdle(sp)
		}
		done()
		b.sendHeld(id, pid) // signals the server sent while the spawner worked
		// Started before the reaper, which needs b.mu to name the
		// program, can report its exit: the server learns how it
		// started while it still knows the spawn. Sent without b.mu.
		b.replyUnlocking(MsgStarted, id, strconv.Itoa(pid), BySpawner)
		// The status socket: ReadyByte, as the init child writes it, and
		// the program's pidfd, which names its host pid to the server
		// (the writer's own credentials would name the box init).
		_ = syscall.Sendmsg(fds[status], []byte{ReadyByte}, syscall.UnixRights(pidfd), nil, 0) // a server that went away learns nothing either way
		syscall.Close(pidfd)
		closeAll(fds)
		select {
		case b.kick <- struct{}{}:
		default:
		}
		return true
	case kind == spawnFailed && len(f) == 1:
		b.armSpawnerIdle(sp)
		done()
		b.mu.Unlock()
		b.spawnerFailed(id, fds, status, pidfd, f[0])
		return true
	}
	// An answer the spawner does not give (a pid without its pidfd: the
	// server could not learn the host pid): let it go, and end a program
	// it names (the init's child, not reaped while this answer was
	// pending).
	if kind == spawnedOK && len(f) == 2 {
		if pid, perr := strconv.Atoi(f[0]); perr == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	b.dropSpawner(sp)
	done()
	b.mu.Unlock()
	b.spawnerFailed(id, fds, status, pidfd, "the box's spawner gave a malformed answer")
	return true
}

// spawnerFailed answers a spawn the spawner did not start as an init
// child that could not exec answers it: the reason on the status socket,
// and the spawn failed.
func (b *boxInit) spawnerFailed(id string, fds []int, status, pidfd int, reason string) {
	if pidfd >= 0 {
		syscall.Close(pidfd)
	}
	_, _ = syscall.Write(fds[status], []byte(reason)) // the server reads it as the reason; if it is gone, so is the reader
	closeAll(fds)
	b.reply(MsgFailed, id, reason)
}

// spawnerMain serves spawn requests on the socket SOCK_FD until the box
// init closes it.
func spawnerMain(args []string) int {
	// Every layer is applied on this thread and every fork is made from
	// it: the goroutine stays on it.
	runtime.LockOSThread()
	if len(args) != 1 {
		return 127
	}
	sock, err := strconv.Atoi(args[0])
	if err != nil || sock < 3 {
		return 127
	}
	// Its socket and anything else inherited closes at every exec: a
	// program gets the descriptors its request names and nothing else.
	if err := closeFrom(sock); err != nil {
		return 127
	}
	// Not dumpable: no process of the box may open its /proc files,
	// ptrace it or take its descriptors.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpabl, 0, 0); errno != 0 {
		return 127
	}
	answer := func(kind byte, fds []int, fields ...string) bool {
		return syscall.Sendmsg(sock, EncodeMsg(kind, fields...), syscall.UnixRights(fds...), nil, 0) == nil
	}
	var key string
	var cpuLimit uint64 // seconds; 0: none
	buf := make([]byte, MaxMsg)
	oob := make([]byte, syscall.CmsgSpace(MaxMsgFDs*4))
	var heap heapBound
	for {
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
		var fds []int
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if f, err := syscall.ParseUnixRights(&m); err == nil {
					fds = append(fds, f...)
				}
			}
		}
		kind, f, err := DecodeMsg(buf[:n])
		if err != nil || kind != MsgSpawn || len(f) < 3 {
			closeAll(fds)
			answer(spawnerUnfit, nil, "bad request")
			continue
		}
		dir, tty, argv := f[0], f[1] == "1", f[2:]
		k, pol, status, ok := spawnPlan(argv, len(fds))
		if ok && key == "" {
			// The first request: this spawner's policy, applied to
			// itself once.
			if err := restrictSpawner(argv[3], pol); err != nil {
				closeAll(fds)
				answer(spawnerUnfit, nil, err.Error())
				return 0
			}
			key = k
			var lim syscall.Rlimit
			if syscall.Getrlimit(syscall.RLIMIT_CPU, &lim) == nil && lim.Cur != ^uint64(0) {
				cpuLimit = lim.Cur
			}
		}
		if !ok || k != key {
			closeAll(fds)
			answer(spawnerUnfit, nil, "not this spawner's policy")
			continue
		}
		pid, pidfd, reason := spawnOne(dir, tty, argv[6:], pol, status, fds)
		closeAll(fds)
		if reason != "" {
			if !answer(spawnFailed, nil, reason) {
				return 0
			}
			continue
		}
		last := cpuLimit > 0 && 2*cpuUsed() >= cpuLimit*1e6
		l := "0"
		if last {
			l = "1"
		}
		sent := answer(spawnedOK, []int{pidfd}, strconv.Itoa(pid), l)
		syscall.Close(pidfd)
		if !sent || last {
			return 0
		}
		heap.after(n) // after the answer: the spawn waits for no collection
	}
}

// restrictSpawner applies to the spawner the layers its programs inherit
// through fork and exec, in the init child's order but for the uid switch
// (made in each child: the spawner stays the box's root, out of reach of
// the box's processes).
func restrictSpawner(limits string, pol *Policy) error {
	if err := applyLimits(limits); err != nil {
		return err
	}
	if pol.UID > 0 {
		// No supplementary group for the lookups (lookPathAs), as the
		// init child had none after its switch (this thread's: each
		// child sets its own, none, again).
		if _, _, errno := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
			return errors.New("setgroups: " + errno.Error())
		}
	}
	if err := noNewPrivs(); err != nil {
		return err
	}
	if pol.LLFS != 0 {
		// This thread's: it is the one that forks.
		if err := applyLandlock(pol); err != nil {
			return err
		}
	}
	if len(pol.Seccomp) > 0 {
		// Every thread's (TSYNC, which also sets no_new_privs on each).
		if err := installSeccomp(pol.Seccomp); err != nil {
			return err
		}
	}
	return nil
}

// spawnOne starts prog as the init child would have: in dir, with the
// environment of the request's env fd, fds[:status] as its descriptors 0..,
// a session of its own (tty: fd 0 its controlling terminal), the policy's
// uid. It returns the program's pid (in the box) and a pidfd of it, or the
// reason it did not start.
func spawnOne(dir string, tty bool, prog []string, pol *Policy, status int, fds []int) (pid, pidfd int, reason string) {
	var env []string
	if pol.EnvFD > 0 {
		var err error
		env, err = readEnv(fds[pol.EnvFD]) // closes it
		fds[pol.EnvFD] = -1
		if err != nil {
			return 0, -1, err.Error()
		}
	}
	// The directory is entered here, as the box's root, as the init
	// child is put in it before it switches uid; the program inherits
	// it. (Requests come one at a time: the spawner's own directory is
	// nobody else's.)
	if err := syscall.Chdir(dir); err != nil {
		return 0, -1, "chdir " + dir + ": " + err.Error()
	}
	path, err := lookPathAs(pol.UID, prog[0], lookupEnv(env, "PATH"))
	if err != nil {
		return 0, -1, LookupFailure(err)
	}
	files := make([]uintptr, status)
	for i := range files {
		files[i] = uintptr(fds[i])
	}
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: tty && status > 0, Ctty: 0, Cloneflags: syscall.CLONE_PARENT}
	if pol.UID > 0 {
		id := uint32(pol.UID)
		sys.Credential = &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}
	}
	pid, err = syscall.ForkExec(path, prog, &syscall.ProcAttr{Env: env, Files: files, Sys: sys})
	if err != nil {
		return 0, -1, "exec " + path + ": " + err.Error()
	}
	// The program is the box init's child, and the box init reaps none
	// it does not know until this answer is in: the pid is still the
	// program's.
	r, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		return 0, -1, "pidfd_open: " + errno.Error()
	}
	return pid, int(r), ""
}

// lookPathAs is LookPath as uid looks (the init child looked after its
// uid switch): for the lookup this thread's effective (and so filesystem)
// uid and gid are uid's, with no capability in effect, then the box
// root's again (its saved ids; the permitted capabilities come back into
// effect). Only this thread's: it is the one that forks. A spawner that
// could not come back exits: it must not fork as anyone else.
func lookPathAs(uid int, file, path string) (string, error) {
	if uid <= 0 {
		return LookPath(file, path)
	}
	const keep = ^uintptr(0) // -1: unchanged
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, uintptr(uid), keep); errno != 0 {
		return "", errors.New("setresgid " + strconv.Itoa(uid) + ": " + errno.Error())
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); errno != 0 {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, 0, keep); errno != 0 {
			syscall.Exit(127)
		}
		return "", errors.New("setresuid " + strconv.Itoa(uid) + ": " + errno.Error())
	}
	p, err := LookPath(file, path)
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, 0, keep); errno != 0 {
		syscall.Exit(127)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, 0, keep); errno != 0 {
		syscall.Exit(127)
	}
	return p, err
}

// cpuUsed is the spawner's own CPU time in microseconds.
func cpuUsed() uint64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return uint64((ru.Utime.Sec+ru.Stime.Sec)*1e6 + ru.Utime.Usec + ru.Stime.Usec)
}

// readable waits up to d for fd to be readable (or closed by its peer).
func readable(fd int, d time.Duration) bool {
	pfd := struct {
		fd             int32
		events, revent int16
	}{fd: int32(fd), events: 0x1} // POLLIN
	ts := syscall.NsecToTimespec(int64(d))
	for {
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			return true // the read that follows says what is wrong
		}
		return n > 0
	}
}

// bootTicks is the time since boot in clock ticks (USER_HZ, 100 on
// Linux), the unit of a process's start time in /proc/PID/stat; in the
// box's time namespace, as /proc shows it to the box init.
func bootTicks() uint64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0
	}
	return uint64(ts.Sec)*100 + uint64(ts.Nsec)/1e7
}

const clockBoottime = 7

// procStat is what killStrays reads of /proc/PID/stat.
type procStat struct {
	comm  string
	state byte
	ppid  int
	start uint64 // clock ticks after boot
}

func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid ... starttime is the 20th field after comm;
	// comm may hold spaces and parentheses.
	i, j := -1, -1
	for k, c := range b {
		if c == '(' && i < 0 {
			i = k
		} else if c == ')' {
			j = k
		}
	}
	if i < 0 || j < i {
		return procStat{}, false
	}
	var f []string
	for k := j + 1; k < len(b) && len(f) < 20; {
		for k < len(b) && (b[k] == ' ' || b[k] == '\n') {
			k++
		}
		e := k
		for e < len(b) && b[e] != ' ' && b[e] != '\n' {
			e++
		}
		if e > k {
			f = append(f, string(b[k:e]))
		}
		k = e
	}
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{comm: string(b[i+1 : j]), state: f[0][0], ppid: ppid, start: start}, true
}

// killStalled kills a child of sp's spawn that is stopped before its exec
// (see viaSpawner): a child of the box init it does not know, begun since
// the spawn's request (since), still under the spawner's name.
func (b *boxInit) killStalled(sp *spawner, since uint64) {
	st, ok := readProcStat(sp.pid)
	if !ok {
		return // the spawner is gone: its answer, or the end of its socket, is on the way
	}
	b.killStrays(since, st.comm)
}

// killStrays kills, with their process groups, the box init's children it
// does not know (neither a spawned process nor a spawner) that began at
// or after since (clock ticks after boot): the program of a spawn whose
// spawner did not answer. comm != "": only those stopped (a signal, a
// tracer) still under the spawner's name comm, before their exec. Called
// without b.mu, with b.pending counting the spawn: the reaper reaps none
// of them meanwhile, so each pid is still the process read. An orphan of
// the session reparented to the box init that began in the same interval
// (and, with comm, is stopped and so named) is killed too: the session's
// own process, in a spawn the session stalled or whose spawner died.
func (b *boxInit) killStrays(since uint64, comm string) {
	b.forking.Lock()
	defer b.forking.Unlock()
	d, err := os.Open("/proc")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 1 {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok || st.ppid != 1 || st.start < since {
			continue
		}
		if comm != "" && (st.comm != comm || (st.state != 'T' && st.state != 't')) {
			continue
		}
		// Checked and killed under b.mu: a spawn recorded in between (a
		// program of another spawner, just answered) is not killed as
		// the stray it was a moment before.
		b.mu.Lock()
		if b.ids[pid] == "" && !b.spawnerPids[pid] {
			syscall.Kill(-pid, syscall.SIGKILL)
			syscall.Kill(pid, syscall.SIGKILL)
		}
		b.mu.Unlock()
	}
}
