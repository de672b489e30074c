package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// cliEnv is the environment of a quro subprocess: no server or token
// named, the data directory given by --data.
func cliEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QURO_") {
			env = append(env, kv)
		}
	}
	return append(env, "TERM=xterm")
}

// quroBin is the quro binary testscript put on $PATH (this test binary,
// running Main as a separate process).
func quroBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("quro")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// cli runs quro as a separate process and returns stdout, stderr and the
// exit status.
func cli(t testing.TB, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(quroBin(t), args...)
	cmd.Env = cliEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// auditPaths returns the access path of each audit entry of capability.
func auditPaths(t *testing.T, data, capability string) []string {
	t.Helper()
	out, errs, code := quro(t, "", "audit", "--data", data, "--json", "--capability", capability)
	if code != 0 {
		t.Fatalf("audit: %s", errs)
	}
	var log struct {
		Entries []struct {
			Path string `json:"path"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &log); err != nil {
		t.Fatalf("audit json: %v\n%s", err, out)
	}
	var paths []string
	for _, e := range log.Entries {
		paths = append(paths, e.Path)
	}
	return paths
}

// TestCLIThroughTheRunningServer: with quro serve running on the data
// directory, separate quro processes share its sessions and their state
// (a Python variable survives from one quro run to the next), and their
// calls are the server's (audited as rest), with the admin token read from
// the data directory and never printed.
func TestCLIThroughTheRunningServer(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	settled(t, srv)
	if out, errs, code := cli(t, "run", "--data", srv.data, "-c", "z = 41"); code != 0 {
		t.Fatalf("z = 41: %d %q %q", code, out, errs)
	}
	out, errs, code := cli(t, "run", "--data", srv.data, "-c", "print(z + 1)")
	if code != 0 || out != "42\n" || errs != "" {
		t.Fatalf("print(z + 1) in a second process: %d %q %q", code, out, errs)
	}
	// stdout and stderr stay apart through the server too.
	out, errs, code = cli(t, "run", "--data", srv.data, "-l", "sh", "-c", "echo out; echo err >&2; exit 4")
	if code != 4 || out != "out\n" || !strings.Contains(errs, "err\n") || !strings.Contains(errs, "exit code 4") {
		t.Fatalf("sh: %d %q %q", code, out, errs)
	}
	// Settings of an in-process App do not reach the server: it says so.
	out, errs, code = cli(t, "run", "--data", srv.data, "--max-stdout", "100", "-c", "print(z)")
	if code != 0 || out != "41\n" || !strings.Contains(errs, "--max-stdout applies in-process only") {
		t.Fatalf("--max-stdout: %d %q %q", code, out, errs)
	}
	// quro audit reads the data directory itself, beside the server, whose
	// writer puts a call's entry in the store after a short linger (audit's
	// batching): the last call's entry may not be there yet at the first read.
	var paths []string
	for deadline := time.Now().Add(time.Minute); ; {
		if paths = auditPaths(t, srv.data, "run_code"); len(paths) >= 4 || time.Now().After(deadline) {
			break
		}
	}
	if len(paths) != 4 || strings.Join(paths, ",") != "rest,rest,rest,rest" {
		t.Fatalf("run_code audit paths %v, want rest ×4", paths)
	}

	// Sessions: made, listed, given variables and destroyed on the server.
	out, errs, code = cli(t, "session", "create", "--data", srv.data, "work")
	if code != 0 || !regexp.MustCompile(`^[0-9a-f]{32} work\n$`).MatchString(out) {
		t.Fatalf("session create: %d %q %q", code, out, errs)
	}
	admin := []string{"Authorization", "Bearer " + srv.token}
	if r := do(t, "GET", srv.url+"/v1/sessions/work", "", "", admin...); r.status != 200 {
		t.Fatalf("the server does not know the session the CLI made: %d %s", r.status, r.body)
	}
	if out, errs, code = cli(t, "session", "list", "--data", srv.data); code != 0 || !strings.Contains(out, " work ") {
		t.Fatalf("session list: %d %q %q", code, out, errs)
	}
	if out, errs, code = cli(t, "session", "env", "--data", srv.data, "work", "GREETING=hello"); code != 0 || !strings.Contains(out, "GREETING=hello") {
		t.Fatalf("session env: %d %q %q", code, out, errs)
	}
	if out, errs, code = cli(t, "exec", "--data", srv.data, "-s", "work", "--", "echo $GREETING; cd /tmp"); code != 0 || out != "hello\n" {
		t.Fatalf("exec: %d %q %q", code, out, errs)
	}
	if out, errs, code = cli(t, "exec", "--data", srv.data, "-s", "work", "--", "pwd"); code != 0 || out != "/tmp\n" {
		t.Fatalf("exec keeps the directory: %d %q %q", code, out, errs)
	}
	if out, errs, code = cli(t, "session", "destroy", "--data", srv.data, "work"); code != 0 || !strings.Contains(out, "destroyed") {
		t.Fatalf("session destroy: %d %q %q", code, out, errs)
	}
	if r := do(t, "GET", srv.url+"/v1/sessions/work", "", "", admin...); r.status != 404 {
		t.Fatalf("the session lives on the server after destroy: %d %s", r.status, r.body)
	}
	for _, c := range []string{"create_session", "set_session_env", "terminal_exec", "destroy_session"} {
		for _, p := range auditPaths(t, srv.data, c) {
			if p != "rest" {
				t.Errorf("%s audited as %q, want rest", c, p)
			}
		}
	}
	// quro call too, with the data directory's admin token.
	if out, errs, code = cli(t, "call", "--data", srv.data, "run_code", `{"code":"print(z)"}`); code != 0 || out != "41\n" {
		t.Fatalf("call: %d %q %q", code, out, errs)
	}
}

// TestServeMarkerLifecycle: quro serve writes the marker with its address
// and pid when it listens and removes it when it stops; without it the CLI
// runs in-process again.
func TestServeMarkerLifecycle(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	cmd := exec.Command(quroBin(t), append([]string{"serve"}, testServeFlags([]string{"--addr", "127.0.0.1:0", "--data", data})...)...)
	cmd.Env = cliEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	br := bufio.NewReader(stdout)
	var url string
	for url == "" {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("serve printed no address: %v", err)
		}
		if u, ok := strings.CutPrefix(strings.TrimSpace(line), "quro listening on "); ok {
			url = u
		}
	}
	go io.Copy(io.Discard, br)
	m, err := readMarkerFile(filepath.Join(data, ServeMarker))
	if err != nil || m.URL != url || m.PID != cmd.Process.Pid {
		t.Fatalf("marker %+v %v; want url %s pid %d", m, err, url, cmd.Process.Pid)
	}
	fi, _ := os.Stat(filepath.Join(data, ServeMarker))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker mode %v", fi.Mode().Perm())
	}
	if out, errs, code := cli(t, "run", "--data", data, "-c", "v = 7"); code != 0 {
		t.Fatalf("%d %q %q", code, out, errs)
	}
	if out, errs, code := cli(t, "run", "--data", data, "-c", "print(v)"); code != 0 || out != "7\n" {
		t.Fatalf("%d %q %q", code, out, errs)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, ServeMarker)); !os.IsNotExist(err) {
		t.Fatalf("the marker outlived the server: %v", err)
	}
	// In-process now: the variable is not there, and the run is the CLI's.
	out, errs, code := cli(t, "run", "--data", data, "-c", "print(v)")
	if code == 0 || !strings.Contains(errs, "NameError") {
		t.Fatalf("in-process after the server stopped: %d %q %q", code, out, errs)
	}
	if paths := auditPaths(t, data, "run_code"); strings.Join(paths, ",") != "rest,rest,cli" {
		t.Fatalf("audit paths %v, want rest,rest,cli", paths)
	}
}

// listenAs opens a TCP listener on loopback whose socket belongs to uid
// (as another local user's would): the socket takes the fsuid of the
// thread that makes it.
func listenAs(t *testing.T, uid int) net.Listener {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	syscall.Setfsuid(uid)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	syscall.Setfsuid(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// writeMarker plants a serve marker in data.
func writeMarker(t *testing.T, data string, m serveMarker, mode os.FileMode) string {
	t.Helper()
	file := filepath.Join(data, ServeMarker)
	os.MkdirAll(filepath.Dir(file), 0o700)
	b, _ := json.Marshal(m)
	if err := os.WriteFile(file, b, mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(file, mode)
	return file
}

// TestPlantedMarkerGetsNoToken: a marker the CLI cannot trust is ignored
// and the command runs in-process; the admin token never reaches whoever
// listens at its address. Planted markers: a live pid but a port another
// user listens on (the server died, its port was taken), a pid that is
// gone, a file another user owns, a file others may write.
func TestPlantedMarkerGetsNoToken(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make another user's socket and file")
	}
	const nobody = 65534
	var (
		mu   sync.Mutex
		seen []string
	)
	hostile := listenAs(t, nobody)
	go http.Serve(hostile, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"session":"x","stdout":"hijacked\n","exit_code":0}`))
	}))
	hostileURL := "http://" + hostile.Addr().String()
	// Someone else's socket is seen as theirs in /proc/net/tcp.
	ap := netip.MustParseAddrPort(hostile.Addr().String())
	if err := listenedBy(ap, nobody); err != nil {
		t.Fatalf("the planted listener is not uid %d's: %v", nobody, err)
	}

	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		pid   int
		mode  os.FileMode
		owner int
		url   string
		why   string
	}{
		{"another user's port", os.Getpid(), 0o600, 0, hostileURL, "listened on by uid 65534"},
		{"dead pid", gone.Process.Pid, 0o600, 0, hostileURL, "is gone"},
		{"another user's file", os.Getpid(), 0o600, nobody, hostileURL, "does not belong to the owner of"},
		{"world-writable file", os.Getpid(), 0o666, 0, hostileURL, "writable by others"},
		{"not http", os.Getpid(), 0o600, 0, "https://" + hostile.Addr().String(), "bad url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			if err := os.WriteFile(filepath.Join(data, AdminTokenFile), []byte("quro_admin_secret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			file := writeMarker(t, data, serveMarker{URL: tc.url, PID: tc.pid, Started: time.Now()}, tc.mode)
			if tc.owner != 0 {
				os.Chown(file, tc.owner, tc.owner)
			}
			if _, err := findServer(data); err == nil || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("the planted marker: %v; want refused because %q", err, tc.why)
			}
			// The real thing: a quro process on that data directory.
			out, errs, code := cli(t, "run", "--data", data, "-l", "sh", "-c", "echo local")
			if code != 0 || out != "local\n" {
				t.Fatalf("%d %q %q", code, out, errs)
			}
			if paths := auditPaths(t, data, "run_code"); strings.Join(paths, ",") != "cli" {
				t.Fatalf("audit paths %v, want cli", paths)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Fatalf("the planted listener was called: %q", seen)
	}
}

// ptyReader collects what a process prints on its terminal and lets a
// test wait for a pattern in what came after the last match.
type ptyReader struct {
	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte
	pos  int
	eof  bool
}

func newPTYReader(f *os.File) *ptyReader {
	r := &ptyReader{}
	r.cond = sync.NewCond(&r.mu)
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			r.mu.Lock()
			r.buf = append(r.buf, b[:n]...)
			if err != nil {
				r.eof = true
			}
			r.cond.Broadcast()
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return r
}

// waitFor returns the first match of re after the previous one, waiting
// for the output; it fails when the terminal closes first.
func (r *ptyReader) waitFor(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if loc := rx.FindSubmatchIndex(r.buf[r.pos:]); loc != nil {
			var m []string
			for i := 0; i < len(loc); i += 2 {
				if loc[i] >= 0 {
					m = append(m, string(r.buf[r.pos+loc[i]:r.pos+loc[i+1]]))
				} else {
					m = append(m, "")
				}
			}
			r.pos += loc[1]
			return m
		}
		if r.eof {
			t.Fatalf("the terminal closed before %q; it showed:\n%q", re, r.buf[r.pos:])
		}
		r.cond.Wait()
	}
}

// startTerm runs `quro term` on a new pseudo-terminal of rows×cols.
func startTerm(t *testing.T, rows, cols uint16, args ...string) (*exec.Cmd, *os.File, *ptyReader) {
	t.Helper()
	cmd := exec.Command(quroBin(t), append([]string{"term"}, args...)...)
	cmd.Env = cliEnv()
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); f.Close() })
	return cmd, f, newPTYReader(f)
}

// TestTermThroughTheServer: quro term attaches a real terminal (a pty) to
// the server's PTY of the session over WebSocket: keys go in, the echo and
// output come back, the window size follows (at start and on SIGWINCH),
// Ctrl-] detaches leaving the shell running (a second quro term sees the
// scrollback and the shell's state), and the shell's exit status is quro
// term's.
func TestTermThroughTheServer(t *testing.T) {
	t.Parallel() // its own server, data directory and terminal
	srv := startServer(t)
	settled(t, srv)
	cmd, f, r := startTerm(t, 30, 90, "--data", srv.data)
	r.waitFor(t, `\[quro: session default; Ctrl-\] detaches\]`)
	f.Write([]byte("K=kept; echo hi-$((6*7))\r"))
	r.waitFor(t, `hi-\$\(\(6\*7\)\)`) // the echo of what was typed
	r.waitFor(t, `hi-42`)             // its output
	f.Write([]byte("echo S-$(stty size | tr ' ' x)-E\r"))
	if m := r.waitFor(t, `S-(\d+x\d+)-E`); m[1] != "30x90" {
		t.Fatalf("size at start %s, want 30x90", m[1])
	}
	// A resize of the local terminal sends SIGWINCH to quro term, which
	// resizes the remote PTY; ask until the shell sees it (each answer is
	// waited for).
	if err := pty.Setsize(f, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	for {
		f.Write([]byte("echo S-$(stty size | tr ' ' x)-E\r"))
		if m := r.waitFor(t, `S-(\d+x\d+)-E`); m[1] == "40x100" {
			break
		}
	}
	f.Write([]byte{detachKey})
	r.waitFor(t, `detached; the shell keeps running: quro term default attaches again`)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("quro term after detaching: %v", err)
	}

	// Attach again: the scrollback shows what was there, the shell still
	// has K, and its exit status becomes quro term's.
	cmd, f, r = startTerm(t, 30, 90, "--data", srv.data, "default")
	r.waitFor(t, `hi-42`)
	f.Write([]byte("echo again-$K\r"))
	r.waitFor(t, `again-kept`)
	f.Write([]byte("exit 3\r"))
	r.waitFor(t, `the shell exited with status 3`)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("quro term exit status: %v, want 3", err)
	}
	if paths := auditPaths(t, srv.data, "get_session_status"); len(paths) < 2 || paths[0] != "rest" {
		t.Fatalf("the sessions were looked up as %v, want through the server", paths)
	}
}

// TestCallTokenMessages: a server that wants a token the CLI has not got
// is answered with what to set (--token-file, QURO_TOKEN) and where the
// server keeps its admin token, not with HTTP headers; the data
// directory's admin token is used for the server running on it, and never
// sent to another server.
func TestCallTokenMessages(t *testing.T) {
	srv := startServer(t)
	other := startServer(t)
	settled(t, srv)
	settled(t, other)
	t.Setenv("QURO_URL", "")
	t.Setenv("QURO_TOKEN", "")
	empty := t.TempDir()
	out, errs, code := quro(t, "", "call", "--server", srv.url, "--data", empty, "help")
	if code != 1 || out != "" {
		t.Fatalf("%d %q %q", code, out, errs)
	}
	for _, want := range []string{"--token-file FILE", "QURO_TOKEN=<token>", filepath.Join(empty, AdminTokenFile), "quro token create"} {
		if !strings.Contains(errs, want) {
			t.Errorf("the message does not say %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "Authorization") || strings.Contains(errs, "Bearer") {
		t.Errorf("the message speaks of HTTP headers:\n%s", errs)
	}
	// The server running on --data: its admin.token, found by the CLI,
	// whether named with --server or found through the marker.
	for _, args := range [][]string{
		{"call", "--server", srv.url, "--data", srv.data, "list_sessions"},
		{"call", "--server", strings.Replace(srv.url, "127.0.0.1", "localhost", 1), "--data", srv.data, "list_sessions"},
		{"call", "--data", srv.data, "list_sessions"},
	} {
		if out, errs, code := quro(t, "", args...); code != 0 || !strings.Contains(out, "default") {
			t.Fatalf("%v: %d %q %q", args, code, out, errs)
		}
	}
	// Another server gets no token of this data directory.
	out, errs, code = quro(t, "", "call", "--server", other.url, "--data", srv.data, "list_sessions")
	if code != 1 || !strings.Contains(errs, "none was found") {
		t.Fatalf("another server: %d %q %q", code, out, errs)
	}
	// A wrong token says where it came from, never what it is.
	t.Setenv("QURO_TOKEN", "quro_bogus_value")
	out, errs, code = quro(t, "", "call", "--server", srv.url, "--data", empty, "help")
	if code != 1 || !strings.Contains(errs, "the token came from QURO_TOKEN") || strings.Contains(errs, "bogus_value") {
		t.Fatalf("wrong token: %d %q %q", code, out, errs)
	}
	// quro run says the same.
	t.Setenv("QURO_TOKEN", "")
	t.Setenv("QURO_URL", srv.url)
	out, errs, code = quro(t, "", "run", "--data", empty, "-c", "print(1)")
	if code != 1 || !strings.Contains(errs, "--token-file FILE") {
		t.Fatalf("run: %d %q %q", code, out, errs)
	}
}

// TestTermInProcess: without a server quro term runs the terminal itself;
// Ctrl-] ends it, and the shell's exit status is quro term's.
func TestTermInProcess(t *testing.T) {
	data := t.TempDir()
	cmd, f, r := startTerm(t, 24, 80, "--data", data)
	r.waitFor(t, `\[quro: session default; Ctrl-\] detaches\]`)
	f.Write([]byte("echo in-$((40+2))\r"))
	r.waitFor(t, `in-42`)
	f.Write([]byte{detachKey})
	r.waitFor(t, `detached; the in-process terminal ends with this command`)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("quro term after detaching: %v", err)
	}
	cmd, f, r = startTerm(t, 24, 80, "--data", data)
	r.waitFor(t, `\[quro: session default`)
	f.Write([]byte("exit 5\r"))
	r.waitFor(t, `the shell exited with status 5`)
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Fatalf("quro term exit status: %v, want 5", err)
	}
}
