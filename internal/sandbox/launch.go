package sandbox

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// launch is the one way the server starts a box's first process: a
// one-shot run's init child (startOneShot) or a session box's init
// (openBox), in a bubblewrap box or, for a one-shot run without the
// namespaces layer, directly. The two differ only in what they declare
// (oneShotLaunch, sessionLaunch); the steps are the same:
//
//	holdPipes  the go-ahead pipes, when the child must wait for the server
//	command    bubblewrap's arguments and the exec.Cmd
//	start      the start, born in the cgroups when the kernel can
//	release    the uid maps, the cgroup join, then the go-ahead
type launch struct {
	box       *bwrapBox // nil: no box, the init child runs directly
	bwrap     string    // bubblewrap's path
	self      string    // the quro binary
	dir       string    // the working directory without a box
	fds       *fdList   // the child's descriptors from 3 on
	stdio     [3]*os.File
	env       []string // bubblewrap's and the init child's: HelperEnv and no more of the program's
	tty       bool     // stdin is the child's controlling terminal
	waitDelay time.Duration
	// hold: the child waits for the go-ahead, once the server has joined
	// it to its cgroups and written its uid maps.
	hold  bool
	uid   int  // the host uid mapped to insideUID, or 0
	admin bool // a RootfsAdmin box: identity maps, no uid switch
	// netns: the box is born in this network namespace (the server's,
	// see Netns) instead of one bubblewrap makes, or the host's.
	netns *Netns
	// mounts: a box is born in a copy of the base mount namespace with
	// the disk of mountDir's session (see mountView); nil: in the
	// server's.
	mounts   *mountView
	mountDir string

	cmd       *exec.Cmd
	childEnds []*os.File // the server's copies of what the child holds
	info      *os.File   // bubblewrap's info fd: the box's pid
	goAhead   *os.File
	waitFD    int // without a box: the init child's go-ahead fd (initPolicy.WaitFD)
}

// oneShotLaunch declares a run's box of its own: the init child runs
// pl, held when the server has cgroups to join or uid maps to write.
func (s *Sandbox) oneShotLaunch(ctx context.Context, pl *plan, pb *plumbing, cgroups bool, ns *Netns) (*launch, error) {
	l := &launch{bwrap: s.layers.bwrap, self: s.self, dir: pl.spec.Dir, fds: pb.fds, stdio: pb.stdio,
		env: slices.Clone(HelperEnv), tty: pl.spec.TTY, waitDelay: s.drainGrace, hold: cgroups, uid: pl.uid, admin: pl.admin, netns: ns}
	if pl.boxed {
		l.box = s.bwrapFor(pl, pl.spec)
		l.box.ownNetns = ns != nil
		l.hold = cgroups || pl.uid != 0 || pl.admin
		l.mounts, l.mountDir = s.mounts, pl.spec.Dir
	}
	if err := l.holdPipes(); err != nil {
		return nil, err
	}
	pl.pol.WaitFD = l.waitFD
	inner, err := pl.initArgs(pb)
	if err == nil {
		err = l.command(ctx, inner)
	}
	if err != nil {
		l.abort()
		return nil, err
	}
	return l, nil
}

// sessionLaunch declares a session box shaped as shape: the box init as
// its pid 1, talking to the server over ctl, always held (the server
// learns the init's pid from bubblewrap). The box takes no terminal: a
// TTY run gets its own from the box init.
func (s *Sandbox) sessionLaunch(pl *plan, shape boxShape, ctl *os.File, ns *Netns) (*launch, error) {
	spec := *pl.spec
	spec.TTY, spec.StartsInHome = false, false // the box init stays in Dir; each spawn names its own
	bpl := *pl
	bpl.spec = &spec
	bpl.writable, bpl.readOnly = shape.writable, shape.readOnly
	b := s.bwrapFor(&bpl, &spec)
	b.binds = shape.binds
	b.setViews()
	b.asPID1 = true
	b.ownNetns = ns != nil
	// The box init, its spawners and init children are Go programs that
	// mostly wait: one P each is all they use (fewer threads against the
	// session's pids budget, less memory per box). The user program never
	// sees it: it gets its own environment from the init child (or the
	// spawner, through execve).
	l := &launch{box: b, bwrap: s.layers.bwrap, self: s.self, fds: &fdList{},
		env: append(slices.Clone(HelperEnv), "GOMAXPROCS=1"), hold: true, uid: pl.uid, netns: ns,
		mounts: s.mounts, mountDir: spec.Dir}
	ctlFD := l.fds.add(ctl)
	if err := l.holdPipes(); err != nil {
		return nil, err
	}
	// No context ends a session box: Close does.
	if err := l.command(context.Background(), []string{boxinit.BoxArg, ctlFD}); err != nil {
		l.abort()
		return nil, err
	}
	return l, nil
}

// holdPipes makes the go-ahead pipes of a held launch: in a box,
// bubblewrap's info fd and its block fd (userns-block when the server
// writes the uid maps); without one, the init child's WaitFD, which must
// be known before its policy is compiled.
func (l *launch) holdPipes() error {
	if !l.hold {
		return nil
	}
	if l.box == nil {
		wr, ww, err := os.Pipe()
		if err != nil {
			return err
		}
		l.childEnds = append(l.childEnds, wr)
		l.goAhead = ww
		l.waitFD, _ = strconv.Atoi(l.fds.add(wr))
		return nil
	}
	ir, iw, br, bw, err := pipes2()
	if err != nil {
		return err
	}
	l.childEnds = append(l.childEnds, iw, br)
	l.info, l.goAhead = ir, bw
	l.box.infoFD = l.fds.add(iw)
	if l.admin || l.uid != 0 {
		l.box.usernsBlockFD = l.fds.add(br)
		l.box.capSetID = !l.admin
	} else {
		l.box.blockFD = l.fds.add(br)
	}
	return nil
}

// command builds l.cmd: bubblewrap building l.box and running the quro
// binary at initPath with inner, or the quro binary itself. When ctx ends,
// the child's process group is killed.
func (l *launch) command(ctx context.Context, inner []string) error {
	cmd := exec.CommandContext(ctx, l.self)
	cmd.Cancel = func() error { return killGroup(cmd) }
	cmd.WaitDelay = l.waitDelay
	if l.box != nil {
		bargs, opened, err := l.box.args(l.fds)
		if err != nil {
			return err
		}
		l.childEnds = append(l.childEnds, opened...)
		cmd.Path = l.bwrap
		cmd.Args = slices.Concat([]string{"bwrap"}, bargs, []string{initPath}, inner)
		cmd.Dir = "/"
	} else {
		cmd.Args = append([]string{l.self}, inner...)
		cmd.Dir = l.dir
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if l.tty {
		// A new session is also a new process group (pgid = pid); the
		// terminal on fd 0 becomes its controlling terminal, and stays that
		// of everything in the box.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	}
	// bubblewrap and the init child run as the server's user (host root)
	// until the init child's uid switch: they get a fixed environment, and
	// the program's own only through its env memfd.
	cmd.Env = l.env
	cmd.ExtraFiles = l.fds.files
	if l.stdio[0] != nil {
		cmd.Stdin = l.stdio[0]
	}
	if l.stdio[1] != nil {
		cmd.Stdout = l.stdio[1]
	}
	if l.stdio[2] != nil {
		cmd.Stderr = l.stdio[2]
	}
	l.cmd = cmd
	return nil
}

// start starts l.cmd, born in cg when the kernel can and in l.netns (see
// startInside),
// and closes the server's copies of the child's descriptors. With exit
// set the process was started (err may still say it could not leave cg's
// way), and Wait on it goes through exit.
func (l *launch) start(cg *runCgroup) (born bool, exit *exitWatch, err error) {
	var pidfd int
	askPidfd(l.cmd, &pidfd)
	var mnt func() (func() error, error)
	if l.mounts != nil {
		mnt = func() (func() error, error) { return l.mounts.enter(l.mountDir) }
	}
	born, err = cg.startInside(l.netns, mnt, l.cmd.Start)
	if !born && l.netns == nil && mnt == nil {
		err = l.cmd.Start()
	}
	l.closeChildEnds()
	if l.cmd.Process != nil {
		exit = watchExit(pidfd)
	}
	return born, exit, err
}

// release lets a held child go on: its uid maps, cg unless it was born
// there, then the go-ahead. It returns the host pid of the box's first
// process (the child's own without a box).
func (l *launch) release(cg *runCgroup, born bool) (int, error) {
	defer l.closeGoAhead()
	pid := l.cmd.Process.Pid
	var err error
	if l.info != nil {
		pid, err = childPID(l.info)
	}
	switch {
	case err != nil:
	case l.admin:
		err = mapAdminIDs(pid)
	case l.box != nil && l.uid != 0:
		err = mapIDs(pid, l.uid)
	}
	if err == nil && cg != nil && !born {
		err = cg.join(pid)
	}
	if err == nil {
		_, err = l.goAhead.Write([]byte{1})
	}
	return pid, err
}

func (l *launch) closeChildEnds() {
	for _, f := range l.childEnds {
		f.Close()
	}
	l.childEnds = nil
}

func (l *launch) closeGoAhead() {
	if l.info != nil {
		l.info.Close()
	}
	if l.goAhead != nil {
		l.goAhead.Close()
	}
}

// abort closes what l holds of a launch that did not start.
func (l *launch) abort() {
	l.closeChildEnds()
	l.closeGoAhead()
}
