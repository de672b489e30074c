package app

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/runcode"
)

// Each run_code benchmark sits beside the bare spawn it wraps, so that one
// `go test -bench` run gives the ratio on the same machine at the same time:
//
//	go test -run '^$' -bench . -benchtime 200x -count 5 ./internal/app/

func benchRun(b *testing.B, lang, code string) {
	a := newApp(b, nil)
	args, _ := json.Marshal(RunCodeInput{Code: code, Lang: lang})
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		reply, err := a.Controller.Call(ctx, admin, "run_code", args)
		if err != nil {
			b.Fatal(err)
		}
		if res := reply.Output.(*runcode.Result); res.ExitCode != 0 || res.Error != "" {
			b.Fatalf("%+v", res)
		}
	}
}

func benchSpawn(b *testing.B, name string, args ...string) {
	a := newApp(b, nil)
	path, err := a.Sandbox.LookPath(name)
	if err != nil {
		b.Skip(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if out, err := exec.Command(path, args...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

func BenchmarkRunCodeShellTrue(b *testing.B)   { benchRun(b, "sh", "true") }
func BenchmarkBareShTrue(b *testing.B)         { benchSpawn(b, "sh", "-c", "true") }
func BenchmarkRunCodePythonPrint(b *testing.B) { benchRun(b, "python", "print(1)") }
func BenchmarkBarePythonPrint(b *testing.B)    { benchSpawn(b, "python3", "-c", "print(1)") }

// BenchmarkTerminalExecTrue is a warm terminal_exec round trip through the
// controller, beside a fresh `bash -c true` and a tmux send-keys/capture
// round trip (the approach some agent runtimes take):
//
//	go test -run '^$' -bench 'Terminal|Bash|Tmux' -benchtime 500x -count 5 ./internal/app/
func BenchmarkTerminalExecTrue(b *testing.B) {
	a := newApp(b, nil)
	args, _ := json.Marshal(TerminalExecInput{Command: "true"})
	ctx := context.Background()
	if _, err := a.Controller.Call(ctx, admin, "terminal_exec", args); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Controller.Call(ctx, admin, "terminal_exec", args); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBashSpawnTrue(b *testing.B) { benchSpawn(b, "bash", "-c", "true") }

func BenchmarkTmuxRoundTrip(b *testing.B) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		b.Skip("tmux not installed")
	}
	sock := filepath.Join(b.TempDir(), "tmux.sock")
	run := func(args ...string) string {
		out, err := exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			b.Fatalf("tmux %v: %v %s", args, err, out)
		}
		return string(out)
	}
	run("new-session", "-d", "-s", "bench", "bash", "--norc")
	defer run("kill-server")
	i := 0
	b.ResetTimer()
	for b.Loop() {
		i++
		marker := fmt.Sprintf("done-%d", i)
		run("send-keys", "-t", "bench", "true; echo "+marker, "Enter")
		// poll the pane until the marker shows, as tmux-driven agents do
		for !strings.Contains(run("capture-pane", "-p", "-t", "bench"), marker+"\n") {
		}
		if i%50 == 0 {
			run("clear-history", "-t", "bench")
			run("send-keys", "-t", "bench", "clear", "Enter")
		}
	}
}

// BenchmarkHundredSessions measures terminal_exec across 100 live sessions
// (round-robin); the closing note reports the RSS of the shells.
func BenchmarkHundredSessions(b *testing.B) {
	a := newApp(b, nil)
	ctx := context.Background()
	var names []string
	for i := 0; i < 100; i++ {
		s, err := a.Sessions.Create(ctx, fmt.Sprintf("s%d", i))
		if err != nil {
			b.Fatal(err)
		}
		names = append(names, s.Name)
		args, _ := json.Marshal(TerminalExecInput{Command: "true", Session: s.Name})
		if _, err := a.Controller.Call(ctx, admin, "terminal_exec", args); err != nil {
			b.Fatal(err)
		}
	}
	rss := shellsRSS(b, a)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		args, _ := json.Marshal(TerminalExecInput{Command: "true", Session: names[i%100]})
		i++
		if _, err := a.Controller.Call(ctx, admin, "terminal_exec", args); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rss)/(1<<20), "MiB-rss-100-shells")
}

// shellsRSS sums the resident memory of every live session shell.
func shellsRSS(b *testing.B, a *App) int64 {
	list, _ := a.Sessions.List(context.Background())
	var total int64
	for _, s := range list {
		sh, err := a.Terminals.Shell(s)
		if err != nil {
			continue
		}
		st := sh.Status()
		if st.Pid == 0 {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// BenchmarkPythonRunRootfs is python_run print(1) in the Debian rootfs (a
// fresh boxed python3 -I each call), beside BenchmarkBarePythonPrint:
//
//	go test -run '^$' -bench 'PythonRunRootfs|BarePythonPrint' -benchtime 50x -count 5 ./internal/app/
func BenchmarkPythonRunRootfs(b *testing.B) {
	a := appOnRootfs(b, testRootfs(b))
	args, _ := json.Marshal(PythonRunInput{Code: "print(1)"})
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		reply, err := a.Controller.Call(ctx, admin, "python_run", args)
		if err != nil {
			b.Fatal(err)
		}
		if res := reply.Output.(*PythonRunResult); res.ExitCode != 0 || res.Stdout != "1\n" {
			b.Fatalf("%+v", res)
		}
	}
}

// read_file of a small file in the workspace (the server's os.Root) and
// in the box's /tmp (a helper spawned in the box), side by side:
//
//	go test -run '^$' -bench 'ReadFile(Workspace|BoxTmp)' -benchtime 200x ./internal/app/
func BenchmarkReadFileWorkspace(b *testing.B) { benchReadFile(b, "/home/user/bench.txt") }
func BenchmarkReadFileBoxTmp(b *testing.B)    { benchReadFile(b, "/tmp/bench.txt") }

func benchReadFile(b *testing.B, path string) {
	a := newApp(b, nil)
	ctx := context.Background()
	w, _ := json.Marshal(WriteFileInput{Path: path, Content: "hello\n"})
	if _, err := a.Controller.Call(ctx, admin, "write_file", w); err != nil {
		b.Fatal(err)
	}
	args, _ := json.Marshal(ReadFileInput{Path: path})
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Controller.Call(ctx, admin, "read_file", args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewClose is what an App costs to make and close (app.New on a
// new data directory, then Close), as every test of this package and a
// quro serve start pay it: wall time per op, and cpu-ms/op, the CPU of
// this process and of the children it waited for (probes, helpers).
// "shared-fs" is the default disks method where the machine has it (its
// share is one mkfs.btrfs and a mount per new data directory), "images"
// the ext4 images' (no mkfs until a session's first disk):
//
//	go test -run '^$' -bench NewClose -benchtime 20x -count 6 ./internal/app/
func BenchmarkNewClose(b *testing.B) {
	for _, images := range []bool{false, true} {
		name := "shared-fs"
		if images {
			name = "images"
		}
		b.Run(name, func(b *testing.B) {
			newClose := func() {
				a, err := New(context.Background(), b.TempDir(), &Options{Python: testPython, Network: hostAllowed, diskImages: images})
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Close(); err != nil {
					b.Fatal(err)
				}
			}
			newClose() // the shared interpreter extracted, once per process
			before := cpuTime()
			for b.Loop() {
				newClose()
			}
			b.ReportMetric(float64((cpuTime()-before).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the user and system time of this process and of its waited-
// for children.
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}
