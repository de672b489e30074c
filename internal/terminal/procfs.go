package terminal

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/quro-dev/quro/internal/sandbox"
)

func inside(p, dir string) bool {
	return p != "" && (p == dir || strings.HasPrefix(p, dir+"/"))
}

// killProc kills a sandboxed process and its process group (the sandbox
// owns how).
func killProc(p *sandbox.Process) { p.Kill() }

// waitingForInput reports whether a process of the shell's group is
// blocked in read(2) on the commands' input pipe. It looks only at the
// shell's own box: the processes of its cgroup (one read of cgroup.procs),
// never at the rest of the host. Without the cgroup layer
// (--isolation=minimal on a host that gives Quro no cgroups) a box has no
// such list, and the whole of /proc is the last resort.
func (sp *shellProc) waitingForInput() bool {
	if sp.inInode == 0 {
		return false
	}
	pgid := sp.proc.Group()
	if pgid <= 0 {
		return false
	}
	pids := sp.proc.CgroupPids()
	if pids == nil {
		pids = allPids()
	}
	return blockedOnPipe(pids, pgid, sp.inInode)
}

// inspected, when set (by tests), is told each pid whose /proc entries
// the input detection reads.
var inspected atomic.Pointer[func(pid int)]

// blockedOnPipe reports whether one of pids, in the process group pgid,
// sits in read(2) on the pipe with inode ino.
func blockedOnPipe(pids []int, pgid int, ino uint64) bool {
	want := fmt.Sprintf("pipe:[%d]", ino)
	group := strconv.Itoa(pgid)
	seen := inspected.Load()
	for _, pid := range pids {
		if seen != nil {
			(*seen)(pid)
		}
		dir := "/proc/" + strconv.Itoa(pid)
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so cut at ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[2] != group || f[0] != "S" {
			continue
		}
		sc, err := os.ReadFile(dir + "/syscall")
		if err != nil {
			continue
		}
		sf := strings.Fields(string(sc))
		if len(sf) < 2 || !readSyscalls[sf[0]] {
			continue
		}
		fd, err := strconv.ParseInt(strings.TrimPrefix(sf[1], "0x"), 16, 64)
		if err != nil {
			continue
		}
		if link, err := os.Readlink(fmt.Sprintf("%s/fd/%d", dir, fd)); err == nil && link == want {
			return true
		}
	}
	return false
}

// allPids lists every process of the host (the fallback without cgroups).
func allPids() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readSyscalls are the read(2)-family syscall numbers as /proc/PID/syscall
// shows them.
var readSyscalls = map[string]bool{}

func init() {
	switch runtime.GOARCH {
	case "amd64":
		readSyscalls = map[string]bool{"0": true, "17": true, "19": true} // read, pread64, readv
	case "arm64":
		readSyscalls = map[string]bool{"63": true, "65": true, "67": true}
	}
}
