// Package procs reads the processes of /proc for the benchmarks: which
// run below the bench (the server's boxes, bubblewrap, workers).
package procs

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Proc is one process of /proc.
type Proc struct {
	PID, PPID int
	Comm      string
}

// Read lists every process of /proc by pid.
func Read() (map[int]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]Proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out[pid] = Proc{PID: pid, PPID: ppid, Comm: s[open+1 : end]}
	}
	return out, nil
}

// Descendants are every process below root (root excluded): every
// bubblewrap the server started, everything in its boxes, and its helpers.
func Descendants(procs map[int]Proc, root int) []Proc {
	kids := map[int][]int{}
	for _, p := range procs {
		kids[p.PPID] = append(kids[p.PPID], p.PID)
	}
	var out []Proc
	queue := slices.Clone(kids[root])
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		out = append(out, procs[pid])
		queue = append(queue, kids[pid]...)
	}
	return out
}

// MemAvailable is /proc/meminfo's MemAvailable in bytes (0 if unread).
func MemAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// LoadAvg is /proc/loadavg's three load averages ("?" if unread).
func LoadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
