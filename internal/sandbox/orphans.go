package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// KillProcessesIn kills every process whose working directory or HOME lies
// under dir: what a session started and that left its shell's process group
// (setsid, nohup, daemons). It returns how many it killed.
func KillProcessesIn(dir string) int {
	dir = filepath.Clean(dir)
	self := os.Getpid()
	killed := 0
	// Several passes: a dying parent may have forked in the meantime.
	for pass := 0; pass < 3; pass++ {
		n := 0
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return killed
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || pid == 1 {
				continue
			}
			if beneath(procCwd(pid), dir) || beneath(procHome(pid), dir) {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					n++
				}
			}
		}
		killed += n
		if n == 0 {
			break
		}
	}
	return killed
}

func procCwd(pid int) string {
	p, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
	return strings.TrimSuffix(p, " (deleted)")
}

func procHome(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "HOME="); ok {
			return v
		}
	}
	return ""
}

// beneath reports whether path p is dir or lies beneath it.
func beneath(p, dir string) bool {
	if p == "" {
		return false
	}
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/"
}
