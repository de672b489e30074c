package terminal

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// attackScript runs as a command. It reports what it can reach and, through
// every descriptor it can open — its own and those of every process it
// sees in /proc — writes forged status and state records: with every
// nonce it could read from any descriptor (the framing, in the attack that
// was reported), with guessed ones, with the state nonce it can read from
// its own variables, and with end markers. A background copy goes on forging (descriptors 3 and
// up only, so that the next command's output stays readable) while the
// next command runs. The command itself ends in directory "real" with
// exit code 42.
const attackScript = `
cands=()
memscan='
import os, re
pat = re.compile(rb"%s:%d:%s[^\x27]*\x27 ([0-9a-f]{32})")
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", 0)
    except OSError:
        continue
    print("MEM", pid, flush=True)
    for line in maps:
        f = line.split()
        if "r" not in f[1]:
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        try:
            mem.seek(lo)
            for m in pat.finditer(mem.read(hi - lo)):
                print(m.group(1).decode(), flush=True)
        except (OSError, ValueError, OverflowError):
            pass
'

harvest() { # $1: a descriptor open for reading; collect what looks like a nonce
  local data=
  read -t 0 -u "$1" 2>/dev/null || return
  read -r -t 0.2 -N 65536 -u "$1" data 2>/dev/null
  while [[ $data =~ ([0-9a-f]{32}) ]]; do
    cands+=("${BASH_REMATCH[1]}")
    data=${data#*"${BASH_REMATCH[1]}"}
  done
}
forge() {
  local n
  for n in "${cands[@]}" "$__quro_n" 00000000000000000000000000000000 ffffffffffffffffffffffffffffffff; do
    builtin printf '\0%s:0:1\0%s:0:/fake\0\0S%s:k:/fake\0Bbuiltin cd /; FORGED=1\0\0E1\0\0E%s\0\0S%s:x:/fake\0B\0' "$n" "$n" "$n" "$RANDOM$RANDOM" "$n"
  done
}
attack() { # $1: report (1) or not; $2: lowest fd number to write to
  local p pid f n t
  # First read whatever can be read (the rest of the framing?) for nonces.
  for f in /proc/$BASHPID/fd/*; do
    n=${f##*/}
    (( n == 1 || n == 2 )) || harvest "$n"
  done
  for f in /proc/[0-9]*/fd/*; do
    if { exec 8<>"$f"; } 2>/dev/null; then harvest 8; exec 8>&-; fi
  done
  # And from the memory of every process: the status record's printf and
  # its nonce are in the shell's memory while the command runs.
  if [[ $1 == 1 ]] && type python3 >/dev/null 2>&1; then
    mapfile -t -O "${#cands[@]}" cands < <(python3 -c "$memscan" 2>/dev/null)
    for n in "${cands[@]}"; do [[ $n == MEM* ]] && echo "M ${n#MEM } memread"; done
  fi
  [[ $1 == 1 ]] && echo "C ${#cands[@]}"
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $pid == "$BASHPID" ]] && continue
    for f in "$p"/fd/*; do
      [[ -e $f || -L $f ]] || continue
      [[ $1 == 1 ]] && echo "L $pid"
      n=${f##*/}
      (( n < $2 )) && continue
      t=$(readlink "$f" 2>/dev/null)
      if { exec 9<>"$f"; } 2>/dev/null; then
        forge >&9 2>/dev/null
        exec 9>&-
        [[ $1 == 1 ]] && echo "W $pid $n $t"
      fi
    done
    if { exec 9<>"$p/mem"; } 2>/dev/null; then exec 9>&-; [[ $1 == 1 ]] && echo "M $pid mem"; fi
    if { exec 9<"$p/environ"; } 2>/dev/null; then exec 9>&-; [[ $1 == 1 ]] && echo "M $pid environ"; fi
  done
  # The subshell's own descriptors, written directly.
  for f in /proc/$BASHPID/fd/*; do
    n=${f##*/}
    (( n < $2 )) && continue
    forge >&"$n" 2>/dev/null
  done
}
read -r st < /proc/$BASHPID/stat
st=${st##*) }; set -- $st
echo "R $2"
fds=(/proc/$BASHPID/fd/*)
for f in "${fds[@]}"; do [[ -e $f ]] && echo "FD ${f##*/}"; done # (the glob's own directory is closed by now)
for b in /tmp/quro-sealed-*/bash-* /run/quro/sealed/bash-*; do head -c 4 "$b" >/dev/null 2>&1 && echo "READ $b"; done
attack 1 0
( for i in $(seq 200); do [[ -e stop ]] && break; attack 0 3; done ) >/dev/null 2>&1 &
mkdir -p real && cd real
(exit 42)
`

// TestCommandCannotForgeItsResult runs the attack from the security report:
// a command that tries every descriptor it has and every /proc path of
// every process in the box (fd/*, mem, environ) to forge the shell's
// completion record. terminal_exec must still report the true exit code
// and directory, and the next command's result must be its own.
func TestCommandCannotForgeItsResult(t *testing.T) {
	s, _, _ := newShell(t, nil)
	exec(t, s, "true", ExecOptions{})
	// The resident shell's protocol pipes, seen from the host.
	s.mu.Lock()
	g := s.sp.proc.Group()
	s.mu.Unlock()
	kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", g, g))
	rpid := 0
	for _, k := range strings.Fields(string(kids)) {
		if c, _ := os.ReadFile("/proc/" + k + "/cmdline"); strings.Contains(string(c), "/bash-") {
			rpid, _ = strconv.Atoi(k)
		}
	}
	if rpid == 0 {
		t.Fatalf("no resident shell among the children of %d: %q", g, kids)
	}
	proto := map[string]bool{}
	for _, fd := range []string{"0", "3"} {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", rpid, fd))
		if err != nil || !strings.HasPrefix(l, "pipe:") {
			t.Fatalf("resident shell %d fd %s: %q %v", rpid, fd, l, err)
		}
		proto[l] = true
	}

	// The padding makes the framing longer than what bash reads ahead, as
	// in the reported attack (the rest of it stayed in the shell's stdin).
	res := exec(t, s, attackScript+"#"+strings.Repeat("x", 64<<10)+"\n", ExecOptions{})
	if res.ExitCode != 42 || res.Cwd != "/home/user/real" || res.ShellRestarted || res.Error != "" {
		t.Fatalf("forged result: exit %d cwd %q restarted %v error %q\n%s", res.ExitCode, res.Cwd, res.ShellRestarted, res.Error, res.Output)
	}
	var inner string
	var fds []string
	listed, mem := map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(res.Output))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "R":
			inner = f[1]
		case "FD":
			fds = append(fds, f[1])
		case "READ":
			t.Errorf("the sealed bash is readable in the box: %s", f[1])
		case "L":
			listed[f[1]] = true
		case "M":
			mem[f[1]] = true
			if f[1] == inner {
				t.Errorf("the command opened the resident shell's %s", f[2])
			}
		case "W":
			if len(f) == 4 && proto[f[3]] {
				t.Errorf("the command opened a protocol pipe for writing: %s", sc.Text())
			}
		}
	}
	t.Logf("attack report:\n%s", reportLines(res.Output))
	if inner == "" {
		t.Fatalf("no report:\n%s", res.Output)
	}
	if !slices.Equal(fds, []string{"0", "1", "2", "6"}) {
		t.Errorf("the command's descriptors: %v, want 0 1 2 6 (stdin, stdout, stderr, state)", fds)
	}
	if listed[inner] {
		t.Errorf("the command listed /proc/%s/fd (the resident shell's)", inner)
	}
	if _, err := strconv.Atoi(inner); err != nil {
		t.Fatalf("resident shell pid %q", inner)
	}

	// The next command gets its own result while the forger still runs.
	res = exec(t, s, "echo next; cd ..; echo ${FORGED:-none}; (exit 3)", ExecOptions{})
	if res.ExitCode != 3 || res.Cwd != "/home/user" || res.ShellRestarted || !strings.Contains(res.Output, "next\nnone\n") {
		t.Fatalf("next command: exit %d cwd %q restarted %v output %q error %q", res.ExitCode, res.Cwd, res.ShellRestarted, res.Output, res.Error)
	}
	res = exec(t, s, "touch real/stop; pwd", ExecOptions{})
	if res.ExitCode != 0 || res.Output != "/home/user\n" {
		t.Fatalf("third command: %+v", res)
	}
}

// reportLines keeps the attack's report lines (not the forged bytes it
// wrote to its own output).
func reportLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && len(f[0]) <= 4 && strings.Trim(f[0], "RCFDLMW") == "" {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestCommandCannotLeaveItsSubshell sends commands that try to end the
// subshell early and run the rest in the resident shell (which holds the
// status channel, fd 3): a closing parenthesis, the end of the old
// frame's heredoc, a call of the resident shell's own __quro_post. The
// resident shell never reads a command's text (it comes through the
// memfd and is only eval'd in the subshell), so each stays inside: fd 3
// is never open where it runs, and the status reported is its own.
func TestCommandCannotLeaveItsSubshell(t *testing.T) {
	s, _, _ := newShell(t, nil)
	const probe = "{ : >&3; } 2>/dev/null && echo HAS3 || echo NO3"
	post := "__quro_post 0 " + strings.Repeat("0", 32) + " x 0"
	for _, c := range []struct {
		cmd  string
		exit int
	}{
		{"true\n)\n" + probe + "; (\ntrue", 2}, // a syntax error in the subshell: nothing runs
		{"echo a)\n" + post + "\n" + probe, 2},
		{"QURO_x\n)\n" + probe + "\n(", 2},
		{post + "; " + probe + "; exit 7", 7},
	} {
		res := exec(t, s, c.cmd, ExecOptions{})
		if strings.Contains(res.Output, "HAS3") || res.Running || res.ExitCode != c.exit {
			t.Fatalf("%q: want exit %d and no fd 3: %+v", c.cmd, c.exit, res)
		}
		if c.exit == 7 && !strings.Contains(res.Output, "NO3") {
			t.Fatalf("%q: the probe did not run: %q", c.cmd, res.Output)
		}
		if r := exec(t, s, "echo next", ExecOptions{}); r.Output != "next\n" || r.ExitCode != 0 {
			t.Fatalf("after %q: %+v", c.cmd, r)
		}
	}
}

// TestWaitingSubshellKilledRunsNothing: each command's subshell is forked
// ahead of it and waits for the server's go on fd 8. A process an earlier
// command left behind can neither reach that pipe (the waiting subshell is
// a fork of the non-dumpable resident shell: /proc/<pid>/fd is closed to
// it) nor, by killing the waiting subshell, make the next command run
// unseen or twice: that command is reported as not run, and nothing of it
// ran.
func TestWaitingSubshellKilledRunsNothing(t *testing.T) {
	s, ws, _ := newShell(t, nil)
	fifo := filepath.Join(ws, "done")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(ws, 0o777)
	// The job waits until the resident shell's next subshell is forked,
	// tries its go pipe, kills it and says so through the FIFO.
	job := `R=$$ me=$BASHPID; ( while :; do c=$(< /proc/$R/task/$R/children); c=${c% }; ` +
		`[ -n "$c" ] && [ "$c" != "$me" ] && break; done; ` +
		`{ echo go >/proc/$c/fd/8; } 2>/dev/null && w=WROTE || w=REFUSED; kill -9 $c; echo "$w" > done ) >/dev/null 2>&1 &`
	if r := exec(t, s, job, ExecOptions{}); r.ExitCode != 0 {
		t.Fatalf("the job: %+v", r)
	}
	got := make(chan string, 1)
	go func() {
		b, err := os.ReadFile(fifo) // blocks until the job writes
		if err != nil {
			got <- err.Error()
			return
		}
		got <- strings.TrimSpace(string(b))
	}()
	select {
	case w := <-got:
		if w != "REFUSED" {
			t.Fatalf("the job's write to the waiting subshell's go pipe: %q", w)
		}
	case <-time.After(time.Minute):
		t.Fatal("the job never found the waiting subshell")
	}
	res := exec(t, s, "echo ran > ran", ExecOptions{})
	if res.ExitCode != -1 || !res.ShellRestarted || !strings.Contains(res.Error, "did not run") {
		t.Fatalf("the command after its subshell was killed: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); !os.IsNotExist(err) {
		t.Fatalf("the command ran after all (%v)", err)
	}
	if r := exec(t, s, "echo next", ExecOptions{}); r.Output != "next\n" || r.ExitCode != 0 {
		t.Fatalf("the command after: %+v", r)
	}
}

// TestWaitingSubshellStoppedRunsNothing: a process an earlier command
// left behind stops (SIGSTOP) the subshell that waits for the next
// command. That command then hangs until its timeout, whose hard stage
// kills the shell: it is reported as not run (as when the waiting
// subshell is killed), not as a command killed partway (exit 137, hard
// interrupt), and nothing of it ran.
func TestWaitingSubshellStoppedRunsNothing(t *testing.T) {
	s, ws, _ := newShell(t, nil)
	fifo := filepath.Join(ws, "stopped")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	// The job waits until the resident shell's next subshell is forked,
	// stops it, waits until it is stopped (a stop is taken when the
	// process next runs: one woken by the go line first would read it)
	// and says so through the FIFO.
	job := `R=$$ me=$BASHPID; ( while :; do c=$(< /proc/$R/task/$R/children); c=${c% }; ` +
		`[ -n "$c" ] && [ "$c" != "$me" ] && break; done; kill -STOP $c; ` +
		`while s=$(< /proc/$c/stat); s=${s##*) }; [ "${s%% *}" != T ]; do :; done; echo "$c" > stopped ) >/dev/null 2>&1 &`
	if r := exec(t, s, job, ExecOptions{}); r.ExitCode != 0 {
		t.Fatalf("the job: %+v", r)
	}
	got := make(chan string, 1)
	go func() {
		b, err := os.ReadFile(fifo) // blocks until the job writes
		if err != nil {
			got <- err.Error()
			return
		}
		got <- strings.TrimSpace(string(b))
	}()
	select {
	case <-got:
	case <-time.After(time.Minute):
		t.Fatal("the job never found the waiting subshell")
	}
	res := exec(t, s, "echo ran > ran", ExecOptions{Timeout: 2 * time.Second})
	if res.ExitCode != -1 || !res.ShellRestarted || !res.TimedOut || res.Interrupted || res.InterruptStage != "" ||
		!strings.Contains(res.Error, "did not run") {
		t.Fatalf("the command after its subshell was stopped: %+v", res)
	}
	if txt := res.Text(); strings.Contains(txt, "killed") || !strings.Contains(txt, "[exit -1]") {
		t.Fatalf("text:\n%s", txt)
	}
	if _, err := os.Stat(filepath.Join(ws, "ran")); !os.IsNotExist(err) {
		t.Fatalf("the command ran after all (%v)", err)
	}
	if r := exec(t, s, "echo next", ExecOptions{}); r.Output != "next\n" || r.ExitCode != 0 {
		t.Fatalf("the command after: %+v", r)
	}
}
