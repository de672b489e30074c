package sandbox

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// The init child is the quro binary re-executed with boxinit.Arg (inside
// the bubblewrap box when that layer is on): package boxinit applies, in
// this order, the layers that act on the process itself (rlimits, the uid
// switch, no_new_privs, Landlock, seccomp), then execs the user program in
// its own place, so no Go code of Quro's remains in the process that runs
// user code. The server compiles what it applies (compile below), so the
// child needs no package of its own beyond a few small standard ones, and
// starts before the binary's heavy package initialisers. bubblewrap and
// the init child run with HelperEnv only; the program's environment
// reaches the init child in a sealed memfd (boxinit.Policy.EnvFD) and is
// applied by its final execve alone.

// initPolicy is what the server wants the init child to apply.
type initPolicy struct {
	Landlock bool
	Seccomp  bool
	Caps     []string // the box's capabilities, which the seccomp profile depends on
	Network  string
	// OwnNetns: the program runs in a network namespace of its box's own
	// (bubblewrap's --unshare-net: loopback and nothing else), so there is
	// nothing for Landlock to keep it from but the box's own loopback.
	OwnNetns bool
	RO       []string // read and execute beneath these
	ROFiles  []string
	RW       []string // read, write, execute beneath these
	ListDirs []string // only list directories beneath these
	WaitFD   int
	UID      int // switch to this uid and gid before the other layers
}

// compile turns p into the init child's policy: Landlock rules for this
// kernel's ABI and the seccomp program.
func (p *initPolicy) compile() (*boxinit.Policy, error) {
	bp := &boxinit.Policy{WaitFD: p.WaitFD, UID: p.UID}
	if p.Landlock {
		if err := compileLandlock(p, bp); err != nil {
			return nil, err
		}
	}
	if p.Seccomp {
		prog, err := seccompBytes(p.Caps)
		if err != nil {
			return nil, err
		}
		bp.Seccomp = prog
	}
	return bp, nil
}

// LookPath reports where the sandbox would find file, using the sandbox PATH.
func (s *Sandbox) LookPath(file string) (string, error) {
	p, err := boxinit.LookPath(file, s.path)
	if errors.Is(err, boxinit.ErrNotFound) {
		return "", fmt.Errorf("%s: %w in PATH %s", file, exec.ErrNotFound, s.path)
	}
	return p, err
}
