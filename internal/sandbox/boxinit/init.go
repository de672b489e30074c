// Package boxinit is the sandbox's init child: the quro binary re-executes
// itself with Arg, and this package's init applies the layers that act on
// the process itself (rlimits, the uid switch, no_new_privs, Landlock,
// seccomp), then execs the user program in its own place.
//
// It imports nothing but a few small standard packages (no fmt, no
// encoding/json, not even golang.org/x/sys/unix) so that Go initialises it
// before the heavy packages of the binary: package initialisation runs in
// import-path order among the packages whose imports are done, and every
// init that runs before this hook is paid by each sandboxed process start
// (check with GODEBUG=inittrace=1 quro __quro_sandbox_init-probe). The
// server does the thinking: it compiles the Landlock rules and the seccomp
// program (package sandbox) and passes them in the Policy; the child only
// makes the system calls.
package boxinit

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

// Arg is the hidden first argument with which the quro binary re-executes
// itself as the sandbox's init child (inside the bubblewrap box when that
// layer is on). The child applies, in this order:
//
//  0. give every signal it inherited ignored its default action back
//     (defaultSignals; the box init and a spawner do the same);
//  1. mark every inherited descriptor from STATUS_FD up close-on-exec;
//  2. wait for the server's go-ahead (cgroup join) when POLICY asks;
//  3. read the program's environment from POLICY's env_fd (see EncodeEnv;
//     the init child's own environment is the server's fixed one);
//  4. rlimits;
//  5. the uid switch, the program's lookup in its own PATH, no_new_privs,
//     then Landlock;
//  6. seccomp;
//  7. report ReadyByte on the status fd, and exec with that environment.
//
// argv: quro __quro_sandbox_init STATUS_FD LIMITS POLICY -- PROGRAM ARGS...
const Arg = "__quro_sandbox_init"

// ProbeArg starts the binary only to exit 0 at once (doctor's namespace
// probe: being started is the answer).
const ProbeArg = Arg + "-probe"

// ReadyByte is what the init child writes on the status fd just before it
// execs; anything else is the reason it could not.
const ReadyByte = 'R'

// Rule allows Access beneath Path (Landlock path-beneath rule).
type Rule struct {
	Path   string
	Access uint64
}

// Policy is the POLICY argument: what the init child applies, compiled by
// the server. It travels in argv as Encode renders it.
type Policy struct {
	WaitFD int
	// EnvFD is a descriptor (a sealed memfd) holding the user program's
	// environment in EncodeEnv's form; 0: the program gets an empty one.
	// The init child and bubblewrap themselves run with a fixed
	// environment the server built: session variables reach only the
	// program, through execve, after every privilege is dropped.
	EnvFD int
	UID   int // switch to this uid and gid before the other layers
	// Landlock: the handled access rights (LLFS == 0: no Landlock), the
	// rights a rule on a non-directory may keep, and the rules in order.
	LLFS, LLNet, LLScoped, LLFileMask uint64
	Rules                             []Rule
	// Seccomp is the classic BPF program, 8 bytes per instruction in the
	// kernel's struct sock_filter layout; empty for none.
	Seccomp []byte
}

// Encode renders p as space-separated key=value fields.
func (p *Policy) Encode() string {
	var b []byte
	field := func(k, v string) {
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = append(b, k+"="+v...)
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	field("wait_fd", strconv.Itoa(p.WaitFD))
	if p.EnvFD > 0 {
		field("env_fd", strconv.Itoa(p.EnvFD))
	}
	field("uid", strconv.Itoa(p.UID))
	field("ll", u(p.LLFS)+","+u(p.LLNet)+","+u(p.LLScoped)+","+u(p.LLFileMask))
	for _, r := range p.Rules {
		field("rule", u(r.Access)+","+strconv.Quote(r.Path))
	}
	const hex = "0123456789abcdef"
	h := make([]byte, 0, 2*len(p.Seccomp))
	for _, c := range p.Seccomp {
		h = append(h, hex[c>>4], hex[c&15])
	}
	field("seccomp", string(h))
	return string(b)
}

// DecodePolicy parses what Encode rendered.
func DecodePolicy(s string) (*Policy, error) {
	p := &Policy{}
	bad := func(why string) (*Policy, error) { return nil, errors.New("bad policy: " + why) }
	for s != "" {
		k, rest, ok := cut(s, '=')
		if !ok {
			return bad("no value in " + strconv.Quote(s))
		}
		var v string
		if k == "rule" {
			// ACCESS,"PATH": the path is quoted and may hold spaces.
			a, q, ok := cut(rest, ',')
			if !ok {
				return bad("rule " + strconv.Quote(rest))
			}
			qp, err := strconv.QuotedPrefix(q)
			if err != nil {
				return bad("rule path: " + err.Error())
			}
			path, _ := strconv.Unquote(qp)
			access, err := strconv.ParseUint(a, 10, 64)
			if err != nil {
				return bad("rule access: " + err.Error())
			}
			p.Rules = append(p.Rules, Rule{Path: path, Access: access})
			rest = q[len(qp):]
		} else {
			v, rest, _ = cut(rest, ' ')
			rest = " " + rest
		}
		if rest != "" && rest[0] != ' ' {
			return bad("junk after " + k)
		}
		s = trimSpace1(rest)
		var err error
		switch k {
		case "rule":
		case "wait_fd":
			p.WaitFD, err = strconv.Atoi(v)
		case "env_fd":
			p.EnvFD, err = strconv.Atoi(v)
		case "uid":
			p.UID, err = strconv.Atoi(v)
		case "ll":
			f := split(v, ',')
			if len(f) != 4 {
				return bad("ll " + strconv.Quote(v))
			}
			for i, dst := range []*uint64{&p.LLFS, &p.LLNet, &p.LLScoped, &p.LLFileMask} {
				if *dst, err = strconv.ParseUint(f[i], 10, 64); err != nil {
					break
				}
			}
		case "seccomp":
			if len(v)%2 != 0 {
				return bad("seccomp: odd length")
			}
			if len(v) > 0 {
				p.Seccomp = make([]byte, len(v)/2)
			}
			for i := range p.Seccomp {
				n, perr := strconv.ParseUint(v[2*i:2*i+2], 16, 8)
				if perr != nil {
					return bad("seccomp: " + perr.Error())
				}
				p.Seccomp[i] = byte(n)
			}
		default:
			return bad("unknown field " + strconv.Quote(k))
		}
		if err != nil {
			return bad(k + ": " + err.Error())
		}
	}
	return p, nil
}

// The hook runs in package initialisation so that every binary that links
// the sandbox (quro itself and its test binaries) can serve as the init child.
func init() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case Arg:
			defaultSignals()
			os.Exit(initMain(os.Args[2:]))
		case ProbeArg:
			os.Exit(0)
		case BoxArg:
			defaultSignals()
			os.Exit(boxMain(os.Args[2:]))
		case SpawnerArg:
			defaultSignals()
			os.Exit(spawnerMain(os.Args[2:]))
		}
	}
}

// Signal handlers as rt_sigaction(2) reads and sets them.
const (
	sigDfl = 0
	sigIgn = 1
)

// defaultSignals gives every signal this process inherited ignored its
// default action back, first thing in the box init, a spawner and the
// init child. An ignored signal stays ignored through fork and exec (the
// Go runtime, too, keeps an inherited SIG_IGN of SIGHUP and SIGINT), so a
// server started with them ignored — under nohup, as a script's
// background job, as make test's side runs are — handed them on to every
// program of every box: an interrupt (SIGINT, the terminal's Ctrl-C, a
// command's timeout) reached nothing and each run was killed at the end
// of its grace, and a shell cannot even trap a signal ignored at its
// start. A program starts with every disposition at its default,
// whatever the server's start. The signals the runtime handles are left
// alone (exec resets them to their default).
func defaultSignals() {
	for sig := 1; sig <= 64; sig++ {
		if sig == int(syscall.SIGKILL) || sig == int(syscall.SIGSTOP) {
			continue
		}
		// The kernel's struct sigaction, 32 bytes on amd64 and arm64
		// (handler, flags, restorer, mask): read, then written back
		// with the handler alone changed.
		var act [4]uint64
		if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), 0,
			uintptr(unsafe.Pointer(&act[0])), 8, 0, 0); errno != 0 || act[0] != sigIgn {
			continue
		}
		act[0] = sigDfl
		_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act[0])), 0, 8, 0, 0)
	}
}

// initMain returns only when it could not exec the program.
func initMain(args []string) int {
	// Every layer below acts on the calling thread (and Landlock and seccomp
	// on all threads); the exec must come from the same thread.
	runtime.LockOSThread()
	if len(args) < 5 || args[3] != "--" {
		os.Stderr.WriteString("quro sandbox init: bad arguments\n")
		return 127
	}
	fd, err := strconv.Atoi(args[0])
	if err != nil || fd < 3 {
		os.Stderr.WriteString("quro sandbox init: bad status fd\n")
		return 127
	}
	status := os.NewFile(uintptr(fd), "status")
	fail := func(err error) int {
		_, _ = status.WriteString(err.Error()) // the server reads it as the reason; if it is gone, so is the reader
		return 127
	}
	// Descriptors the server inherited without close-on-exec must not reach
	// user code: everything above the status fd closes at exec, and so does
	// the status fd itself. Below it are only 0-2 and the spec's ExtraFiles.
	if err := closeFrom(fd); err != nil {
		return fail(errors.New("close inherited descriptors: " + err.Error()))
	}
	pol, err := DecodePolicy(args[2])
	if err != nil {
		return fail(err)
	}
	if pol.WaitFD > 0 {
		// The server moves this process into the run's cgroups, then writes
		// one byte (or closes the pipe if it could not).
		var b [1]byte
		wait := os.NewFile(uintptr(pol.WaitFD), "wait")
		if n, _ := wait.Read(b[:]); n != 1 {
			return fail(errors.New("the server did not let the run start"))
		}
		wait.Close()
	}
	// The program's environment: read here, handed to nothing but the
	// final execve. This process itself keeps the fixed one it started
	// with (the loader and the Go runtime already read it).
	var env []string
	if pol.EnvFD > 0 {
		if env, err = readEnv(pol.EnvFD); err != nil {
			return fail(err)
		}
	}
	if err := applyLimits(args[1]); err != nil {
		return fail(err)
	}
	if pol.UID > 0 {
		if err := dropTo(pol.UID); err != nil {
			return fail(err)
		}
	}
	// Looked up in the program's own PATH, as execvp would, once this
	// process is the program's uid.
	prog := args[4:]
	path, err := LookPath(prog[0], lookupEnv(env, "PATH"))
	if err != nil {
		_, _ = status.WriteString(LookupFailure(err)) // as fail does
		return 127
	}
	if err := noNewPrivs(); err != nil {
		return fail(err)
	}
	if pol.LLFS != 0 {
		if err := applyLandlock(pol); err != nil {
			return fail(err)
		}
	}
	if len(pol.Seccomp) > 0 {
		if err := installSeccomp(pol.Seccomp); err != nil {
			return fail(err)
		}
	}
	_, _ = status.Write([]byte{ReadyByte}) // a server that went away learns nothing either way
	err = syscall.Exec(path, prog, env)
	// Too late for a start error: say it the way a shell would.
	os.Stderr.WriteString("quro sandbox: exec " + path + ": " + err.Error() + "\n")
	if errors.Is(err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// System call numbers and flags this package needs that package syscall
// lacks. Calls added to Linux since 5.1 have one number on every
// architecture; seccomp's is per architecture (sysSeccomp).
const (
	sysPidfdOpen           = 434
	sysCloseRange          = 436
	sysLandlockCreate      = 444
	sysLandlockAddRule     = 445
	sysLandlockRestrict    = 446
	closeRangeCloexec      = 1 << 2
	prSetNoNewPrivs        = 38
	oPath                  = 0x200000
	landlockRulePathBelow  = 1
	seccompSetModeFilter   = 1
	seccompFilterFlagTsync = 1
)

func noNewPrivs() error {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0, 0, 0, 0); errno != 0 {
		return errors.New("no_new_privs: " + errno.Error())
	}
	return nil
}

// applyLandlock restricts the calling thread (and what it execs) to the
// policy's rules.
func applyLandlock(p *Policy) error {
	attr := struct{ fs, net, scoped uint64 }{p.LLFS, p.LLNet, p.LLScoped}
	size := unsafe.Sizeof(attr.fs)
	if p.LLNet != 0 || p.LLScoped != 0 {
		size += unsafe.Sizeof(attr.net)
	}
	if p.LLScoped != 0 {
		size += unsafe.Sizeof(attr.scoped)
	}
	rfd, _, errno := syscall.Syscall(sysLandlockCreate, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return errors.New("landlock_create_ruleset: " + errno.Error())
	}
	defer syscall.Close(int(rfd))
	for _, r := range p.Rules {
		fd, err := syscall.Open(r.Path, oPath|syscall.O_CLOEXEC, 0)
		if err != nil {
			if err == syscall.ENOENT {
				continue // nothing there, nothing to allow
			}
			return errors.New("landlock: open " + r.Path + ": " + err.Error())
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			syscall.Close(fd)
			return errors.New("landlock: stat " + r.Path + ": " + err.Error())
		}
		access := r.Access
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			access &= p.LLFileMask
		}
		// struct landlock_path_beneath_attr is packed: u64, then s32.
		var rule [12]byte
		*(*uint64)(unsafe.Pointer(&rule[0])) = access & p.LLFS
		*(*int32)(unsafe.Pointer(&rule[8])) = int32(fd)
		_, _, errno := syscall.Syscall6(sysLandlockAddRule, rfd, landlockRulePathBelow, uintptr(unsafe.Pointer(&rule[0])), 0, 0, 0)
		syscall.Close(fd)
		if errno != 0 {
			return errors.New("landlock_add_rule " + r.Path + ": " + errno.Error())
		}
	}
	if err := noNewPrivs(); err != nil {
		return err
	}
	if _, _, errno := syscall.Syscall(sysLandlockRestrict, rfd, 0, 0); errno != 0 {
		return errors.New("landlock_restrict_self: " + errno.Error())
	}
	return nil
}

// installSeccomp loads the filter on every thread of the calling process.
// no_new_privs must already be set.
func installSeccomp(prog []byte) error {
	if sysSeccomp < 0 {
		return errors.New("seccomp: no system call number for " + runtime.GOARCH)
	}
	if len(prog)%8 != 0 || len(prog) == 0 || len(prog)/8 > 0xffff {
		return errors.New("seccomp: bad program")
	}
	filter := make([]syscall.SockFilter, len(prog)/8)
	for i := range filter {
		b := prog[8*i:]
		filter[i] = syscall.SockFilter{
			Code: uint16(b[0]) | uint16(b[1])<<8,
			Jt:   b[2],
			Jf:   b[3],
			K:    uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24,
		}
	}
	fprog := syscall.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := syscall.Syscall(uintptr(sysSeccomp), seccompSetModeFilter, seccompFilterFlagTsync, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return errors.New("seccomp: " + errno.Error())
	}
	return nil
}

// dropTo makes uid the calling thread's only identity. Only this thread:
// it is the one that execs the program, and exec ends every other thread
// of the process (which run no code of the user's); package syscall's
// Setresuid would stop every thread of the Go runtime three times over.
func dropTo(uid int) error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
		return errors.New("setgroups: " + errno.Error())
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(uid), uintptr(uid), uintptr(uid)); errno != 0 {
		return errors.New("setresgid " + strconv.Itoa(uid) + ": " + errno.Error())
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); errno != 0 {
		return errors.New("setresuid " + strconv.Itoa(uid) + ": " + errno.Error())
	}
	return nil
}

// closeFrom marks every descriptor >= fd close-on-exec.
func closeFrom(fd int) error {
	_, _, errno := syscall.Syscall(sysCloseRange, uintptr(fd), ^uintptr(0)>>32, closeRangeCloexec)
	if errno == 0 {
		return nil
	}
	// Kernels before 5.11: walk /proc/self/fd.
	entries, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return errors.New("close_range: " + errno.Error() + "; /proc/self/fd: " + rerr.Error())
	}
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n >= fd {
			syscall.CloseOnExec(n)
		}
	}
	return nil
}

// NoProgramByte begins the status message of a start whose program
// itself is the problem (LookPath failed: not in PATH, no such file, not
// an executable file), as opposed to the box or a layer: the server
// strips it and answers the caller's mistake as one.
const NoProgramByte = '\x01'

// LookupFailure is the status message of a failed LookPath: its text,
// after NoProgramByte when the lookup itself said no (not when the
// caller could not look as the program's uid).
func LookupFailure(err error) string {
	var pe *pathError
	if errors.As(err, &pe) {
		return string(rune(NoProgramByte)) + err.Error()
	}
	return err.Error()
}

// ErrNotFound is what LookPath's error wraps when there is no such program
// (sandbox.LookPath rewraps it as exec.ErrNotFound).
var ErrNotFound = errors.New("executable file not found in $PATH")

type pathError struct {
	msg string
	err error
}

func (e *pathError) Error() string { return e.msg }
func (e *pathError) Unwrap() error { return e.err }

// LookPath finds file in the sandbox's PATH (not the server's).
func LookPath(file, path string) (string, error) {
	if index(file, '/') >= 0 {
		if err := executable(file); err != nil {
			return "", &pathError{file + ": " + err.Error(), err}
		}
		return file, nil
	}
	for _, dir := range split(path, ':') {
		if dir == "" {
			continue
		}
		p := trimSlash(dir) + "/" + file
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", &pathError{file + ": " + ErrNotFound.Error() + " in PATH " + path, ErrNotFound}
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// applyLimits sets each non-zero limit of s ("cpu=1,as=2,...", see
// sandbox.Limits) as both soft and hard limit, never raising a limit above
// what the process already has.
func applyLimits(s string) error {
	for _, kv := range split(s, ',') {
		name, val, ok := cut(kv, '=')
		v, err := strconv.ParseUint(val, 10, 64)
		res, known := rlimitResource[name]
		if !ok || err != nil || !known {
			return errors.New("bad limit " + strconv.Quote(kv))
		}
		if v == 0 {
			continue
		}
		var cur syscall.Rlimit
		if err := syscall.Getrlimit(res, &cur); err != nil {
			return errors.New("getrlimit " + name + ": " + err.Error())
		}
		if cur.Max != ^uint64(0) && v > cur.Max {
			v = cur.Max
		}
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: v, Max: v}); err != nil {
			return errors.New("setrlimit " + name + "=" + strconv.FormatUint(v, 10) + ": " + err.Error())
		}
	}
	return nil
}

// rlimitResource maps the names of sandbox.Limits' wire form to resources.
var rlimitResource = map[string]int{
	"cpu":    syscall.RLIMIT_CPU,
	"as":     syscall.RLIMIT_AS,
	"nofile": syscall.RLIMIT_NOFILE,
	"fsize":  syscall.RLIMIT_FSIZE,
	"nproc":  6, // RLIMIT_NPROC
}

// Small string helpers: package strings would pull in package unicode,
// whose initialisation Go schedules late, and this package with it.

func index(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

func cut(s string, sep byte) (before, after string, found bool) {
	if i := index(s, sep); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

func split(s string, sep byte) []string {
	var out []string
	for {
		before, after, found := cut(s, sep)
		out = append(out, before)
		if !found {
			return out
		}
		s = after
	}
}

func trimSpace1(s string) string {
	if len(s) > 0 && s[0] == ' ' {
		return s[1:]
	}
	return s
}

func trimSlash(s string) string {
	if len(s) > 0 && s[len(s)-1] == '/' {
		return s[:len(s)-1]
	}
	return s
}
