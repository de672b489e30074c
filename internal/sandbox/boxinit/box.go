package boxinit

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"
)

// BoxArg is the hidden first argument with which the quro binary runs as
// the init (pid 1) of a session box: bubblewrap builds the box once for
// the session's lifetime and execs this as its first and only process.
// It holds no user code and applies no layer to itself; it spawns every
// process of the session on the server's request, through the init child
// (Arg), which applies the layers and execs the program, or, for a policy
// it has started one for, through the box's spawner (SpawnerArg), which
// applied them to itself and fork+execs the program:
//
//	quro __quro_box CTL_FD
//
// CTL_FD is one end of a SOCK_SEQPACKET socket pair whose other end the
// server holds. Messages (see EncodeMsg) in both directions:
//
//	server → box:  MsgSpawn id dir tty argv...   (SCM_RIGHTS: the child's fds 0..n-1)
//	               MsgSignal id signal group
//	               MsgSync token
//	box → server:  MsgStarted id pid [how]       (pid in the box's namespace; how:
//	                                              BySpawner when the spawner started it)
//	               MsgFailed id reason
//	               MsgExited id wait-status
//	               MsgSynced token               (every message before MsgSync is handled:
//	                                              its signals were sent by kill(2), or,
//	                                              for a spawn a spawner is still starting,
//	                                              held and sent when its pid is known)
//
// Every spawned process leads a session of its own (so its process group
// is its pid, and it has no controlling terminal unless tty is "1", when
// fd 0 becomes it). When a spawned process exits, its process group is
// killed before it is reaped, so nothing of a run that stayed in its group
// outlives it and the group's number cannot be reused in between. As pid 1
// the box init also reaps orphans. When the server's end closes, the box
// init exits, and the kernel kills everything in its pid namespace.
const BoxArg = "__quro_box"

// Message kinds of the box protocol.
const (
	MsgSpawn   = 's'
	MsgSignal  = 'k'
	MsgStarted = 'p'
	MsgFailed  = 'f'
	MsgExited  = 'x'
	MsgSync    = 'y'
	MsgSynced  = 'z'
)

// MaxMsg is the largest message either side sends: an argv with the init
// child's policy (Landlock rules, a seccomp program in hex) fits with room.
const MaxMsg = 1 << 20

// MaxMsgFDs is the most descriptors one spawn may carry.
const MaxMsgFDs = 64

// EncodeMsg renders a message: the kind, then each field followed by NUL.
func EncodeMsg(kind byte, fields ...string) []byte {
	n := 1
	for _, f := range fields {
		n += len(f) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, kind)
	for _, f := range fields {
		b = append(b, f...)
		b = append(b, 0)
	}
	return b
}

// DecodeMsg splits a message into its kind and fields.
func DecodeMsg(b []byte) (kind byte, fields []string, err error) {
	if len(b) < 1 {
		return 0, nil, errors.New("empty message")
	}
	kind, b = b[0], b[1:]
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i == len(b) {
			return 0, nil, errors.New("unterminated field")
		}
		fields = append(fields, string(b[:i]))
		b = b[i+1:]
	}
	return kind, fields, nil
}

const (
	pAll         = 0
	wNoWait      = 0x1000000
	prSetDumpabl = 4
)

type boxInit struct {
	ctl  int
	self string // the quro binary in the box (for spawners)
	// spawners by policy (see spawnPlan); unfit: policies a spawner
	// could not apply to itself (their spawns go the init child's way).
	spawners  map[string]*spawner
	unfit     map[string]bool
	lastSpawn uint64
	// pending counts spawns a spawner is starting: until its answer, the
	// reaper leaves a child it does not know alone (it may be that
	// spawn's program, whose pid is not yet recorded); pendingDone is
	// signalled as each ends.
	pending     int
	pendingDone *sync.Cond
	// spawnerPids: every spawner not yet reaped (let go or not);
	// forking is held while one is started and recorded (killStrays).
	spawnerPids map[int]bool
	forking     sync.Mutex
	mu          sync.Mutex
	byID        map[string]int // id → pid of a spawned process not yet reaped
	// held: the signals for a spawn a spawner is starting (its id in
	// the map from the request on), sent when its pid is recorded: the
	// server may signal a spawn before its answer (a caller gone), and
	// the loop no longer waits for the spawner's answer to handle it.
	held map[string][]heldSignal
	ids  map[int]string // pid → id
	kick chan struct{}  // a process was spawned: the reaper may have children again
	send sync.Mutex
}

func boxMain(args []string) int {
	if len(args) != 1 {
		os.Stderr.WriteString("quro box: bad arguments\n")
		return 127
	}
	ctl, err := strconv.Atoi(args[0])
	if err != nil || ctl < 3 {
		os.Stderr.WriteString("quro box: bad control fd\n")
		return 127
	}
	// Nothing spawned inherits the control socket or anything else of
	// this process's: ForkExec passes only the fds a spawn names.
	if err := closeFrom(ctl); err != nil {
		os.Stderr.WriteString("quro box: close inherited descriptors: " + err.Error() + "\n")
		return 127
	}
	// Not dumpable: no process of the box (another uid anyway) may open
	// its /proc files, ptrace it or take its descriptors.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpabl, 0, 0); errno != 0 {
		os.Stderr.WriteString("quro box: prctl(PR_SET_DUMPABLE, 0): " + errno.Error() + "\n")
		return 127
	}
	b := newBoxInit(ctl, os.Args[0])
	go b.reap()
	buf := make([]byte, MaxMsg)
	oob := make([]byte, syscall.CmsgSpace(MaxMsgFDs*4))
	var heap heapBound
	for {
		n, oobn, _, _, err := syscall.Recvmsg(ctl, buf, oob, syscall.MSG_CMSG_CLOEXEC)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			// The server is gone or let the box go: so does everything in it.
			return 0
		}
		var fds []int
		if oobn > 0 {
			if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range msgs {
					if f, err := syscall.ParseUnixRights(&m); err == nil {
						fds = append(fds, f...)
					}
				}
			}
		}
		kind, fields, err := DecodeMsg(buf[:n])
		if err != nil {
			closeAll(fds)
			continue
		}
		switch kind {
		case MsgSpawn:
			b.spawn(buf[:n], fields, fds)
			heap.after(n)
		case MsgSignal:
			closeAll(fds)
			b.signal(fields)
		case MsgSync:
			// Messages are handled in order, each signal by kill(2)
			// before the next is read: the server's signals before
			// this one have all been sent.
			closeAll(fds)
			if len(fields) == 1 {
				b.reply(MsgSynced, fields[0])
			}
		default:
			closeAll(fds)
		}
	}
}

func newBoxInit(ctl int, self string) *boxInit {
	b := &boxInit{ctl: ctl, self: self, spawners: map[string]*spawner{}, unfit: map[string]bool{}, spawnerPids: map[int]bool{},
		byID: map[string]int{}, ids: map[int]string{}, held: map[string][]heldSignal{}, kick: make(chan struct{}, 1)}
	b.pendingDone = sync.NewCond(&b.mu)
	return b
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

func (b *boxInit) reply(kind byte, fields ...string) {
	b.send.Lock()
	defer b.send.Unlock()
	// A reply that cannot be sent has no one to read it: the server is
	// gone, and the next Recvmsg ends the box.
	_ = syscall.Sendmsg(b.ctl, EncodeMsg(kind, fields...), nil, nil, 0)
}

// replyUnlocking sends a reply that must reach the server before any
// reply the reaper sends once it can take b.mu (a spawn's Started before
// its Exited), without holding b.mu through the send: called with b.mu
// held, it takes the sender's lock, lets go of b.mu, then sends. A slow
// reader of the control socket then holds back the other replies only,
// never the spawns, signals and reaping that need b.mu.
func (b *boxInit) replyUnlocking(kind byte, fields ...string) {
	b.send.Lock()
	b.mu.Unlock()
	defer b.send.Unlock()
	_ = syscall.Sendmsg(b.ctl, EncodeMsg(kind, fields...), nil, nil, 0)
}

// spawn: id, dir, tty, argv... The box's spawner for the spawn's policy
// starts it when there is one; else the init child is forked and exec'd
// here, and a spawner for that policy started after the answer.
func (b *boxInit) spawn(msg []byte, f []string, fds []int) {
	if len(f) < 4 {
		closeAll(fds)
		if len(f) > 0 {
			b.reply(MsgFailed, f[0], "bad spawn request")
		}
		return
	}
	id, dir, tty, argv := f[0], f[1], f[2] == "1", f[3:]
	key, _, status, keyed := spawnPlan(argv, len(fds))
	if keyed {
		b.mu.Lock()
		sp := b.spawners[key]
		if sp != nil && !sp.busy {
			sp.busy = true
			b.pending++
			b.lastSpawn++
			sp.used = b.lastSpawn // in use: not let go idle meanwhile
			b.held[id] = nil
			b.mu.Unlock()
			// The request as the spawner reads it: the kind, then the
			// fields after the id. Answered on a goroutine of its own:
			// this loop goes on with the server's next messages (its
			// signals, other spawns) whatever the spawner does.
			req := append([]byte{MsgSpawn}, msg[2+len(id):]...)
			go func() {
				if !b.viaSpawner(sp, id, req, fds, status) {
					b.spawnByInit(id, dir, tty, argv, fds, "")
				}
				b.mu.Lock()
				delete(b.held, id) // a spawn that failed: its signals had no process
				b.mu.Unlock()
			}()
			return
		}
		// No spawner for this policy, or it is busy with another spawn
		// (one at a time): the init child's way.
		b.mu.Unlock()
	}
	if !keyed {
		key = ""
	}
	b.spawnByInit(id, dir, tty, argv, fds, key)
}

// spawnByInit starts spawn id the init child's way: forked and exec'd
// here. key: the policy to start a spawner for after the answer ("" for
// none).
func (b *boxInit) spawnByInit(id, dir string, tty bool, argv []string, fds []int, key string) {
	files := make([]uintptr, len(fds))
	for i, fd := range fds {
		files[i] = uintptr(fd)
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: syscall.Environ(), Files: files,
		Sys: &syscall.SysProcAttr{Setsid: true, Setctty: tty && len(fds) > 0, Ctty: 0}}
	b.mu.Lock()
	pid, err := syscall.ForkExec(argv[0], argv, attr)
	// The child has its descriptors: this process lets go of its copies
	// at once, so that the server sees the end of the output when the
	// program closes its ends, not when the spawner is up.
	closeAll(fds)
	if err != nil {
		b.mu.Unlock()
		b.reply(MsgFailed, id, "spawn "+argv[0]+": "+err.Error())
		return
	}
	b.byID[id], b.ids[pid] = pid, id
	b.sendHeld(id, pid)
	select {
	case b.kick <- struct{}{}:
	default:
	}
	// Started before the reaper, which needs b.mu to name the program,
	// can report its exit: a program that ends at once still has its
	// pid told to the server, which knows the spawn until its Exited.
	b.replyUnlocking(MsgStarted, id, strconv.Itoa(pid))
	// The spawner for the next spawns of this policy, after this one's
	// answer, and without b.mu: its fork and exec take milliseconds (tens
	// on a loaded machine), and the reaper, which reports the end of a
	// short program, must not wait for them.
	if key != "" {
		b.startSpawner(key)
	}
}

// signal: id, signal, group ("1": the process's group).
func (b *boxInit) signal(f []string) {
	if len(f) != 3 {
		return
	}
	sig, err := strconv.Atoi(f[1])
	if err != nil || sig <= 0 || sig > 64 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Only a process not yet reaped: its pid, and its group's, are still
	// its own.
	pid, ok := b.byID[f[0]]
	if !ok {
		if held, starting := b.held[f[0]]; starting {
			b.held[f[0]] = append(held, heldSignal{sig, f[2] == "1"})
		}
		return
	}
	kill(pid, heldSignal{sig, f[2] == "1"})
}

// heldSignal is a signal for a spawn (see boxInit.held).
type heldSignal struct {
	sig   int
	group bool // to the process's group
}

// sendHeld sends spawn id's held signals to its process pid, just
// recorded. b.mu is held.
func (b *boxInit) sendHeld(id string, pid int) {
	for _, h := range b.held[id] {
		kill(pid, h)
	}
	delete(b.held, id)
}

func kill(pid int, h heldSignal) {
	if h.group {
		// A process that has not made its group yet (a signal right
		// after its spawn, before its setsid): the process itself.
		if err := syscall.Kill(-pid, syscall.Signal(h.sig)); errors.Is(err, syscall.ESRCH) {
			syscall.Kill(pid, syscall.Signal(h.sig))
		}
	} else {
		syscall.Kill(pid, syscall.Signal(h.sig))
	}
}

// reap waits for every child: a spawned one's group is killed, then it is
// reaped and its status reported; orphans that pid 1 inherits are reaped.
func (b *boxInit) reap() {
	for {
		// siginfo_t: si_signo, si_errno, si_code (int32 each), padding,
		// then si_pid at offset 16 on 64-bit Linux.
		var info [128]byte
		_, _, errno := syscall.Syscall6(sysWaitidNum, pAll, 0, uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNoWait, 0, 0)
		switch errno {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.ECHILD:
			<-b.kick
			continue
		default:
			return
		}
		pid := int(*(*int32)(unsafe.Pointer(&info[16])))
		b.mu.Lock()
		// A child not known while a spawner is starting a program may be
		// that program: wait for the spawner's answer (an orphan waits
		// as long, a spawn's round trip).
		for b.pending > 0 && b.ids[pid] == "" {
			b.pendingDone.Wait()
		}
		for _, sp := range b.spawners {
			if sp.pid == pid {
				// The spawner ended (it retired or was killed).
				b.dropSpawner(sp)
				break
			}
		}
		delete(b.spawnerPids, pid)
		id, spawned := b.ids[pid]
		if spawned {
			delete(b.ids, pid)
			delete(b.byID, id)
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if err != syscall.EINTR {
				break
			}
		}
		b.mu.Unlock()
		if spawned {
			b.reply(MsgExited, id, strconv.Itoa(int(ws)))
		}
	}
}
