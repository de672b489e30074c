package boxinit

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestSpawnLetsGoOfDescriptorsBeforeStarted: the box init closes its
// copies of a spawned program's descriptors before it answers Started
// (and so before it starts a spawner): the server's reader of the
// program's output sees its end when the program ends, not when the box
// init is done with other work (a `true` through start_process waited
// for the next zygote's fork and exec, as it was then, before its output ended).
func TestSpawnLetsGoOfDescriptorsBeforeStarted(t *testing.T) {
	b, server := testBoxInit(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The program's stdout and stderr: the spawn owns (and closes) these
	// descriptors, not w.
	out, err := dupCloexec(int(w.Fd()))
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	errFd, err := dupCloexec(out)
	if err != nil {
		t.Fatal(err)
	}
	in, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	msg := EncodeMsg(MsgSpawn, "7", "/", "0", "/bin/sh", "-c", "echo out")
	_, fields, err := DecodeMsg(msg)
	if err != nil {
		t.Fatal(err)
	}
	// The answer waits (its sender's lock is held here): the program's
	// output must end all the same, once the program has ended.
	b.send.Lock()
	spawned := make(chan struct{})
	go func() {
		defer close(spawned)
		b.spawn(msg, fields, []int{in, out, errFd})
	}()
	// Generous: this bounds a failure (the box init keeps its copies of
	// the pipe until it has answered), it measures nothing.
	r.SetReadDeadline(time.Now().Add(2 * time.Minute))
	got, err := io.ReadAll(r)
	b.send.Unlock()
	if err != nil || string(got) != "out\n" {
		t.Fatalf("the program's output before the box init answered its spawn: %q, %v (the box init holds its descriptors until it has answered)", got, err)
	}
	reply := make([]byte, 256)
	n, _, err := syscall.Recvfrom(server, reply, 0)
	if err != nil {
		t.Fatal(err)
	}
	<-spawned
	kind, f, err := DecodeMsg(reply[:n])
	if err != nil || kind != MsgStarted || len(f) != 2 || f[0] != "7" {
		t.Fatalf("the answer to the spawn: %q (%v)", reply[:n], err)
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil || ws.ExitStatus() != 0 {
		t.Fatalf("the program: %v, %v", ws, err)
	}
}

func dupCloexec(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// TestSignalForASpawnInFlightIsHeld: the server may signal a spawn
// before its answer (its caller gone while a spawner starts it), and the
// box init's loop does not wait for a spawner's answer: the signal is
// held for the spawn and sent when its pid is recorded, not dropped (a
// program its caller gave up on ran on, unkilled, and the server closed
// the whole box when the start's grace ran out). The spawn here is the
// init child's way, recorded as a spawner's answer is (sendHeld).
func TestSignalForASpawnInFlightIsHeld(t *testing.T) {
	b, _ := testBoxInit(t)
	b.mu.Lock()
	b.held["9"] = nil // as spawn marks a spawn it hands to a spawner
	b.mu.Unlock()
	b.signal([]string{"9", strconv.Itoa(int(syscall.SIGTERM)), "1"})
	b.signal([]string{"8", strconv.Itoa(int(syscall.SIGTERM)), "1"}) // no such spawn: nothing held
	if _, ok := b.held["8"]; ok {
		t.Fatal("a signal for a spawn not in flight was held")
	}
	fds := devNulls(t, 3)
	b.spawnByInit("9", "/", false, []string{"/bin/sleep", "1000"}, fds, "")
	b.mu.Lock()
	pid, ok := b.byID["9"]
	_, still := b.held["9"]
	b.mu.Unlock()
	if !ok {
		t.Fatal("the spawn was not recorded")
	}
	if still {
		t.Error("the spawn's held signals were kept after they were sent")
	}
	exited := make(chan syscall.WaitStatus, 1)
	go func() {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		exited <- ws
	}()
	select {
	case ws := <-exited:
		if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("the program ended %v, not by the held SIGTERM", ws)
		}
	case <-time.After(time.Minute): // bounds a failure only
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatal("the signal sent while the spawn was in flight was dropped: the program runs on")
	}
}

// devNulls opens /dev/null n times: a spawn's descriptors.
func devNulls(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for range n {
		fd, err := syscall.Open(os.DevNull, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	return fds
}

// testBoxInit is a box init on one end of a control socket, the other
// end (the server's) returned. No reaper (it would wait for every child
// of the test binary) and no spawner (self is empty): a spawn forks the
// program itself.
func testBoxInit(t *testing.T) (b *boxInit, server int) {
	t.Helper()
	ctl, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Close(ctl[0])
		syscall.Close(ctl[1])
	})
	return newBoxInit(ctl[0], ""), ctl[1]
}

// TestStartedIsSentWithoutTheLock: a spawner's answer is passed on to the
// server (MsgStarted) without the box init's lock held through the send:
// a server slow to read the control socket (its queue full here) holds
// back the box init's other replies, never the spawns, signals and
// reaping that need the lock. The spawner is the test, on the other end
// of the spawner's socket; its program a sleep of the test's.
func TestStartedIsSentWithoutTheLock(t *testing.T) {
	b, server := testBoxInit(t)
	// The server's queue full: the box init's next reply blocks until
	// the server reads.
	queued := 0
	for {
		err := syscall.Sendmsg(b.ctl, EncodeMsg(MsgSynced, "fill"), nil, nil, syscall.MSG_DONTWAIT)
		if err == syscall.EAGAIN {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		queued++
	}
	prog := exec.Command("sleep", "1000")
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Process.Kill(); prog.Wait() })
	pidfd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(prog.Process.Pid), 0, 0)
	if errno != 0 {
		t.Skipf("pidfd_open: %v", errno)
	}
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(pair[1]) })
	// The spawn's descriptors: stdin, stdout, stderr and its status socket.
	status, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(status[1]) })
	fds := devNulls(t, 3)
	fds = append(fds, status[0])
	// A spawner that is not a process of its own: killStalled finds no
	// /proc entry for it and kills nothing.
	sp := &spawner{key: "k", pid: -1, sock: pair[0], busy: true}
	b.mu.Lock()
	b.spawners["k"] = sp
	b.pending++
	b.held["5"] = nil
	b.mu.Unlock()
	handled := make(chan bool, 1)
	go func() { handled <- b.viaSpawner(sp, "5", EncodeMsg(MsgSpawn, "/", "0", "x"), fds, 3) }()
	// The spawner's side: read the request, answer with the program.
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	_, oobn, _, _, err := syscall.Recvmsg(pair[1], buf, oob, syscall.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				closeAll(got)
			}
		}
	}
	if err := syscall.Sendmsg(pair[1], EncodeMsg(spawnedOK, strconv.Itoa(prog.Process.Pid), "0"), syscall.UnixRights(int(pidfd)), nil, 0); err != nil {
		t.Fatal(err)
	}
	syscall.Close(int(pidfd))
	// The spawn is recorded (pending back to 0) while its Started waits
	// for the server: the lock is free for the box init's other work.
	free := make(chan struct{})
	go func() {
		b.mu.Lock()
		for b.pending > 0 {
			b.pendingDone.Wait()
		}
		b.mu.Unlock()
		close(free)
	}()
	select {
	case <-free:
	case <-time.After(time.Minute): // bounds a failure only
		t.Error("the box init holds its lock while a slow server reads its Started")
	}
	// The server reads: the fill, then the spawn's Started.
	reply := make([]byte, 256)
	for i := 0; ; i++ {
		n, _, err := syscall.Recvfrom(server, reply, 0)
		if err != nil {
			t.Fatal(err)
		}
		kind, f, _ := DecodeMsg(reply[:n])
		if i < queued {
			if kind != MsgSynced {
				t.Fatalf("reply %d: %q, want the fill", i, reply[:n])
			}
			continue
		}
		if kind != MsgStarted || len(f) != 3 || f[0] != "5" || f[1] != strconv.Itoa(prog.Process.Pid) || f[2] != BySpawner {
			t.Fatalf("the spawn's answer: %q", reply[:n])
		}
		break
	}
	<-free
	if !<-handled {
		t.Fatal("the spawner's answer was not taken")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byID["5"] != prog.Process.Pid {
		t.Fatalf("the spawn was not recorded: %v", b.byID)
	}
}
