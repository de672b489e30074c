package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// markerLib builds a shared library whose constructor records, in dir, the
// effective uid and executable of every process that loads it.
func markerLib(t *testing.T, dir string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: cannot build the LD_PRELOAD library this test needs (apt-get install gcc)")
	}
	src := filepath.Join(t.TempDir(), "marker.c")
	os.WriteFile(src, []byte(`#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
	char exe[512] = {0}, path[1024];
	readlink("/proc/self/exe", exe, sizeof exe - 1);
	snprintf(path, sizeof path, "%s/marker.XXXXXX", MARKER_DIR);
	int fd = mkstemp(path);
	if (fd < 0) return;
	dprintf(fd, "%d %s\n", (int)geteuid(), exe);
	close(fd);
}
`), 0o644)
	so := filepath.Join(dir, "marker.so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", so, `-DMARKER_DIR="`+dir+`"`, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return so
}

// TestPrivilegedHelpersNeverSeeSessionEnv: an LD_PRELOAD that bypassed
// every validation and reached Spec.Env loads into the user program only,
// never into bubblewrap or the init child (host root before the uid
// switch).
func TestPrivilegedHelpersNeverSeeSessionEnv(t *testing.T) {
	sb := newSandbox(t)
	dir := t.TempDir()
	so := markerLib(t, dir)
	out, errOut, exit := run(t, sb, testCtx(t), `printf '%s\n' "$LD_PRELOAD"`, func(s *Spec) {
		s.Dir = dir
		s.Env = map[string]string{"LD_PRELOAD": so}
	})
	if exit.Code != 0 || strings.TrimSpace(out) != so {
		t.Fatalf("the program did not see its LD_PRELOAD: exit %d, %q %q", exit.Code, out, errOut)
	}
	markers, _ := filepath.Glob(filepath.Join(dir, "marker.*"))
	user := 0
	for _, m := range markers {
		if m == so {
			continue
		}
		b, _ := os.ReadFile(m)
		uid, exe, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		t.Logf("loaded into euid %s %s", uid, exe)
		switch base := filepath.Base(exe); {
		case base == "dash" || base == "sh" || base == "bash":
			user++
			if sb.layers.root && uid == "0" {
				t.Errorf("the user program ran as uid 0")
			}
		default:
			t.Errorf("the session's LD_PRELOAD ran in %s as euid %s: a privileged helper got the session's environment", exe, uid)
		}
	}
	if user == 0 {
		t.Fatal("the library never loaded into the user program: the test proves nothing")
	}
}

// TestHelpersGetAFixedEnvironment: while a run is alive, every process of
// the box but the program has exactly HelperEnv; the program has the
// session's variables; nothing anywhere has the server's, and no
// session value is on any command line.
func TestHelpersGetAFixedEnvironment(t *testing.T) {
	const canary = "quro-server-canary-31337"
	t.Setenv("QURO_TEST_CANARY", canary)
	sb := newSandbox(t)
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	defer inR.Close()
	defer inW.Close()
	defer outR.Close()
	p, err := sb.Start(testCtx(t), &Spec{Args: []string{"sh", "-c", "echo ready; read x"}, Dir: t.TempDir(),
		Env: map[string]string{"SESSION_SECRET": "session-value-4242"}, Stdin: inR, Stdout: outW})
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(outR).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%q %v", line, err)
	}
	procs, err := readProcs()
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, pr := range procs {
		children[pr.ppid] = append(children[pr.ppid], pr.pid)
	}
	seen, program := 0, 0
	for queue := []int{p.Cmd.Process.Pid}; len(queue) > 0; queue = queue[1:] {
		pid := queue[0]
		queue = append(queue, children[pid]...)
		dir := "/proc/" + strconv.Itoa(pid)
		environ, err1 := os.ReadFile(dir + "/environ")
		cmdline, err2 := os.ReadFile(dir + "/cmdline")
		exe, _ := os.Readlink(dir + "/exe")
		if err1 != nil || err2 != nil {
			t.Fatalf("pid %d: %v %v", pid, err1, err2)
		}
		seen++
		env := strings.Split(strings.TrimSuffix(string(environ), "\x00"), "\x00")
		t.Logf("pid %d %s: %q", pid, exe, env)
		if bytes.Contains(environ, []byte(canary)) || bytes.Contains(cmdline, []byte(canary)) {
			t.Errorf("pid %d (%s) has the server's variable", pid, exe)
		}
		if bytes.Contains(cmdline, []byte("session-value-4242")) {
			t.Errorf("pid %d (%s) has a session value on its command line: %q", pid, exe, cmdline)
		}
		if base := filepath.Base(exe); base == "dash" || base == "sh" {
			program++
			if !slices.Contains(env, "SESSION_SECRET=session-value-4242") {
				t.Errorf("the program lacks its session variable: %q", env)
			}
			continue
		}
		slices.Sort(env)
		want := slices.Sorted(slices.Values(HelperEnv))
		if !slices.Equal(env, want) {
			t.Errorf("pid %d (%s) environment %q, want exactly %q", pid, exe, env, want)
		}
	}
	inW.WriteString("\n")
	if e := p.Wait(); e.Code != 0 {
		t.Errorf("exit %+v", e)
	}
	if program != 1 || seen < 2 && sb.Boxed() {
		t.Fatalf("found %d processes, %d of them the program", seen, program)
	}
}

// TestEnvNamesTheLoaderObeysAreRefused: CheckEnvName refuses, naming the
// variable and why, every name of the loader's and libc's secure-exec list
// and of shell start-up, and a privileged (RootfsAdmin) spec may not carry
// them.
func TestEnvNamesTheLoaderObeysAreRefused(t *testing.T) {
	for _, name := range RefusedEnvExamples {
		err := CheckEnvName(name)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "cannot be set") {
			t.Errorf("%s: %v", name, err)
		}
		_, err = newSandbox(t).Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: t.TempDir(), RootfsAdmin: true,
			Env: map[string]string{name: "x"}})
		if !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("RootfsAdmin with %s: %v", name, err)
		}
	}
	for _, name := range []string{"1X", "A-B", "A B", "", "A=B", "É"} {
		if err := CheckEnvName(name); err == nil || !strings.Contains(err.Error(), "letters, digits and _") {
			t.Errorf("%q: %v", name, err)
		}
	}
	for _, name := range []string{"PATH", "HOME", "PYTHONPATH", "MY_LD_PRELOAD", "LANG", "_x1"} {
		if err := CheckEnvName(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestOversizeEnvironmentIsRefused: more than the init child accepts is
// refused before anything starts, with the limit in the message.
func TestOversizeEnvironmentIsRefused(t *testing.T) {
	_, err := newSandbox(t).Run(testCtx(t), &Spec{Args: []string{"true"}, Dir: t.TempDir(),
		Env: map[string]string{"BIG": strings.Repeat("x", 2<<20)}})
	if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "the limit is") {
		t.Fatalf("%v", err)
	}
}

func TestCheckEnv(t *testing.T) {
	for _, bad := range []map[string]string{
		{"LD_PRELOAD": "x"}, {"BASH_ENV": "x"}, {"A=B": "c"}, {"": "c"}, {"OK": "a\x00b"},
	} {
		if CheckEnv(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := CheckEnv(map[string]string{"PATH_EXTRA": "/x", "LANG": "C.UTF-8", "EMPTY": ""}); err != nil {
		t.Errorf("good variables refused: %v", err)
	}
	// The first refused name in order, every time.
	env := map[string]string{"LD_PRELOAD": "x", "BASH_ENV": "y"}
	want := CheckEnv(env).Error()
	for range 20 {
		if got := CheckEnv(env).Error(); got != want || !strings.Contains(got, "BASH_ENV") {
			t.Fatalf("%q then %q", want, got)
		}
	}
}
