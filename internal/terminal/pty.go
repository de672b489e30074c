package terminal

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
)

// The size of a new PTY when none is asked for.
const (
	DefaultCols = 120
	DefaultRows = 32
)

// PTYOptions configure a PTY.
type PTYOptions struct {
	Sandbox *sandbox.Sandbox
	Session *session.Session
	Cwd     string
	Env     map[string]string
	// Rootfs is the directory of the session's root filesystem ("" for
	// the host userland); the network policy is the session's.
	Rootfs     string
	Cols, Rows int // 120x32 when zero
	// Scrollback bytes replayed to a viewer that attaches (256 KiB).
	Scrollback int
	// ViewerQueue is how many chunks a viewer may lag before it is dropped (256).
	ViewerQueue int
	// ModelBudget is the parse time the screen model may spend in every
	// 100 ms (20 ms): a flood beyond it is dropped from the model, never
	// from the scrollback or the viewers.
	ModelBudget time.Duration
}

// PTY is an interactive shell on a pseudo-terminal, for people and for
// programs that need a terminal (REPLs, editors, top). It keeps a
// server-side screen model so that an agent can read what a person would
// see, and a scrollback that a viewer gets replayed when it attaches.
// Several viewers may attach; a viewer that cannot keep up is dropped rather
// than slowing the others. Safe for concurrent use.
type PTY struct {
	master *os.File
	proc   *sandbox.Process
	exited chan struct{}
	code   int

	model  *model
	scroll *Ring
	esc    escFilter // only read() uses it
	queue  int

	mu      sync.Mutex
	viewers map[*Viewer]struct{}
	cols    int
	rows    int
}

// Viewer receives what the PTY prints. Read from C until it is closed; it
// is closed when the viewer detaches, is dropped for lagging, or the PTY ends.
type Viewer struct {
	C       chan []byte
	Dropped bool // closed because it fell behind
	once    sync.Once
}

func (v *Viewer) close() { v.once.Do(func() { close(v.C) }) }

// StartPTY starts a shell on a new pseudo-terminal in the session's sandbox.
func StartPTY(opts PTYOptions) (*PTY, error) {
	if opts.Cols <= 0 || opts.Rows <= 0 {
		opts.Cols, opts.Rows = DefaultCols, DefaultRows
	}
	if opts.Scrollback <= 0 {
		opts.Scrollback = 256 << 10
	}
	if opts.ViewerQueue <= 0 {
		opts.ViewerQueue = 256
	}
	master, slave, err := pty.Open()
	if err != nil {
		return nil, err
	}
	defer slave.Close()
	if master, err = pollable(master); err != nil {
		return nil, err
	}
	if err := setsize(master, opts.Cols, opts.Rows); err != nil {
		master.Close()
		return nil, err
	}
	prog := []string{"bash", "--login"}
	if _, err := opts.Sandbox.LookPath("bash"); err != nil {
		prog = []string{"sh", "-i"}
	}
	// The recorded cwd is the session's choice (the shell's directory
	// after its last command: anything the box can cd to, /usr
	// included). The server never resolves it: the spec's Dir — which the
	// sandbox binds read-write and hands to the session's uid — is the
	// workspace, and the box's own sh enters the cwd (staying in the
	// workspace when it cannot).
	if opts.Cwd != "" && opts.Cwd != opts.Session.Workspace() {
		prog = append([]string{"sh", "-c", `cd -- "$0" 2>/dev/null; exec "$@"`, opts.Cwd}, prog...)
	}
	// The session's uid and the whole workspace, whichever subdirectory
	// the terminal starts in: a uid derived from the starting directory
	// would take that directory over.
	spec := opts.Session.Spec(prog...)
	spec.Writable = []string{opts.Session.Workspace()}
	spec.Rootfs, spec.Term, spec.Env = opts.Rootfs, "xterm-256color", opts.Env
	spec.Stdin, spec.Stdout, spec.Stderr, spec.TTY = slave, slave, slave, true
	proc, err := opts.Sandbox.Start(context.Background(), spec)
	if err != nil {
		master.Close()
		return nil, err
	}
	p := &PTY{
		master: master, proc: proc, exited: make(chan struct{}),
		model: newModel(opts.Cols, opts.Rows, opts.ModelBudget), scroll: NewRing(opts.Scrollback),
		queue: opts.ViewerQueue, viewers: map[*Viewer]struct{}{}, cols: opts.Cols, rows: opts.Rows,
	}
	go p.model.run()
	go p.read()
	go func() {
		e := proc.Wait()
		p.mu.Lock()
		p.code = e.Code
		p.mu.Unlock()
		close(p.exited)
		// The reader ends (and then the screen model) when the
		// terminal's last copy closes, or drainAfterExit from now: a
		// job the shell left in the background may keep the terminal
		// open long after, and the viewers wait for the end to be told.
		_ = master.SetReadDeadline(time.Now().Add(drainAfterExit))
	}()
	return p, nil
}

// drainAfterExit is how long the PTY's output is still read after its
// shell has exited: what the shell printed last is in the master's buffer
// by then, and read at once.
const drainAfterExit = 2 * time.Second

// pollable is the PTY's master f in non-blocking mode, in Go's poller, so
// that a read deadline ends its Read. pty.Open's ioctls go through
// (*os.File).Fd, which leaves a file blocking, and a blocking read of the
// master returns only once every copy of the terminal is closed; Close
// does not interrupt it.
func pollable(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), nil
}

// setsize sets the terminal size through the master's raw descriptor
// (pty.Setsize would make it blocking again; see pollable).
func setsize(master *os.File, cols, rows int) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	}); err != nil {
		return err
	}
	return ioErr
}

func (p *PTY) read() {
	buf := make([]byte, 32<<10)
	for {
		n, err := p.master.Read(buf)
		// What a viewer must not get (escFilter) is taken out once, here:
		// the scrollback replayed to a viewer holds none of it either.
		if chunk := p.esc.filter(buf[:n]); len(chunk) > 0 {
			p.model.feed(chunk)
			p.publish(chunk)
		}
		if err != nil {
			p.master.Close()
			p.model.end()
			p.mu.Lock()
			for v := range p.viewers {
				delete(p.viewers, v)
				v.close()
			}
			p.mu.Unlock()
			return
		}
	}
}

// publish keeps chunk in the scrollback and sends it to every viewer, in
// one step under p.mu, as AttachQueue takes the scrollback and adds a
// viewer: a viewer gets each chunk once, in its replay or live, never in
// both (a chunk kept before the viewer was added and sent after it was
// drawn twice on a reconnecting terminal) and never in neither.
func (p *PTY) publish(chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scroll.Write(chunk)
	for v := range p.viewers {
		select {
		case v.C <- chunk:
		default: // this viewer fell behind: drop it, not the others
			v.Dropped = true
			delete(p.viewers, v)
			v.close()
		}
	}
}

// Attach adds a viewer and returns it with the scrollback to replay first.
func (p *PTY) Attach() (*Viewer, []byte) { return p.AttachQueue(0) }

// AttachQueue is Attach with the viewer's own lag allowance in chunks (0:
// the PTY's default).
func (p *PTY) AttachQueue(queue int) (*Viewer, []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if queue <= 0 {
		queue = p.queue
	}
	v := &Viewer{C: make(chan []byte, queue)}
	replay := p.scroll.Bytes()
	select {
	case <-p.exited:
		v.close()
	default:
		p.viewers[v] = struct{}{}
	}
	return v, replay
}

// Detach removes a viewer.
func (p *PTY) Detach(v *Viewer) {
	p.mu.Lock()
	delete(p.viewers, v)
	p.mu.Unlock()
	v.close()
}

// Write sends raw input (keys, pastes, ^C as \x03, ^D as \x04, arrows as
// escape sequences) to the terminal.
func (p *PTY) Write(b []byte) (int, error) {
	select {
	case <-p.exited:
		return 0, ErrClosed
	default:
	}
	return p.master.Write(b)
}

// Resize changes the terminal size.
func (p *PTY) Resize(cols, rows int) error {
	if cols <= 0 || rows <= 0 || cols > 1000 || rows > 1000 {
		return errors.New("terminal size must be between 1x1 and 1000x1000")
	}
	p.mu.Lock()
	p.cols, p.rows = cols, rows
	p.mu.Unlock()
	p.model.resize(cols, rows)
	return setsize(p.master, cols, rows)
}

// Size returns the terminal size.
func (p *PTY) Size() (cols, rows int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cols, p.rows
}

// Screen returns the visible screen as plain text, one line per row, as
// far as the screen model has parsed the output (see vtmodel.go).
func (p *PTY) Screen() string { return p.model.screen() }

// ModelStats reports what the screen model parsed, dropped and clamped.
func (p *PTY) ModelStats() ModelStats { return p.model.stats() }

// ScreenChanged returns a channel closed when the screen model next parses
// a piece of output (or has parsed all of it after the shell ended).
func (p *PTY) ScreenChanged() <-chan struct{} { return p.model.changed() }

// Scrollback returns the bytes kept for replay.
func (p *PTY) Scrollback() []byte { return p.scroll.Bytes() }

// Alive reports whether the shell still runs.
func (p *PTY) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// ExitCode is the shell's exit status once it has ended (ok false before).
func (p *PTY) ExitCode() (code int, ok bool) {
	select {
	case <-p.exited:
	default:
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code, true
}

// Done is closed when the shell has ended.
func (p *PTY) Done() <-chan struct{} { return p.exited }

// Close kills the shell and its process group.
func (p *PTY) Close() {
	p.proc.Kill()
	<-p.exited
}

// Viewers is how many viewers are attached.
func (p *PTY) Viewers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.viewers)
}
