package sandbox

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The seccomp layer is an allowlist: the default profile of the most used
// container runtime (moby's, github.com/moby/profiles/seccomp), resolved for
// the box's capabilities (none for user code; AdminCaps for the install box)
// by moby's own code, with Quro's denials on top. It is compiled here into a
// classic-BPF program by a small compiler (below) that an auditor can read
// in one sitting; the syscall names are mapped to numbers with the tables of
// github.com/elastic/go-seccomp-bpf/arch.
//
// What a system call gets:
//   - from a foreign ABI (32-bit calls on amd64, x32): the process is killed;
//   - named in deniedSyscalls: EPERM, whatever the profile says;
//   - clone3: ENOSYS, so that libc falls back to clone, whose flags a filter
//     can read (clone3 passes them in memory);
//   - clone with namespace flags, ioctl TIOCSTI or TIOCLINUX (on the low 32
//     bits of the request, as the kernel compares it): EPERM;
//   - an ioctl of btrfs's type (0x94) other than the reflink ones every
//     filesystem answers (FICLONE, FICLONERANGE, FIDEDUPERANGE): EPERM. The
//     sessions' disks are subvolumes of one btrfs filesystem (see
//     internal/quota), and a box that made a subvolume or snapshot of its
//     own (the ioctl needs mere write permission) would get a quota group
//     the session's limit does not hold;
//   - allowed by the resolved profile (with its argument conditions:
//     personality values, socket families — no AF_VSOCK —, clone flags):
//     allowed;
//   - named by the profile but not granted to this box (a capability it lacks,
//     an argument outside the conditions): EPERM, as the profile says;
//   - named nowhere (new in a later kernel, or obsolete): ENOSYS, not the
//     profile's EPERM. ENOSYS is what a kernel without the call answers, and
//     libc and language runtimes take it as "fall back to the older call"
//     (glibc does so for clone3, faccessat2, fchmodat2, close_range, statx,
//     epoll_pwait2…); EPERM makes them fail instead, which is how new
//     distributions broke under container runtimes whose profiles predated
//     their calls. Denied either way.

// deniedSyscalls fail with EPERM even where the profile (or a capability of
// the install box) would allow them: numbers from package unix, so that a
// misspelt name cannot silently drop out.
var deniedSyscalls = []struct {
	name string
	nr   uintptr
}{
	// debugging other processes and reading their memory
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"kcmp", unix.SYS_KCMP},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
	// the mount family, old and new API
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"chroot", unix.SYS_CHROOT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	// new namespaces
	{"unshare", unix.SYS_UNSHARE},
	{"setns", unix.SYS_SETNS},
	// kernel keyrings, BPF, perf, userfaultfd, io_uring
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER},
	{"io_uring_register", unix.SYS_IO_URING_REGISTER},
	// the machine itself
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"reboot", unix.SYS_REBOOT},
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"acct", unix.SYS_ACCT},
	{"syslog", unix.SYS_SYSLOG},
	// file handles bypass path checks (the "shocker" escape); the install
	// box has CAP_DAC_READ_SEARCH, for which the profile allows them
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT},
}

// namespaceCloneFlags are the clone(2) flags that create namespaces.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// restrictions are conditions Quro adds to every rule of the profile that
// allows the call: the call is allowed only if they hold too (else EPERM).
var restrictions = map[uintptr][]scCond{
	unix.SYS_CLONE: {{arg: 0, op: opMaskedEq, mask: namespaceCloneFlags, value: 0}},
	unix.SYS_IOCTL: {{arg: 1, op: opNe32, value: unix.TIOCSTI}, {arg: 1, op: opNe32, value: unix.TIOCLINUX},
		{arg: 1, op: opMaskedNe32, mask: 0xff00, value: btrfsIoctlType << 8}},
}

// btrfsIoctlType is the type byte of btrfs's ioctls (BTRFS_IOCTL_MAGIC).
const btrfsIoctlType = 0x94

// allowedBtrfsIoctls are the requests of btrfs's type that stay allowed:
// the generic reflink and dedupe ioctls (cp --reflink, copy tools), which
// make no subvolume and share extents only within what the box reaches.
var allowedBtrfsIoctls = []uint64{unix.FICLONE, unix.FICLONERANGE, unix.FIDEDUPERANGE}

// scOp is a comparison of one system call argument.
type scOp int

const (
	opEq         scOp = iota // arg == value (64 bits)
	opMaskedEq               // arg & mask == value (64 bits)
	opLt                     // arg < value (unsigned, 64 bits)
	opNe32                   // low 32 bits of arg != value
	opMaskedNe32             // low 32 bits of arg & mask != value
	opEq32                   // low 32 bits of arg == value
)

type scCond struct {
	arg         uint32
	op          scOp
	value, mask uint64
}

// scRule returns ret when all its conditions hold.
type scRule struct {
	conds []scCond
	ret   uint32
}

// scHandler decides one system call number: the first rule whose conditions
// hold, else fallback.
type scHandler struct {
	rules    []scRule
	fallback uint32
}

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// seccompPolicy resolves moby's default profile for a box with caps on this
// machine (moby's code picks the rules for the architecture, kernel and
// capabilities) and puts Quro's denials on top: a handler per system call
// number; numbers without one get ENOSYS.
func seccompPolicy(caps []string) (map[uint32]*scHandler, error) {
	info, err := arch.GetInfo(runtime.GOARCH)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	prof, err := mobyseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default profile: %w", err)
	}
	hs := map[uint32]*scHandler{}
	handler := func(nr uint32) *scHandler {
		if hs[nr] == nil {
			hs[nr] = &scHandler{fallback: retEPERM}
		}
		return hs[nr]
	}
	for _, r := range prof.Syscalls {
		var ret uint32
		switch r.Action {
		case specs.ActAllow:
			ret = retAllow
		case specs.ActErrno:
			errno := uint32(unix.EPERM)
			if r.ErrnoRet != nil {
				errno = uint32(*r.ErrnoRet)
			}
			ret = unix.SECCOMP_RET_ERRNO | errno&unix.SECCOMP_RET_DATA
		default:
			return nil, fmt.Errorf("seccomp: profile rule for %v: action %s not supported", r.Names, r.Action)
		}
		var conds []scCond
		seen := map[uint]bool{}
		for _, a := range r.Args {
			if seen[a.Index] || a.Index > 5 {
				// runc would OR repeated comparisons of one argument.
				return nil, fmt.Errorf("seccomp: profile rule for %v: argument %d compared twice or out of range", r.Names, a.Index)
			}
			seen[a.Index] = true
			c := scCond{arg: uint32(a.Index), value: a.Value}
			switch a.Op {
			case specs.OpEqualTo:
				c.op = opEq
			case specs.OpMaskedEqual:
				c.op, c.mask, c.value = opMaskedEq, a.Value, a.ValueTwo
			case specs.OpLessThan:
				c.op = opLt
			default:
				return nil, fmt.Errorf("seccomp: profile rule for %v: operator %s not supported", r.Names, a.Op)
			}
			conds = append(conds, c)
		}
		for _, name := range r.Names {
			nr, ok := info.SyscallNames[name]
			if !ok {
				continue // a call of another architecture
			}
			h := handler(uint32(nr))
			if len(h.rules) > 0 && (len(conds) == 0 || len(h.rules[0].conds) == 0) {
				return nil, fmt.Errorf("seccomp: profile gives %s an unconditional rule and another", name)
			}
			h.rules = append(h.rules, scRule{conds: conds, ret: ret})
		}
	}
	// Every call the profile names, for any capability, architecture or
	// kernel, and does not grant this box: EPERM, as the profile says.
	for _, r := range mobyseccomp.DefaultProfile().Syscalls {
		for _, name := range append(slices.Clone(r.Names), r.Name) { //nolint:staticcheck // SA1019: a profile may still name a call the old way
			if nr, ok := info.SyscallNames[name]; ok {
				handler(uint32(nr))
			}
		}
	}
	// Quro's layer on top.
	for nr, cs := range restrictions {
		h, ok := hs[uint32(nr)]
		if !ok {
			return nil, fmt.Errorf("seccomp: the profile does not name system call %d, restricted here", nr)
		}
		for i := range h.rules {
			if h.rules[i].ret == retAllow {
				h.rules[i].conds = append(slices.Clone(h.rules[i].conds), cs...)
			}
		}
	}
	// The reflink ioctls pass before the restriction of btrfs's type.
	if h := hs[unix.SYS_IOCTL]; h != nil && slices.ContainsFunc(h.rules, func(r scRule) bool { return r.ret == retAllow }) {
		var first []scRule
		for _, req := range allowedBtrfsIoctls {
			first = append(first, scRule{conds: []scCond{{arg: 1, op: opEq32, value: req}}, ret: retAllow})
		}
		h.rules = append(first, h.rules...)
	}
	for _, d := range deniedSyscalls {
		hs[uint32(d.nr)] = &scHandler{fallback: retEPERM}
	}
	hs[unix.SYS_CLONE3] = &scHandler{fallback: retENOSYS}
	return hs, nil
}

// seccomp_data offsets
const (
	offNR   = 0
	offArch = 4
	offArgs = 16 // args[i] at 16+8*i; the low 32 bits come first on little-endian machines
)

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	andK  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	jeqK  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgtK  = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
	jgeK  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	ja    = unix.BPF_JMP | unix.BPF_JA
	retK  = unix.BPF_RET | unix.BPF_K
)

// maxSeccompInsns is the kernel's limit on one filter (BPF_MAXINSNS).
const maxSeccompInsns = 4096

// seccompProgram builds the filter for this machine's architecture and a
// box with caps.
//
// Layout: the ABI check, then a binary search on the system call number over
// ranges of numbers that share a handler (jgt; a ja where the other side is
// too far for a conditional jump), each leaf a handler: its rules' argument
// checks, each ending in a return, and the fallback return. Every leaf
// returns, so nothing has to restore the accumulator. Leaves that only
// return (no argument loaded) keep the kernel's per-number action cache
// working: an always-allowed call skips the filter altogether.
func seccompProgram(caps []string) ([]unix.SockFilter, error) {
	archID, ok := auditArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: no filter for GOARCH %s", runtime.GOARCH)
	}
	hs, err := seccompPolicy(caps)
	if err != nil {
		return nil, err
	}
	// A foreign ABI (32-bit calls on amd64, x32) would bypass the numbers
	// below: kill.
	p := []unix.SockFilter{
		stmt(ldAbs, offArch),
		jump(jeqK, archID, 1, 0),
		stmt(retK, retKill),
		stmt(ldAbs, offNR),
	}
	if runtime.GOARCH == "amd64" { // x32 syscalls have bit 30 set
		p = append(p, jump(jgeK, 0x40000000, 0, 1), stmt(retK, retKill))
	}
	segs, err := seccompSegments(hs)
	if err != nil {
		return nil, err
	}
	tree, err := searchTree(segs)
	if err != nil {
		return nil, err
	}
	p = append(p, tree...)
	if len(p) > maxSeccompInsns {
		return nil, fmt.Errorf("seccomp: program of %d instructions is over the kernel's %d", len(p), maxSeccompInsns)
	}
	return p, nil
}

// segment is a range of system call numbers with the same code.
type segment struct {
	hi   uint32 // last number; the first is the previous segment's hi+1
	code []unix.SockFilter
}

// seccompSegments cuts the number space into ranges: one per handler with
// argument checks, merged runs of numbers that return the same, and ENOSYS
// between them and beyond.
func seccompSegments(hs map[uint32]*scHandler) ([]segment, error) {
	nrs := make([]uint32, 0, len(hs))
	for nr := range hs {
		nrs = append(nrs, nr)
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	var segs []segment
	add := func(hi uint32, code []unix.SockFilter) {
		// Merge with the previous range when both only return the same.
		if n := len(segs); n > 0 && len(code) == 1 && len(segs[n-1].code) == 1 && segs[n-1].code[0] == code[0] {
			segs[n-1].hi = hi
			return
		}
		segs = append(segs, segment{hi: hi, code: code})
	}
	next := uint32(0) // the first number not yet covered
	for _, nr := range nrs {
		if nr > next {
			add(nr-1, []unix.SockFilter{stmt(retK, retENOSYS)})
		}
		code, err := handlerCode(hs[nr])
		if err != nil {
			return nil, fmt.Errorf("seccomp: system call %d: %w", nr, err)
		}
		add(nr, code)
		next = nr + 1
	}
	add(^uint32(0), []unix.SockFilter{stmt(retK, retENOSYS)})
	return segs, nil
}

// searchTree compiles a binary search over segs: jgt on the last number of
// the left half, the left half, then the right half.
func searchTree(segs []segment) ([]unix.SockFilter, error) {
	if len(segs) == 1 {
		return segs[0].code, nil
	}
	mid := len(segs) / 2
	left, err := searchTree(segs[:mid])
	if err != nil {
		return nil, err
	}
	right, err := searchTree(segs[mid:])
	if err != nil {
		return nil, err
	}
	k := segs[mid-1].hi
	var p []unix.SockFilter
	if len(left) <= 255 {
		p = append(p, jump(jgtK, k, uint8(len(left)), 0))
	} else {
		// Too far for a conditional jump: above k, take the ja over left.
		p = append(p, jump(jgtK, k, 0, 1), stmt(ja, uint32(len(left))))
	}
	p = append(p, left...)
	return append(p, right...), nil
}

// handlerCode compiles h: each rule is its checks (on failure, a jump to the
// next rule) and its return; the fallback return comes last.
func handlerCode(h *scHandler) ([]unix.SockFilter, error) {
	code := []unix.SockFilter{stmt(retK, h.fallback)}
	for i := len(h.rules) - 1; i >= 0; i-- {
		rule := []unix.SockFilter{stmt(retK, h.rules[i].ret)}
		if len(h.rules[i].conds) == 0 {
			code = rule // it always returns: what follows it is dead
			continue
		}
		for j := len(h.rules[i].conds) - 1; j >= 0; j-- {
			c, err := condCode(h.rules[i].conds[j], len(rule))
			if err != nil {
				return nil, err
			}
			rule = append(c, rule...)
		}
		code = append(rule, code...)
	}
	return code, nil
}

// condCode compiles one comparison: it falls through when c holds, and jumps
// past the fail instructions that follow it when it does not.
func condCode(c scCond, fail int) ([]unix.SockFilter, error) {
	if fail+4 > 255 {
		return nil, fmt.Errorf("argument checks too long for a conditional jump")
	}
	f := uint8(fail)
	lo, hi := offArgs+8*c.arg, offArgs+8*c.arg+4
	vlo, vhi := uint32(c.value), uint32(c.value>>32)
	switch c.op {
	case opEq:
		return []unix.SockFilter{
			stmt(ldAbs, hi), jump(jeqK, vhi, 0, f+2),
			stmt(ldAbs, lo), jump(jeqK, vlo, 0, f),
		}, nil
	case opMaskedEq:
		return []unix.SockFilter{
			stmt(ldAbs, hi), stmt(andK, uint32(c.mask>>32)), jump(jeqK, vhi, 0, f+3),
			stmt(ldAbs, lo), stmt(andK, uint32(c.mask)), jump(jeqK, vlo, 0, f),
		}, nil
	case opLt:
		return []unix.SockFilter{
			stmt(ldAbs, hi), jump(jgtK, vhi, f+3, 0), // high word above: no
			jump(jeqK, vhi, 0, 2), // high word below: yes
			stmt(ldAbs, lo), jump(jgeK, vlo, f, 0),
		}, nil
	case opNe32:
		return []unix.SockFilter{stmt(ldAbs, lo), jump(jeqK, uint32(c.value), f, 0)}, nil
	case opMaskedNe32:
		return []unix.SockFilter{stmt(ldAbs, lo), stmt(andK, uint32(c.mask)), jump(jeqK, uint32(c.value), f, 0)}, nil
	case opEq32:
		return []unix.SockFilter{stmt(ldAbs, lo), jump(jeqK, uint32(c.value), 0, f)}, nil
	}
	return nil, fmt.Errorf("unknown comparison %d", c.op)
}

var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

// seccompBytes is the filter for a box with caps, in the kernel's struct
// sock_filter layout, as the init child loads it (boxinit); built once per
// process and set of capabilities.
func seccompBytes(caps []string) ([]byte, error) {
	key := fmt.Sprint(caps)
	seccompCache.Lock()
	defer seccompCache.Unlock()
	if b, ok := seccompCache.m[key]; ok {
		return b, nil
	}
	prog, err := seccompProgram(caps)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		b = binary.LittleEndian.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = binary.LittleEndian.AppendUint32(b, f.K)
	}
	if seccompCache.m == nil {
		seccompCache.m = map[string][]byte{}
	}
	seccompCache.m[key] = b
	return b, nil
}

var seccompCache struct {
	sync.Mutex
	m map[string][]byte
}
