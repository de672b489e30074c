package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/recent"
	"github.com/quro-dev/quro/internal/sandbox/boxinit"
)

// The session box: one bubblewrap box per session for the session's
// lifetime. Its first process is the box init (boxinit.BoxArg), pid 1 of
// the box's pid namespace; every process of the session (the resident
// shell, the PTY's shell, the Python worker, one-shot runs) is spawned by
// it on the server's request over a private socket, through the init
// child, which applies rlimits, the uid switch, no_new_privs, Landlock and
// seccomp per process as in a box of its own, or through the box's spawner
// for that policy, which applied them to itself once (boxinit.SpawnerArg).
// The namespaces (user, pid, mount, ipc, uts, network), the mounts and the
// cgroup are the box's, made once: a spawn costs a fork and one exec
// (two through an init child) instead of a new box.
//
// Spec.Session names the box a run goes to (ForSession sets it for a
// session's code). A spec that the box cannot hold — another uid, network
// policy, rootfs, or a host path the box does not show — gets a new box
// when the old one is idle, else a box of its own (counted in BoxStats).

// Box is a session's box. Its methods are safe for concurrent use.
type Box struct {
	s     *Sandbox
	key   string
	shape boxShape
	// roIDs are the files the box's read-only paths named when it was
	// made (see current).
	roIDs map[string]fileID
	cmd   *exec.Cmd // bubblewrap
	pid1  int       // the box init's host pid
	cg    *runCgroup
	ctl   *net.UnixConn
	net   *boxNet // nil under NetworkHost
	// network is the box's policy now (shape.network at first; SetNetwork
	// changes it), guarded by mu.
	network string

	sendMu sync.Mutex
	mu     sync.Mutex
	procs  map[string]*Process // spawned, not yet reported exited
	seq    uint64
	// syncs are the waiters of signalsSent, by token; closed when the
	// box init answers, or when the box ends.
	syncs  map[string]chan struct{}
	frozen bool
	closed bool
	// claims are the runs boxFor handed this box that have not yet
	// registered their process (launch) or given up: a box that is
	// replaced must have neither, or a run told "this box" finds it
	// closed (a start_process beside the Python worker that, once the
	// embedded Python was prepared, needed a box showing its tree).
	claims int
	dead   chan struct{} // closed when bubblewrap has exited
	limits Limits
	// begun is set by the first to start the box's end (finish); ended
	// is closed once the box has ended and its cgroup and network are
	// gone. A caller after the first waits for it.
	begun atomic.Bool
	ended chan struct{}
}

// boxShape is what a box is made of; a spec fits a box when its own shape
// is contained in it. home is the box's account's home in its passwd,
// the home of the run that made the box: it does not decide whether a run
// fits, since HOME is each process's own (two boxes would be two /tmp and
// two pid namespaces for one session).
type boxShape struct {
	uid      int
	network  string
	rootfs   string
	home     string
	tmp      string // the directory shown at BoxTmp, or ""
	writable []string
	readOnly []string
	binds    []Bind
}

func (pl *plan) shape(s *Sandbox) boxShape {
	return boxShape{uid: pl.uid, network: pl.network, rootfs: pl.spec.Rootfs, home: pl.spec.homeDir(), tmp: pl.tmp,
		writable: pl.writable, readOnly: pl.readOnly, binds: append(slices.Clone(s.binds), pl.spec.Binds...)}
}

// holds reports whether a box of shape b can run a spec of shape x, but
// for the network (the box's own, which SetNetwork may change: see
// Box.network).
func (b *boxShape) holds(x *boxShape) bool {
	if b.uid != x.uid || b.rootfs != x.rootfs || (x.tmp != "" && x.tmp != b.tmp) {
		// (A run with no TmpDir of its own sees the box's.)
		return false
	}
	for _, w := range x.writable {
		// A directory beneath one the box binds read-write (a terminal
		// started in a subdirectory of the workspace) is in the box.
		if !slices.ContainsFunc(b.writable, func(d string) bool { return beneath(w, d) }) {
			return false
		}
	}
	for _, r := range x.readOnly {
		if !slices.ContainsFunc(b.readOnly, func(d string) bool { return beneath(r, d) }) {
			return false
		}
	}
	for _, bd := range x.binds {
		if !slices.Contains(b.binds, bd) {
			return false
		}
	}
	// A directory the box shows only through a view is one the run was
	// told of by that view's path (its Dir, HOME, arguments): a run
	// without the view would name a host path the box does not show.
	xv := x.views()
	for _, v := range b.views() {
		if slices.ContainsFunc(x.writable, func(d string) bool { return beneath(d, v.Src) }) && !slices.Contains(xv, v) {
			return false
		}
	}
	return true
}

// views are the directories a box of shape b shows only elsewhere than
// at their host paths (view.go).
func (b *boxShape) views() []Bind { return viewsOf(b.writable, b.binds, b.tmp) }

// boxRegistry holds the session boxes of a Sandbox (and of the Sandboxes
// ForSession derives from it).
type boxRegistry struct {
	mu       sync.Mutex
	boxes    map[string]*boxEntry
	readOnly []string // Options.BoxReadOnly
	// readOnlyNow is Options.BoxReadOnlyNow.
	readOnlyNow func() []string
	outside     uint64 // runs of a session that got a box of their own
	// ended are sessions whose boxes EndSession closed for good, so that
	// a run racing with a destroy cannot make a new box for a session that
	// is gone.
	ended recent.Set
	// ending are the boxes EndSession killed whose end (bubblewrap's
	// exit, the cgroup's removal) goes on in the background.
	ending map[string]*Box

	// peak is the most boxes open at once since memory was last given
	// back; giveBack is pending while a burst of closes goes on.
	peak     int
	giveBack *time.Timer
	pending  bool
	minPeak  int    // giveBackPeak; lower in tests
	gaveBack func() // called after each give-back; for tests

	// teardowns holds a slot for each end EndSession left to the
	// background that runs now (endBounded): a burst of destroys is as
	// many bubblewrap exits, cgroup removals and network closes, which
	// run at most cap(teardowns) at once; the others wait their turn.
	teardowns chan struct{}
	tearing   atomic.Int32 // ends running in a slot
	queued    atomic.Int32 // ends waiting for a slot
	// teardownHook, when set, is told of each change of tearing or queued,
	// start true at the start of an end in its slot (it may block there);
	// for tests.
	teardownHook func(start bool)
}

// TeardownSlots is how many box ends run at once in the background
// (boxRegistry.teardowns), and how many destroyed sessions' disks a
// server releases at once: two per core, at least 4 and at most 16. Much
// of an end is waiting for the kernel (the pid namespace's processes
// reaped before bubblewrap exits, a cgroup removed once empty), so two
// per core keep the cores busy; a hundred at once only crowd them and
// the kernel's locks that creates need too.
func TeardownSlots() int { return min(16, max(4, 2*runtime.NumCPU())) }

// slots returns r.teardowns, made on first use.
func (r *boxRegistry) slots() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.teardowns == nil {
		r.teardowns = make(chan struct{}, TeardownSlots())
	}
	return r.teardowns
}

func (r *boxRegistry) teardownChanged(start bool) {
	if r.teardownHook != nil {
		r.teardownHook(start)
	}
}

// A burst of closes gives the server's freed memory back to the kernel.
// The runtime does so by itself only slowly (its scavenger is paced to
// about 1 % of the CPU and aims at the heap goal of the last GC, which an
// idle server runs every two minutes): right after a thousand sessions
// were destroyed and a GC, the server's PSS was 10 to 14 times what it
// started with, and it took the scavenger tens of seconds to give most of
// it back (40 destroyed still left 1.27 times after 20 s). So once the
// open boxes have fallen to half of a peak of at least giveBackPeak, and
// no box has closed for giveBackQuiet, debug.FreeOSMemory runs: one forced
// GC and the free pages returned, once per burst.
const (
	giveBackPeak  = 64
	giveBackQuiet = 2 * time.Second
)

// opened notes a box made; r.mu is held.
func (r *boxRegistry) opened() {
	r.peak = max(r.peak, len(r.boxes))
}

// closed notes a box gone from r.boxes; r.mu is held.
func (r *boxRegistry) closed() {
	if len(r.boxes) == 0 {
		// A map keeps the buckets of its largest size: start afresh.
		r.boxes = map[string]*boxEntry{}
	}
	switch {
	case r.pending:
		r.giveBack.Reset(giveBackQuiet)
	case r.peak >= cmp.Or(r.minPeak, giveBackPeak) && len(r.boxes) <= r.peak/2:
		r.pending = true
		if r.giveBack == nil {
			r.giveBack = time.AfterFunc(giveBackQuiet, r.freeMemory)
		} else {
			r.giveBack.Reset(giveBackQuiet)
		}
	}
}

func (r *boxRegistry) freeMemory() {
	r.mu.Lock()
	r.pending = false
	r.peak = len(r.boxes)
	done := r.gaveBack
	r.mu.Unlock()
	debug.FreeOSMemory()
	if done != nil {
		done()
	}
}

// ErrSessionEnded is a run for a session whose box was ended for good.
var ErrSessionEnded = errors.New("the session was destroyed")

type boxEntry struct {
	ready chan struct{} // closed once box/err are set
	box   *Box
	err   error
}

// BoxStats counts the session boxes.
type BoxStats struct {
	Open    int    // boxes alive
	Outside uint64 // runs of a session that did not fit its box and got one of their own
}

// BoxStats reports how many session boxes are open.
func (s *Sandbox) BoxStats() BoxStats {
	r := s.boxes
	if r == nil {
		return BoxStats{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return BoxStats{Open: len(r.boxes), Outside: r.outside}
}

// boxFor returns the session box pl runs in, making it on first use, or
// nil when pl runs in a box of its own: no session named, no box layer, a
// rootfs change (install_packages), or a spec the busy box cannot hold.
func (s *Sandbox) boxFor(ctx context.Context, pl *plan) (*Box, error) {
	r := s.boxes
	key := pl.spec.Session
	if key == "" {
		key = s.session
	}
	if r == nil || key == "" || !pl.boxed || pl.admin {
		return nil, nil
	}
	want := pl.shape(s)
	for {
		r.mu.Lock()
		if r.ended.Has(key) {
			r.mu.Unlock()
			return nil, ErrSessionEnded
		}
		e := r.boxes[key]
		if e == nil {
			e = &boxEntry{ready: make(chan struct{})}
			r.boxes[key] = e
			r.opened()
			r.mu.Unlock()
			e.box, e.err = s.openBox(key, pl, want)
			if e.err == nil {
				e.box.claims = 1 // this run's, before any other sees the box
			}
			close(e.ready)
			if e.err != nil {
				r.mu.Lock()
				if r.boxes[key] == e {
					delete(r.boxes, key)
					r.closed()
				}
				r.mu.Unlock()
			}
			return e.box, e.err
		}
		r.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err != nil {
			return nil, e.err
		}
		bx := e.box
		if bx.shape.holds(&want) && bx.Network() == want.network && bx.current(&want) && bx.claim() {
			return bx, nil // the caller's spawn takes the claim (launch) or gives it back
		}
		if !bx.retire() {
			r.mu.Lock()
			r.outside++
			r.mu.Unlock()
			return nil, nil
		}
		// An idle box of another shape (or a dead one), closed to new
		// runs by retire: replace it.
		bx.Close()
	}
}

// statusHook, when set (by tests), is called in a session box's spawn
// with the process just before the server reads its start's status: it
// holds the server as a loaded machine does, while the program may run
// and end.
var statusHook atomic.Pointer[func(p *Process)]

// boxClaimedHook, when set (by tests), is called with the session's key
// once boxFor has handed a run its box and before the run spawns in it:
// the moment a replacement of the box must not close it.
var boxClaimedHook atomic.Pointer[func(key string)]

// endSessionKilledHook, when set (by tests), is called by EndSession
// once the box of session key is killed, before its end is begun.
var endSessionKilledHook atomic.Pointer[func(key string)]

// claim reserves the box for a run about to spawn in it (see claims),
// unless it is closed or dead.
func (bx *Box) claim() bool {
	select {
	case <-bx.dead:
		return false
	default:
	}
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.closed {
		return false
	}
	bx.claims++
	return true
}

// unclaim gives back a claim whose run never reached launch's
// registration.
func (bx *Box) unclaim() {
	bx.mu.Lock()
	bx.claims--
	bx.mu.Unlock()
}

// retire closes the box to new runs when no process runs in it and no
// run holds a claim on it (or it is closed or dead already), and reports
// whether it did: the check and the closing are one step, so that no run
// is handed the box between them. A busy box is left as it is.
func (bx *Box) retire() bool {
	dead := false
	select {
	case <-bx.dead:
		dead = true
	default:
	}
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if !dead && !bx.closed && len(bx.procs)+bx.claims > 0 {
		return false
	}
	bx.closed = true
	return true
}

// CloseBox ends the box of session key, if it has one: every process in
// it is killed with the box's pid namespace, and its cgroup removed.
func (s *Sandbox) CloseBox(key string) {
	if bx := s.Box(key); bx != nil {
		bx.Close()
	}
}

// EndSession ends the box of session key for good: no run of that
// session makes a box again (a run racing with the session's destroy
// fails instead). It returns once the box's init is sent SIGKILL — every
// process of the box dies with its pid namespace — and leaves the wait
// for their exit and the removal of the box's cgroup and network to the
// background (AwaitEnded waits for them; CloseBoxes does too): a destroy
// does not wait for the kernel to tear a box down.
func (s *Sandbox) EndSession(key string) {
	r := s.boxes
	if r == nil {
		return
	}
	r.mu.Lock()
	r.ended.Add(key)
	r.mu.Unlock()
	// Any box registered before the mark is killed here; none after it.
	bx := s.Box(key)
	if bx == nil {
		return
	}
	// Among the ending boxes before kill takes it out of the registry:
	// a CloseBoxes in between saw it in neither and did not wait for its
	// end, and App.Close went on (unmounting the sessions' disks,
	// releasing the tenants' cgroups) with the box's end not begun.
	r.mu.Lock()
	if r.ending == nil {
		r.ending = map[string]*Box{}
	}
	r.ending[key] = bx
	r.mu.Unlock()
	bx.kill()
	if h := endSessionKilledHook.Load(); h != nil {
		(*h)(key)
	}
	go func() {
		bx.endBounded()
		r.mu.Lock()
		if r.ending[key] == bx {
			delete(r.ending, key)
		}
		r.mu.Unlock()
	}()
}

// endingOf returns the boxes of tenant that EndSession killed and whose
// ends are under way: their processes still count in the tenant's cgroup
// until they have exited. A box is the tenant's its cgroup was made under
// (runCgroup.tenantName), not the tenant its session's directory
// resolves to now: by the time a destroy answers, the app has forgotten
// the session's tenant and deleted its row, so the directory resolves to
// none (and resolving it would remount a disk its release is taking
// away).
func (s *Sandbox) endingOf(tenant string) []*Box {
	r := s.boxes
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var ending []*Box
	for _, bx := range r.ending {
		if bx.cg != nil && bx.cg.tenant && bx.cg.tenantName == tenant {
			ending = append(ending, bx)
		}
	}
	return ending
}

// admitAwaiting is cgroups.admit for tenant t, but a refusal at a ceiling
// while boxes of t are still ending (a destroy answers before its box's
// processes have exited) waits for them, then asks again: a destroy gives
// its processes and memory back to the next call, as it did when it
// waited for them itself. The ending boxes are taken before the first
// count: a box whose end completes between that count and the refusal
// has left the ending set, yet the count still held its processes.
func (s *Sandbox) admitAwaiting(t *Tenant, room Room) error {
	ending := s.endingOf(t.Name)
	err := s.layers.cg.admit(t, room)
	var ce *CeilingError
	if errors.As(err, &ce) && s.refused != nil {
		s.refused()
	}
	if errors.As(err, &ce) && len(ending) > 0 {
		for _, bx := range ending {
			bx.endBounded()
		}
		err = s.layers.cg.admit(t, room)
	}
	return err
}

// AwaitEnded waits until the box of session key that EndSession killed
// has ended: bubblewrap has exited with every process of the box, and
// the box's cgroup and network are gone. It returns at once when no such
// box is ending.
func (s *Sandbox) AwaitEnded(key string) {
	r := s.boxes
	if r == nil {
		return
	}
	r.mu.Lock()
	bx := r.ending[key]
	r.mu.Unlock()
	if bx != nil {
		bx.endBounded()
	}
}

// ReopenSession undoes EndSession for a session that lives on (its move
// to another node failed): its next run makes it a box again.
func (s *Sandbox) ReopenSession(key string) {
	r := s.boxes
	if r == nil {
		return
	}
	r.mu.Lock()
	r.ended.Delete(key)
	r.mu.Unlock()
}

// Box returns the open box of session key, or nil.
func (s *Sandbox) Box(key string) *Box {
	r := s.boxes
	if r == nil {
		return nil
	}
	r.mu.Lock()
	e := r.boxes[key]
	r.mu.Unlock()
	if e == nil {
		return nil
	}
	<-e.ready
	return e.box
}

// openBox builds the box of session key shaped for pl: its cgroup under
// the tenant's, bubblewrap with the box init as pid 1, the uid maps.
func (s *Sandbox) openBox(key string, pl *plan, shape boxShape) (*Box, error) {
	shape.readOnly = s.boxReadOnly(shape.readOnly)
	// The box's cgroup holds the session's budget (the Sandbox's limits),
	// whatever the run that made it: each run keeps its own rlimits.
	bx := &Box{s: s, key: key, shape: shape, network: shape.network, procs: map[string]*Process{}, dead: make(chan struct{}), ended: make(chan struct{}), limits: s.limits,
		roIDs: map[string]fileID{}}
	for _, p := range shape.readOnly {
		if id, ok := fileIDOf(p); ok {
			bx.roIDs[p] = id
		}
	}
	var err error
	if bx.cg, err = s.runCgroup(s.limits, pl.spec.tenantDir()); err != nil {
		return nil, err
	}
	fail := func(err error) (*Box, error) {
		if bx.cg != nil {
			bx.cg.kill()
			bx.cg.remove()
		}
		bx.net.close()
		return nil, err
	}
	if bx.net, err = s.openNet(key, pl.network, nil); err != nil {
		return fail(err)
	}
	ctl, theirs, err := ctlPair()
	if err != nil {
		return fail(err)
	}
	defer theirs.Close()
	bx.ctl = ctl
	l, err := s.sessionLaunch(pl, shape, theirs, bx.net.namespace())
	if err != nil {
		bx.ctl.Close()
		return fail(err)
	}
	bx.cmd = l.cmd
	born, exit, err := l.start(bx.cg)
	if err != nil {
		l.closeGoAhead()
		bx.ctl.Close()
		if bx.cmd.Process != nil {
			bx.cmd.Process.Kill()
			_ = waitCmd(bx.cmd, exit) // reaps it; err says what failed
		}
		return fail(err)
	}
	go func() {
		// bubblewrap's exit is the box's end, however it ended: each
		// process's own status reaches the server over the control socket.
		// The goroutine waits in the poller, not on a thread of its own
		// for the box's whole life (see exitWatch).
		_ = waitCmd(bx.cmd, exit)
		close(bx.dead)
		bx.ctl.Close()
	}()
	pid, err := l.release(bx.cg, born)
	if err != nil {
		syscall.Kill(-bx.cmd.Process.Pid, syscall.SIGKILL)
		<-bx.dead
		return fail(fmt.Errorf("session box: %w", err))
	}
	bx.pid1 = pid
	go bx.read()
	return bx, nil
}

// boxReadOnly is what a session box shows read-only: the read-only paths
// of the run that makes it, Options.BoxReadOnly and what
// Options.BoxReadOnlyNow names now (the quro binary is at initPath in
// every box, never at its host path: selfInBox).
func (s *Sandbox) boxReadOnly(ro []string) []string {
	more := s.boxes.readOnly
	if s.boxes.readOnlyNow != nil {
		more = append(slices.Clone(more), s.boxes.readOnlyNow()...)
	}
	for _, p := range more {
		if p = filepath.Clean(p); filepath.IsAbs(p) && exists(p) && !slices.Contains(ro, p) {
			ro = append(ro, p)
		}
	}
	return ro
}

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

func fileIDOf(p string) (fileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, true //nolint:unconvert // Dev's type differs between architectures
}

// current reports whether the read-only paths a run of shape x names
// still are, in the box, the directories at those paths on the host. A
// bind holds the directory that was at its path when the box was made:
// one renamed into place since (an installer replacing a damaged
// interpreter tree) is not what the box shows, and a run that names it
// needs a box made now.
func (bx *Box) current(x *boxShape) bool {
	for _, r := range x.readOnly {
		for d, id := range bx.roIDs {
			if !beneath(r, d) {
				continue
			}
			if now, ok := fileIDOf(d); !ok || now != id {
				return false
			}
		}
	}
	return true
}

// ctlPair is the session box's control socket: the server's end, and the
// box init's to pass it.
func ctlPair() (*net.UnixConn, *os.File, error) {
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "box-ctl"), os.NewFile(uintptr(pair[1]), "box-ctl-init")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, err
	}
	return c.(*net.UnixConn), theirs, nil
}

// Procs is how many spawned processes of the box are running.
func (bx *Box) Procs() int {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	return len(bx.procs)
}

// read takes the box init's messages until the box ends; then every
// process still running is reported lost.
func (bx *Box) read() {
	buf := make([]byte, 256)
	for {
		n, _, _, _, err := bx.ctl.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			break
		}
		kind, f, err := boxinit.DecodeMsg(buf[:n])
		if err != nil || len(f) < 1 {
			continue
		}
		if kind == boxinit.MsgSynced {
			bx.mu.Lock()
			if ch := bx.syncs[f[0]]; ch != nil {
				delete(bx.syncs, f[0])
				close(ch)
			}
			bx.mu.Unlock()
			continue
		}
		bx.mu.Lock()
		p := bx.procs[f[0]]
		bx.mu.Unlock()
		if p == nil {
			continue
		}
		switch kind {
		case boxinit.MsgStarted:
			p.boxStarted(f[1:])
		case boxinit.MsgFailed:
			if len(f) == 2 {
				p.boxEnded(boxExit{failed: f[1]})
			}
		case boxinit.MsgExited:
			if len(f) == 2 {
				ws, _ := strconv.Atoi(f[1])
				p.boxEnded(boxExit{ws: syscall.WaitStatus(ws)})
			}
		}
	}
	bx.mu.Lock()
	bx.closed = true
	for tok, ch := range bx.syncs { // no signal of the box's is on its way any more
		delete(bx.syncs, tok)
		close(ch)
	}
	left := make([]*Process, 0, len(bx.procs))
	for _, p := range bx.procs {
		left = append(left, p)
	}
	bx.mu.Unlock()
	for _, p := range left {
		p.boxEnded(boxExit{lost: true})
	}
}

// send writes one message to the box init.
func (bx *Box) send(msg []byte, files []*os.File) error {
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	bx.sendMu.Lock()
	defer bx.sendMu.Unlock()
	_, _, err := bx.ctl.WriteMsgUnix(msg, oob, nil)
	return err
}

// signal sends sig to spawned process id (group: its process group).
func (bx *Box) signal(id string, sig syscall.Signal, group bool) {
	g := "0"
	if group {
		g = "1"
	}
	// Best effort, like kill(2) on a process that may be gone: a send
	// fails only when the box is, and its processes died with it.
	_ = bx.send(boxinit.EncodeMsg(boxinit.MsgSignal, id, strconv.Itoa(int(sig)), g), nil)
}

// signalsSent returns once the box init has handled every message sent
// to it before this call, each signal by kill(2); or when the box ends
// (its processes with it), or ctx does (its error then).
func (bx *Box) signalsSent(ctx context.Context) error {
	ch := make(chan struct{})
	bx.mu.Lock()
	if bx.closed {
		bx.mu.Unlock()
		return nil
	}
	bx.seq++
	tok := "sync-" + strconv.FormatUint(bx.seq, 10)
	if bx.syncs == nil {
		bx.syncs = map[string]chan struct{}{}
	}
	bx.syncs[tok] = ch
	bx.mu.Unlock()
	forget := func() {
		bx.mu.Lock()
		delete(bx.syncs, tok)
		bx.mu.Unlock()
	}
	if err := bx.send(boxinit.EncodeMsg(boxinit.MsgSync, tok), nil); err != nil {
		forget()
		// The box is gone, and its processes: no signal is on its way.
		return fmt.Errorf("the session box is gone: %w", err)
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		forget()
		return ctx.Err()
	}
}

// Close ends the box in one step: SIGKILL to its init, pid 1 of its pid
// namespace, takes every process of the box with it; then its cgroup is
// emptied and removed. Processes still running end as killed by SIGKILL.
func (bx *Box) Close() {
	bx.kill()
	bx.finish()
}

// kill is the first step of Close: the box is marked closed and leaves
// the registry, and its init is sent SIGKILL (a frozen box thawed so that
// it dies). It does not wait.
func (bx *Box) kill() {
	bx.mu.Lock()
	bx.closed = true
	frozen := bx.frozen
	bx.mu.Unlock()
	r := bx.s.boxes
	r.mu.Lock()
	if e := r.boxes[bx.key]; e != nil && e.box == bx {
		delete(r.boxes, bx.key)
		r.closed()
	}
	r.mu.Unlock()
	// The init first: bubblewrap, its parent, reaps it and exits with it.
	// Killing bubblewrap first would leave the init to the host's pid 1 to
	// reap.
	syscall.Kill(bx.pid1, syscall.SIGKILL)
	if frozen && bx.cg != nil {
		// A frozen process dies only once thawed. If it cannot be, the
		// wait below gives up after 5 s and the cgroup's removal says so.
		_ = bx.cg.thaw()
	}
}

// finish is the rest of Close, after kill: it waits for bubblewrap's exit,
// empties and removes the box's cgroup and closes its network. It runs
// once; a later caller waits for the first to finish.
func (bx *Box) finish() {
	if !bx.begin() {
		<-bx.ended
	}
}

// begin runs the box's end unless another caller began it first, and
// reports whether it ran it.
func (bx *Box) begin() bool {
	if !bx.begun.CompareAndSwap(false, true) {
		return false
	}
	defer close(bx.ended)
	select {
	case <-bx.dead:
	case <-time.After(5 * time.Second):
		syscall.Kill(-bx.cmd.Process.Pid, syscall.SIGKILL)
		<-bx.dead
	}
	if bx.cg != nil {
		bx.cg.kill()
		bx.cg.remove()
	}
	bx.net.close()
	return true
}

// endBounded is finish for a box EndSession left to end in the
// background: the end runs in one of the registry's teardown slots, or
// is waited for if another caller began it. A waiter (AwaitEnded, an
// admission at a tenant ceiling, CloseBoxes) of a box whose end waits
// for a slot waits for that slot too, or for the end if the box's own
// turn comes first: whoever takes a slot first runs it, and no one waits
// behind an end that is not running or about to.
func (bx *Box) endBounded() {
	r := bx.s.boxes
	slots := r.slots()
	r.queued.Add(1)
	r.teardownChanged(false)
	select {
	case <-bx.ended:
		r.queued.Add(-1)
		r.teardownChanged(false)
		return
	case slots <- struct{}{}:
	}
	r.queued.Add(-1)
	if bx.begun.Load() { // another caller runs it: give the slot back
		<-slots
		r.teardownChanged(false)
		<-bx.ended
		return
	}
	r.tearing.Add(1)
	r.teardownChanged(true)
	bx.begin()
	r.tearing.Add(-1)
	<-slots
	r.teardownChanged(false)
	<-bx.ended
}

// Done is closed when the box has ended.
func (bx *Box) Done() <-chan struct{} { return bx.dead }

// spawn starts pl in the box: the init child of pl, forked by the box
// init with pl's descriptors, then the same handshake as a box of its own.
func (bx *Box) spawn(ctx context.Context, pl *plan) (*Process, error) {
	s, spec := bx.s, pl.spec
	p := &Process{ctx: ctx, drain: s.drainGrace, boxed: true, tty: spec.TTY, errW: spec.Stderr,
		bx: bx, ended: make(chan struct{}), started: make(chan struct{})}
	if s.note != nil {
		p.note = func() string { return s.note(spec.Dir) }
	}
	launched := false // launch took boxFor's claim
	defer func() {
		if !launched {
			bx.unclaim()
		}
	}()
	statusR, statusW, err := credPair()
	if err != nil {
		return nil, pl.startErr(err)
	}
	defer statusR.Close()
	pb, err := pl.plumb(p, statusR, statusW)
	if err == nil {
		var args []string
		if args, err = pl.initArgs(pb); err == nil {
			launched = true
			err = bx.launch(p, pl, pb, args)
		}
	}
	pb.closeChildEnds()
	if err != nil {
		p.closeParent()
		if errors.Is(err, ErrInvalidSpec) {
			return nil, err
		}
		return nil, pl.startErr(err)
	}
	pb.run(p, spec.Stdin)
	// No goroutine waits for ctx for the whole run (a session's shell and
	// Python worker run as long as the session): AfterFunc starts one only
	// when ctx ends first.
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-p.ended:
		default:
			bx.signal(p.boxID, syscall.SIGKILL, true)
		}
	})
	bx.mu.Lock()
	select {
	case <-p.ended:
		stop()
	default:
		p.unwatch = stop // boxEnded calls it
	}
	bx.mu.Unlock()
	if h := statusHook.Load(); h != nil {
		(*h)(p)
	}
	pid, msg, ready := readStatus(ctx, statusR)
	p.pid = pid
	if ready && !p.awaitBoxPid() {
		// The box ended before it said the program's pid, or named none
		// that can be: the start fails (a process no one can name is
		// ended, not handed out with pid 0).
		ready = false
		bx.signal(p.boxID, syscall.SIGKILL, true)
	}
	if ready {
		// ctx may have ended before the init spawned the program: the
		// kill AfterFunc sent then found nothing to kill (a 100 ms
		// timeout on a loaded machine ran its process for ever).
		if ctx.Err() != nil {
			bx.signal(p.boxID, syscall.SIGKILL, true)
		}
		return p, nil
	}
	if msg == "" && ctx.Err() != nil {
		bx.awaitStartKilled(p)
	}
	p.Wait()
	from := FailInit
	if msg == "" {
		from = FailBox
		switch {
		case p.boxExit.failed != "":
			msg = p.boxExit.failed
		case ctx.Err() != nil:
			msg = canceledWhileStarting(ctx)
		default:
			msg = "the session box ended while the program was starting"
		}
	}
	return nil, initFailure(pl.prog, msg, from)
}

// stuckBoxGrace is how often a start whose caller gave up (its context
// ended before the init child's status came) looks at the box init while
// it waits for it to end the process, as the kill sent at the context's
// end asks.
const stuckBoxGrace = 10 * time.Second

// awaitStartKilled waits for the end of p, whose start's context ended
// before its status came. A box init that has not ended it within
// s.stuckGrace and is stopped (a SIGSTOP, a tracer's stop) cannot: its
// box is closed, which ends every process of it. One merely slow at load
// is waited for, up to the start bound, before its box is closed too: a
// start never waits for ever on a box that does not answer.
func (bx *Box) awaitStartKilled(p *Process) {
	t := time.NewTimer(bx.s.stuckGrace)
	defer t.Stop()
	for waited := time.Duration(0); ; {
		select {
		case <-p.ended:
			return
		case <-t.C:
		}
		waited += bx.s.stuckGrace
		if stopped(bx.pid1) || waited >= bx.s.startLimit {
			break
		}
		t.Reset(bx.s.stuckGrace)
	}
	bx.s.log.Warn("a session box did not end a start its caller gave up on; the box is closed with its processes",
		"session", bx.key, "stopped", stopped(bx.pid1))
	bx.Close()
	<-p.ended // the box's end ends every process registered in it
}

// stopped reports whether process pid is stopped: by a signal (T) or by
// a tracer (t).
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}

// launch registers p and asks the box init to spawn it. It takes the
// claim boxFor made for p's run: on every path it is given back or
// turned into p's registration.
func (bx *Box) launch(p *Process, pl *plan, pb *plumbing, args []string) error {
	files := make([]*os.File, 0, 3+len(pb.fds.files))
	for _, f := range pb.stdio {
		if f == nil {
			f = devNull()
			if f == nil {
				bx.unclaim()
				return errors.New("cannot open /dev/null")
			}
		}
		files = append(files, f)
	}
	files = append(files, pb.fds.files...)
	if len(files) > boxinit.MaxMsgFDs {
		bx.unclaim()
		return fmt.Errorf("%w: too many descriptors (%d)", ErrInvalidSpec, len(files))
	}
	tty := "0"
	if pl.spec.TTY {
		tty = "1"
	}
	if bx.cg != nil {
		p.oomBefore = bx.cg.oomCounts()
	}
	bx.mu.Lock()
	bx.claims--
	if bx.closed {
		bx.mu.Unlock()
		return errors.New("the session box was closed")
	}
	if bx.frozen {
		bx.mu.Unlock()
		return ErrPaused
	}
	bx.seq++
	p.boxID = strconv.FormatUint(bx.seq, 10)
	bx.procs[p.boxID] = p
	bx.mu.Unlock()
	dir := inView(bx.shape.views(), pl.spec.Dir)
	if pl.spec.StartsInHome {
		dir = HomeUser // the box shows the workspace there (prepare)
	}
	argv := append([]string{p.boxID, dir, tty, initPath}, args...)
	msg := boxinit.EncodeMsg(boxinit.MsgSpawn, argv...)
	if len(msg) > boxinit.MaxMsg {
		bx.forget(p)
		return fmt.Errorf("%w: the program's arguments and policy are %d bytes; the limit is %d", ErrInvalidSpec, len(msg), boxinit.MaxMsg)
	}
	p.start = time.Now()
	if err := bx.send(msg, files); err != nil {
		bx.forget(p)
		return fmt.Errorf("session box: %w", err)
	}
	return nil
}

func (bx *Box) forget(p *Process) {
	bx.mu.Lock()
	delete(bx.procs, p.boxID)
	bx.mu.Unlock()
}

// devNull is the server's /dev/null, opened once, for the stdio a spec
// leaves unset.
var devNull = sync.OnceValue(func() *os.File {
	f, _ := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	return f
})

// boxExit is how the box init reported a spawned process's end.
type boxExit struct {
	ws     syscall.WaitStatus
	failed string // the box init could not fork or exec the init child
	lost   bool   // the box ended first
}

// maxBoxPid bounds a pid the box init names: the kernel's PID_MAX_LIMIT
// on 64-bit Linux. Pid 1 is the box init itself, never a spawned program.
const maxBoxPid = 1 << 22

// boxStarted records the box init's Started for p (its fields after the
// id: the program's pid in the box, then how it started): only the first
// counts. A pid that cannot be a spawned program's (not a decimal number
// in 2..maxBoxPid) is none: the start fails (awaitBoxPid).
func (p *Process) boxStarted(f []string) {
	pid := 0
	if len(f) == 1 || len(f) == 2 && f[1] == boxinit.BySpawner {
		pid = parseBoxPid(f[0])
	}
	p.bx.mu.Lock()
	defer p.bx.mu.Unlock()
	select {
	case <-p.started:
		return
	default:
	}
	p.boxPid = pid
	p.bySpawner = len(f) == 2
	close(p.started)
}

// parseBoxPid is the pid s names, or 0 when it is no spawned program's.
func parseBoxPid(s string) int {
	if s == "" || len(s) > 7 {
		return 0
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	if n < 2 || n > maxBoxPid {
		return 0
	}
	return n
}

// awaitBoxPid waits, after p's ready status, for the box init's Started
// for p, and reports whether it named p's pid in the box. The box init
// sends Started before it can report the program's end (its Exited), so
// a program that ended at once still has its pid; only a box that ended
// first (every process lost) or a pid out of bounds leaves none.
func (p *Process) awaitBoxPid() bool {
	select {
	case <-p.started:
	case <-p.ended:
	}
	select {
	case <-p.started:
		return p.boxPid > 0
	default:
		return false
	}
}

// boxEnded records how p ended (once).
func (p *Process) boxEnded(e boxExit) {
	p.bx.mu.Lock()
	if p.bx.procs[p.boxID] != p {
		p.bx.mu.Unlock()
		return
	}
	delete(p.bx.procs, p.boxID)
	p.boxExit = e
	close(p.ended)
	unwatch := p.unwatch
	p.bx.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
}

// credPair is a stream socket pair whose first end receives its peer's
// credentials: the init child's status channel in a session box, so that
// the server learns the program's host pid from the kernel.
func credPair() (mine, theirs *os.File, err error) {
	m, t, err := CredSocketPair()
	if err != nil {
		return nil, nil, err
	}
	// Non-blocking, so that the server's end is read through the poller
	// (readStatus) and a start that waits for its status holds no thread.
	if err := syscall.SetNonblock(m, true); err != nil {
		syscall.Close(m)
		syscall.Close(t)
		return nil, nil, err
	}
	return os.NewFile(uintptr(m), "status"), os.NewFile(uintptr(t), "status-child"), nil
}

// CredSocketPair is a Unix stream socket pair (close-on-exec) whose first
// end receives, with every message, its writer's credentials (pid, uid)
// translated by the kernel into the receiver's namespaces: how the server
// knows which process in a box wrote.
func CredSocketPair() (mine, theirs int, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	if err := syscall.SetsockoptInt(fds[0], syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return -1, -1, err
	}
	return fds[0], fds[1], nil
}

// statusGrace is how long a start's status read goes on after the
// start's context ended (readStatus).
const statusGrace = 5 * time.Second

// readStatus reads the init child's status channel: ready, or the reason
// it could not exec, and the host pid of the process that wrote it. It
// ends when ctx does (not ready, no reason): a status that never comes
// (a box init stopped or traced, which neither spawns the program nor
// kills it) does not hold the start past its context.
func readStatus(ctx context.Context, f *os.File) (pid int, msg string, ready bool) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err.Error(), false
	}
	// f is in the poller: a deadline wakes the read below. Not at once
	// when ctx ends: a program its box's spawner started may run before
	// the init's status for it comes (the init answers after the
	// spawner), and a status that comes within statusGrace makes the
	// start a started program, which the caller's end then stops as a
	// run (interrupted), not a start that never was.
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now().Add(statusGrace)) })
	defer stop()
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(syscall.SizeofUcred)+syscall.CmsgSpace(4))
	var out []byte
	for len(out) < 64<<10 {
		var n, oobn int
		var rerr error
		// In the poller: the goroutine parks until the init child writes
		// or closes its end.
		if err := rc.Read(func(fd uintptr) bool {
			for {
				n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), buf, oob, syscall.MSG_DONTWAIT|syscall.MSG_CMSG_CLOEXEC)
				if rerr != syscall.EINTR {
					return rerr != syscall.EAGAIN
				}
			}
		}); err != nil || rerr != nil || n == 0 {
			break
		}
		if p := statusPid(oob[:oobn]); pid == 0 {
			pid = p
		}
		if len(out) == 0 && buf[0] == boxinit.ReadyByte {
			return pid, "", true
		}
		out = append(out, buf[:n]...)
	}
	return pid, string(out), false
}

// statusPid is the host pid a status message names: the pidfd that came
// with it (the box init's answer for a program its spawner started), else
// its writer's credentials (the init child, about to exec the program).
// Descriptors that came with it are closed.
func statusPid(oob []byte) int {
	if len(oob) == 0 {
		return 0
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	byFD, byCred, sent := 0, 0, false
	for _, m := range msgs {
		if fds, err := syscall.ParseUnixRights(&m); err == nil {
			for _, fd := range fds {
				sent = true
				if byFD == 0 {
					byFD = pidfdPid(fd)
				}
				syscall.Close(fd)
			}
		} else if c, err := syscall.ParseUnixCredentials(&m); err == nil {
			byCred = int(c.Pid)
		}
	}
	if sent {
		// The box init's answer for a spawner's program: its writer is
		// the box init, never the program. A program that ended and was
		// reaped before the read has no pid left (0), not the init's.
		return byFD
	}
	return byCred
}

// pidfdPid is the pid, in the server's namespace, of the process pidfd
// refers to (its fdinfo's Pid line); 0 if fd is no pidfd of a live or
// unreaped process.
func pidfdPid(fd int) int {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, _ := strconv.Atoi(strings.TrimSpace(v))
			return max(pid, 0)
		}
	}
	return 0
}

// waitBox is Wait for a process spawned in a session box.
func (p *Process) waitBox() Exit {
	<-p.ended
	var oom OOM
	killed := false
	if p.bx.cg != nil {
		killed, oom = p.bx.cg.oomSince(p.oomBefore, true)
	}
	e := p.finish()
	e.OOMKilled, e.OOM = killed, oom
	switch {
	case p.boxExit.lost:
		e.Code, e.Signal = 128+int(syscall.SIGKILL), syscall.SIGKILL
	case p.boxExit.failed != "":
		e.Code = -1
	case p.boxExit.ws.Signaled():
		e.Signal = p.boxExit.ws.Signal()
		e.Code = 128 + int(e.Signal)
	default:
		e.Code = p.boxExit.ws.ExitStatus()
	}
	return e
}

// finish closes stdin, drains the output (bounded by the drain grace),
// appends the note, and fills in what every Exit has.
func (p *Process) finish() Exit {
	if p.stdinW != nil {
		p.stdinW.Close()
	}
	deadline := time.Now().Add(p.drain)
	for _, r := range p.readers {
		r.SetReadDeadline(deadline)
	}
	p.pumps.Wait()
	for _, r := range p.readers {
		r.Close()
	}
	if p.note != nil && p.errW != nil {
		if n := p.note(); n != "" {
			_, _ = io.WriteString(p.errW, n) // the run's stderr sink: where it goes is its writer's business
		}
	}
	e := Exit{Duration: time.Since(p.start)}
	switch {
	case timedOut(p.ctx):
		e.TimedOut = true
	case p.ctx.Err() != nil:
		e.Canceled = true
	}
	p.errMu.Lock()
	e.Abandoned = errors.Is(p.pumpErr, os.ErrDeadlineExceeded)
	p.errMu.Unlock()
	return e
}

// ErrPaused is a spawn into a paused box.
var ErrPaused = errors.New("the session is paused: resume it first")

// Pause freezes every process of the box (the cgroup freezer): they keep
// their memory and state and use no CPU until Resume.
func (bx *Box) Pause() error {
	if bx.cg == nil || !bx.cg.canFreeze() {
		return errNoFreezer
	}
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if bx.closed {
		return errors.New("the session box was closed")
	}
	if bx.frozen {
		return nil
	}
	if err := bx.cg.freeze(); err != nil {
		_ = bx.cg.thaw() // undo a half-done freeze; err is what failed
		return err
	}
	bx.frozen = true
	return nil
}

// Resume thaws a paused box.
func (bx *Box) Resume() error {
	if bx.cg == nil {
		return errNoFreezer
	}
	bx.mu.Lock()
	defer bx.mu.Unlock()
	if !bx.frozen {
		return nil
	}
	if err := bx.cg.thaw(); err != nil {
		return err
	}
	bx.frozen = false
	return nil
}

// Paused reports whether the box is frozen.
func (bx *Box) Paused() bool {
	bx.mu.Lock()
	defer bx.mu.Unlock()
	return bx.frozen
}

// CanPause reports whether this machine can freeze the box.
func (bx *Box) CanPause() bool { return bx.cg != nil && bx.cg.canFreeze() }

// Usage is what the box's processes use now (zero without the cgroup
// layer).
func (bx *Box) Usage() Usage {
	if bx.cg == nil {
		return Usage{}
	}
	return bx.cg.usage()
}

// Limits are the box's cgroup limits (memory, tasks, CPU) and the rlimits
// its first run had.
func (bx *Box) Limits() Limits { return bx.limits }

// CloseBoxes ends every session box (the server's shutdown).
func (s *Sandbox) CloseBoxes() {
	r := s.boxes
	if r == nil {
		return
	}
	r.mu.Lock()
	var all []*boxEntry
	for _, e := range r.boxes {
		all = append(all, e)
	}
	ending := make([]*Box, 0, len(r.ending))
	for _, bx := range r.ending {
		ending = append(ending, bx)
	}
	r.mu.Unlock()
	for _, e := range all {
		<-e.ready
		if e.box != nil {
			e.box.Close()
		}
	}
	for _, bx := range ending { // ended by EndSession: their ends under way
		bx.endBounded()
	}
}

// SessionBoxes reports whether runs of a session are spawned in its box.
func (s *Sandbox) SessionBoxes() bool { return s.boxes != nil && s.Boxed() }

// BoxKeys lists the sessions that have an open box.
func (s *Sandbox) BoxKeys() []string {
	r := s.boxes
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.boxes))
	for k := range r.boxes {
		keys = append(keys, k)
	}
	return keys
}

// CgroupPids lists the host pids of the processes in p's cgroup — its
// session box's, or the box of its own that it runs in — from one read of
// cgroup.procs: what looking at "the processes of this box" costs without
// walking the host's /proc. It is nil when p has no cgroup (the cgroup
// layer is off), empty once the cgroup is gone. The server's own pid,
// which a thread of it starting a run may leave listed, is never in it.
func (p *Process) CgroupPids() []int {
	cg := p.cg
	if p.bx != nil {
		cg = p.bx.cg
	}
	if cg == nil || len(cg.dirs) == 0 {
		return nil
	}
	dir := cg.byCtrl["pids"]
	if dir == "" {
		dir = cg.dirs[0]
	}
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	pids := []int{}
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil && n != os.Getpid() {
			pids = append(pids, n)
		}
	}
	return pids
}
