package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// TestREADME runs every example of README.md as written: each line of its
// ```sh blocks, in order, in one bash (so a variable one line sets, such as
// $TOKEN, is there for the next), in a fresh directory where bin/quro is
// this package's quro, with HOME a fresh directory (so
// ~/.local/share/quro, the data directory the examples use and quro's
// default, is new and private). Each command must exit 0, or the code its
// comment names ("exits 3"), and print no API error ({"error": {...}}: curl
// exits 0 on a 401). The comment markers it reads:
//
//	# needs: root, network   not run here; the test says so (a skip)
//	# keeps running          started in the background (quro serve); the
//	                         test waits for its "listening" line
//	(needs a terminal) ... Ctrl-X ...
//	                         run on a pseudo-terminal; once a command typed
//	                         into it has answered, the test presses Ctrl-X
//	                         and it must end (with 0)
//
// The one substitution: quro serve gets port 0 instead of 7070 (another
// quro may hold 7070) and later lines get the port it chose. `make`
// lines (make run, make test) are how the suite itself runs, not run here.
func TestREADME(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := readmeCommands(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 30 {
		t.Fatalf("found only %d commands in README.md's ```sh blocks; the parser is broken", len(cmds))
	}

	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's examples use curl: apt-get install curl (make test installs it)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	work, home, bin := filepath.Join(dir, "work"), filepath.Join(dir, "home"), filepath.Join(dir, "work", "bin")
	for _, d := range []string{work, home, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// bin/quro is this test binary, which runs quro's main when called
	// quro (TestMain); quro on PATH too, for the examples that say quro.
	if err := os.Symlink(self, filepath.Join(bin, "quro")); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "QURO_") || k == "XDG_DATA_HOME" || k == "HOME" || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	sh := startShell(t, work, env)
	port := "" // the port quro serve chose, once an example started it
	for _, c := range cmds {
		name := fmt.Sprintf("README.md:%d", c.line)
		code := c.code
		switch {
		case c.needs != "":
			t.Run(name, func(t *testing.T) { t.Skipf("needs %s: %s", c.needs, code) })
			continue
		case strings.HasPrefix(code, "make "):
			t.Run(name, func(t *testing.T) {
				t.Skipf("%s: how the whole suite (this test included) is run, not run from inside it", code)
			})
			continue
		}
		if c.keepsRunning {
			if port != "" {
				t.Fatalf("%s: a second server (%s)", name, code)
			}
			port = sh.startServer(t, name, strings.ReplaceAll(code, ":7070", ":0"))
			t.Logf("%s: %s (on port %s)", name, code, port)
			continue
		}
		if strings.Contains(code, ":7070") {
			if port == "" {
				t.Fatalf("%s uses port 7070 before any example started the server: %s", name, code)
			}
			code = strings.ReplaceAll(code, ":7070", ":"+port)
		}
		if c.terminal {
			rc, out := runOnTerminal(t, work, env, code, c.key)
			checkExample(t, name, c, rc, out)
			continue
		}
		rc, out := sh.run(t, code)
		checkExample(t, name, c, rc, out)
	}
	sh.close(t)
}

var apiError = regexp.MustCompile(`(?m)^\{\s*"error"\s*:\s*\{\s*"code"`)

func checkExample(t *testing.T, name string, c readmeCommand, rc int, out string) {
	t.Helper()
	switch {
	case rc != c.exit:
		t.Errorf("%s: %s\nexited %d, want %d; output:\n%s", name, c.code, rc, c.exit, out)
	case apiError.MatchString(out):
		t.Errorf("%s: %s\nanswered an API error:\n%s", name, c.code, out)
	default:
		t.Logf("%s: %s (exit %d, %d bytes of output)", name, c.code, rc, len(out))
	}
}

// readmeCommand is one command of a ```sh block of the README.
type readmeCommand struct {
	line         int    // where it starts in README.md
	code         string // the command without its comment
	comment      string
	needs        string // from "needs: ...": not run here
	exit         int    // from "exits N"
	keepsRunning bool   // from "keeps running"
	terminal     bool   // from "needs a terminal"
	key          byte   // from "Ctrl-X": the key that ends it on a terminal
}

var (
	needsMarker = regexp.MustCompile(`\bneeds: ([^;]+)`)
	exitsMarker = regexp.MustCompile(`\bexits (\d+)\b`)
	ctrlKey     = regexp.MustCompile(`\bCtrl-(\S)`)
)

// readmeCommands returns the commands of the ```sh blocks of a markdown
// text: a line, or lines joined by a trailing backslash, with its comment
// (a # outside quotes, at the start or after a blank) split off; lines
// that are only a comment are left out.
func readmeCommands(md string) ([]readmeCommand, error) {
	var cmds []readmeCommand
	in := false
	var pending string
	start := 0
	for i, line := range strings.Split(md, "\n") {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if in && pending != "" {
				return nil, fmt.Errorf("README.md:%d: a block ends inside a continued line", n)
			}
			in = !in && strings.TrimPrefix(trimmed, "```") == "sh"
			continue
		}
		if !in {
			continue
		}
		if pending == "" {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok && !strings.Contains(line, "#") {
			pending += cont + "\n"
			continue
		}
		text := pending + line
		pending = ""
		code, comment := splitComment(text)
		code = strings.TrimSpace(code)
		if code == "" {
			continue
		}
		c := readmeCommand{line: start, code: code, comment: comment}
		if m := needsMarker.FindStringSubmatch(comment); m != nil {
			c.needs = strings.TrimSpace(m[1])
			for _, what := range strings.Split(c.needs, ",") {
				if w := strings.Fields(what); len(w) == 0 || (w[0] != "root" && w[0] != "network") {
					return nil, fmt.Errorf("README.md:%d: needs %q: only root and network are reasons not to run an example", start, c.needs)
				}
			}
		}
		if m := exitsMarker.FindStringSubmatch(comment); m != nil {
			c.exit, _ = strconv.Atoi(m[1])
		}
		c.keepsRunning = strings.Contains(comment, "keeps running")
		if strings.Contains(comment, "needs a terminal") {
			m := ctrlKey.FindStringSubmatch(comment)
			if m == nil {
				return nil, fmt.Errorf("README.md:%d: a terminal example must say which Ctrl key ends it", start)
			}
			c.terminal, c.key = true, m[1][0]&0x1f
		}
		cmds = append(cmds, c)
	}
	if in {
		return nil, errors.New("README.md: a ```sh block is not closed")
	}
	return cmds, nil
}

// splitComment splits a shell line at its comment: a # outside quotes at
// the start of a word.
func splitComment(s string) (code, comment string) {
	var quote rune
	prev := ' '
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t' || prev == '\n'):
			return s[:i], strings.TrimSpace(s[i+1:])
		}
		prev = r
	}
	return s, ""
}

// shell is one bash that runs the examples in turn, so that they share
// variables and the working directory as they would in a reader's shell.
type shell struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	mark  string // ends each command's output, with its exit code
	dir   string
	bg    []string // pids of commands started in the background
}

func startShell(t *testing.T, dir string, env []string) *shell {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	sh := &shell{lines: make(chan string, 64), mark: "quro-readme-" + hex.EncodeToString(b), dir: dir}
	sh.cmd = exec.Command("bash", "--noprofile", "--norc")
	sh.cmd.Dir, sh.cmd.Env = dir, env
	var err error
	if sh.in, err = sh.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := sh.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.cmd.Stderr = sh.cmd.Stdout
	if err := sh.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			sh.lines <- sc.Text()
		}
		close(sh.lines)
	}()
	t.Cleanup(func() {
		sh.in.Close()
		sh.cmd.Process.Kill()
		sh.cmd.Wait()
	})
	return sh
}

// commandLimit bounds one example that hangs; a working one ends on its own.
const commandLimit = 5 * time.Minute

// run runs code in the shell, its standard input empty and its stderr
// with its stdout, and returns its exit code and output.
func (sh *shell) run(t *testing.T, code string) (int, string) {
	t.Helper()
	fmt.Fprintf(sh.in, "{ %s\n} </dev/null 2>&1; printf '\\n%s %%d\\n' $?\n", code, sh.mark)
	var out []string
	limit := time.NewTimer(commandLimit)
	defer limit.Stop()
	for {
		select {
		case l, ok := <-sh.lines:
			if !ok {
				t.Fatalf("the shell ended during %s; output:\n%s", code, strings.Join(out, "\n"))
			}
			if rest, found := strings.CutPrefix(l, sh.mark+" "); found {
				rc, _ := strconv.Atoi(rest)
				return rc, strings.TrimSuffix(strings.Join(out, "\n"), "\n")
			}
			out = append(out, l)
		case <-limit.C:
			t.Fatalf("%s has not ended in %v; output so far:\n%s", code, commandLimit, strings.Join(out, "\n"))
		}
	}
}

// startServer starts code (quro serve) in the background with its output
// in a pipe, and returns the port it listens on once it says so.
func (sh *shell) startServer(t *testing.T, name, code string) string {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "serve.out")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rc, out := sh.run(t, fmt.Sprintf("%s >%q 2>&1 </dev/null &\necho $!", code, fifo))
	if rc != 0 {
		t.Fatalf("%s: %s: %d\n%s", name, code, rc, out)
	}
	sh.bg = append(sh.bg, strings.TrimSpace(out))
	f, err := os.Open(fifo) // the server holds the other end
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	listening := regexp.MustCompile(`^quro listening on http://[^ ]+:(\d+)$`)
	sc := bufio.NewScanner(f)
	var seen []string
	for sc.Scan() {
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			go io.Copy(io.Discard, f)
			return m[1]
		}
		seen = append(seen, sc.Text())
	}
	t.Fatalf("%s: %s ended without listening:\n%s", name, code, strings.Join(seen, "\n"))
	return ""
}

// close stops what the examples left running (the server), as its
// reader would with Ctrl-C, and ends the shell.
func (sh *shell) close(t *testing.T) {
	for _, pid := range sh.bg {
		if rc, out := sh.run(t, fmt.Sprintf("kill -TERM %s; wait %s", pid, pid)); rc != 0 {
			t.Errorf("the server (pid %s) ended with %d after SIGINT:\n%s", pid, rc, out)
		}
	}
	sh.in.Close()
	if err := sh.cmd.Wait(); err != nil {
		t.Errorf("the examples' shell: %v", err)
	}
}

// runOnTerminal runs code on a new pseudo-terminal (with the shell's
// directory and environment, not its variables). Once it has printed its
// first words it is sent a command whose answer proves a live shell is
// attached (echo quro-term-$((6*7)) is answered quro-term-42, which the
// echo of the typing does not show); then it is sent key, and what it
// does then is the example's result: its exit code and what it printed.
func runOnTerminal(t *testing.T, dir string, env []string, code string, key byte) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", code)
	cmd.Dir, cmd.Env = dir, env
	p, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out bytes.Buffer
	buf := make([]byte, 4096)
	readUntil := func(want string) error {
		for !strings.Contains(out.String(), want) {
			n, err := p.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				return fmt.Errorf("%w before it showed %q", err, want)
			}
		}
		return nil
	}
	n, err := p.Read(buf) // its first words: it is attached
	out.Write(buf[:n])
	if err == nil {
		_, err = p.Write([]byte("echo quro-term-$((6*7))\r"))
	}
	if err == nil {
		err = readUntil("quro-term-42")
	}
	if err == nil {
		_, err = p.Write([]byte{key})
	}
	if err != nil {
		t.Errorf("%s on a terminal: %v; it printed:\n%s", code, err, out.String())
	}
	done := make(chan struct{})
	go func() {
		io.Copy(&out, p) // until it exits (EIO)
		close(done)
	}()
	werr := cmd.Wait()
	p.Close()
	<-done
	rc := 0
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		rc = ee.ExitCode()
	} else if werr != nil {
		t.Fatalf("%s: %v", code, werr)
	}
	return rc, out.String()
}
