// Package sandboxtest helps tests look at processes that run in a sandbox.
package sandboxtest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// HostPID finds, among the host's processes, the one that a boxed session
// sees as pid (the innermost pid of its NSpid line) and whose working
// directory lies in workspace, and returns its host pid. ok is false when
// there is none.
func HostPID(pid int, workspace string) (hostPID int, ok bool) {
	entries, _ := os.ReadDir("/proc")
	want := strconv.Itoa(pid)
	for _, e := range entries {
		hp, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			f, found := strings.CutPrefix(line, "NSpid:")
			if !found {
				continue
			}
			ns := strings.Fields(f)
			if len(ns) < 2 || ns[len(ns)-1] != want {
				break
			}
			cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd")
			if cwd == workspace || strings.HasPrefix(cwd, workspace+"/") {
				return hp, true
			}
			// In a session box the workspace is also /home/user, where its
			// shell works: the box's /home/user is the same directory.
			if cwd == "/home/user" || strings.HasPrefix(cwd, "/home/user/") {
				a, aerr := os.Stat("/proc/" + e.Name() + "/root/home/user")
				b, berr := os.Stat(workspace)
				if aerr == nil && berr == nil && os.SameFile(a, b) {
					return hp, true
				}
			}
		}
	}
	return 0, false
}

// HostListener is a TCP listener of the host's on 127.0.0.1, standing in
// for a host service a box must or must not reach: it answers every
// connection with reply and closes it, and counts the connections.
type HostListener struct {
	Addr     string // 127.0.0.1:port
	Port     int
	Accepted atomic.Int64
}

// ListenHost starts a HostListener, closed when the test ends.
func ListenHost(t testing.TB, reply string) *HostListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h := &HostListener{Addr: ln.Addr().String(), Port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.Accepted.Add(1)
			_, _ = c.Write([]byte(reply)) // a client gone first is no failure here
			c.Close()
		}
	}()
	return h
}

// DescendantMounts calls each with the fields of every line of the
// mountinfo of every process below pid (see Descendants): the mounts of
// every namespace the processes it started are in. A process gone while
// it reads is left out.
func DescendantMounts(t testing.TB, pid int, each func(fields []string)) {
	t.Helper()
	for _, p := range Descendants(t, pid) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/mountinfo")
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 5 {
				each(f)
			}
		}
	}
}

// Descendants lists the host's processes below pid (its children, theirs,
// and so on), read from /proc; a process gone while it reads is left out.
func Descendants(t testing.TB, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			if pp, err := strconv.Atoi(f[1]); err == nil {
				children[pp] = append(children[pp], p)
			}
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
