package boxinit

import (
	"io"
	"os"
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
	var fds []int
	for range 3 {
		fd, err := syscall.Open(os.DevNull, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
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
