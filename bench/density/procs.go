package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/quro-dev/quro/bench/internal/procs"
)

// What the machine holds: the processes below the server and their
// proportional set size, the host's mounts and loop devices.

// pss is a process's proportional set size (smaps_rollup's Pss), bytes.
func pss(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("pid %d: no Pss line", pid)
}

// pssPoint is the PSS of the server (this process: the App, and the
// bench's client beside it) and of every process below it, by command.
type pssPoint struct {
	Server int64            `json:"server_bytes"`
	Boxes  int64            `json:"boxes_bytes"`
	Procs  int              `json:"box_processes"`
	ByComm map[string]int64 `json:"by_comm_bytes"`
	NComm  map[string]int   `json:"by_comm_processes"`
	FDs    int              `json:"server_fds"`
	Thr    int              `json:"server_threads"`
}

func (p *pssPoint) total() int64 { return p.Server + p.Boxes }

func measurePSS() (*pssPoint, error) {
	ps, err := procs.Read()
	if err != nil {
		return nil, err
	}
	r := &pssPoint{ByComm: map[string]int64{}, NComm: map[string]int{}}
	if r.Server, err = pss(os.Getpid()); err != nil {
		return nil, err
	}
	for _, p := range procs.Descendants(ps, os.Getpid()) {
		v, err := pss(p.PID)
		if err != nil {
			continue // ended meanwhile
		}
		r.Boxes += v
		r.Procs++
		r.ByComm[p.Comm] += v
		r.NComm[p.Comm]++
	}
	r.FDs = count("/proc/self/fd")
	r.Thr = count("/proc/self/task")
	return r, nil
}

func count(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	return len(ents)
}

// hostPoint is the host's mount table (this process's mount namespace:
// the host's, as the bench runs there) and its loop devices, in all and
// those of the data directory.
type hostPoint struct {
	Mounts      int `json:"mounts"`
	DataMounts  int `json:"data_dir_mounts"`
	Loops       int `json:"loop_devices_bound"`
	DataLoops   int `json:"data_dir_loop_devices"`
	BoxProcs    int `json:"server_descendants"`
	ServerFDs   int `json:"server_fds"`
	ServerThr   int `json:"server_threads"`
	LoopDevices int `json:"loop_device_nodes"`
}

func measureHost(dataDir string) hostPoint {
	var h hostPoint
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for l := range strings.Lines(string(mi)) {
			h.Mounts++
			if dataDir != "" && strings.Contains(l, dataDir) {
				h.DataMounts++
			}
		}
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		h.Loops++
		if dataDir != "" && strings.HasPrefix(strings.TrimSpace(string(b)), dataDir) {
			h.DataLoops++
		}
	}
	nodes, _ := filepath.Glob("/dev/loop[0-9]*")
	h.LoopDevices = len(nodes)
	if ps, err := procs.Read(); err == nil {
		h.BoxProcs = len(procs.Descendants(ps, os.Getpid()))
	}
	h.ServerFDs = count("/proc/self/fd")
	h.ServerThr = count("/proc/self/task")
	return h
}
