// Package sandboxtest helps tests look at processes that run in a sandbox.
package sandboxtest

import (
	"os"
	"strconv"
	"strings"
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
			if cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd"); cwd == workspace || strings.HasPrefix(cwd, workspace+"/") {
				return hp, true
			}
		}
	}
	return 0, false
}
