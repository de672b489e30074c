package boxfs

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/boxfs/boxhelper"
)

// Starter starts the serving helper (boxhelper.Arg boxhelper.ServeOp) in
// the session's box as a program of the session, stdin and stdout its
// standard input and output; it ends when lifetime does. pid is its
// process id as the server sees it; done is closed once it has exited.
type Starter func(lifetime context.Context, stdin, stdout *os.File) (pid int, done <-chan struct{}, err error)

// DefaultIdle is how long a Helper's process may sit unused before it is
// stopped.
const DefaultIdle = 2 * time.Minute

// Helper is one session's long-lived file helper: a process of the
// session started on the first call (through start), serving one request
// at a time over its standard input and output (boxhelper.Serve's
// framing), stopped after idle without a call, by Stop (the session is
// paused) or Close (it ended), and started again when a call finds it
// gone. Its Run is the Runner of the session's FS. What it answers is
// read as hostile: at most max bytes per reply, or the process is killed.
type Helper struct {
	start Starter
	idle  time.Duration
	sem   chan struct{} // one request at a time

	mu     sync.Mutex
	cur    *conn
	closed bool
	starts int
}

// conn is one process of a Helper.
type conn struct {
	cancel context.CancelFunc
	req    *os.File // its standard input
	rep    *os.File // its standard output
	rbuf   *bufio.Reader
	pid    int
	done   <-chan struct{}
	busy   bool        // under Helper.mu
	timer  *time.Timer // the idle stop, under Helper.mu
	used   bool        // served a request already
}

// NewHelper returns a session's helper, started by start when first
// used; idle <= 0 means DefaultIdle.
func NewHelper(start Starter, idle time.Duration) *Helper {
	if idle <= 0 {
		idle = DefaultIdle
	}
	return &Helper{start: start, idle: idle, sem: make(chan struct{}, 1)}
}

// ErrDied is a helper that stopped answering in the middle of a request
// (killed by the session's code, the box paused or ended under it).
var ErrDied = errors.New("the session box's file helper ended during the operation")

// ErrClosed is a call after the session ended.
var ErrClosed = errors.New("the session ended")

// errOver is a reply larger than the request's bound.
var errOver = errors.New("reply over its bound")

// Running reports whether a helper process is up.
func (h *Helper) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur != nil && !isDone(h.cur.done)
}

// Pid is the running helper's process id (0: none).
func (h *Helper) Pid() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil || isDone(h.cur.done) {
		return 0
	}
	return h.cur.pid
}

// Starts is how many helper processes were started.
func (h *Helper) Starts() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.starts
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Stop ends the helper's process, also under a request (which fails with
// ErrDied); the next call starts another.
func (h *Helper) Stop() {
	h.mu.Lock()
	c := h.cur
	h.cur = nil
	h.mu.Unlock()
	if c != nil {
		c.kill()
	}
}

// Close stops the helper for good.
func (h *Helper) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.Stop()
}

func (c *conn) kill() {
	c.cancel()
	if c.timer != nil {
		c.timer.Stop()
	}
	c.req.Close()
	c.rep.Close()
}

// drop ends c if it is still the current process.
func (h *Helper) drop(c *conn) {
	h.mu.Lock()
	if h.cur == c {
		h.cur = nil
	}
	h.mu.Unlock()
	c.kill()
}

// take returns the running process, marked busy, starting one if there
// is none (or it died).
func (h *Helper) take() (*conn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if c := h.cur; c != nil {
		if c.timer != nil {
			c.timer.Stop()
		}
		if !isDone(c.done) {
			c.busy = true
			return c, nil
		}
		h.cur = nil
		c.kill()
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, err
	}
	lifetime, cancel := context.WithCancel(context.Background())
	pid, done, err := h.start(lifetime, reqR, repW)
	reqR.Close()
	repW.Close()
	if err != nil {
		cancel()
		reqW.Close()
		repR.Close()
		return nil, err
	}
	h.starts++
	c := &conn{cancel: cancel, req: reqW, rep: repR, rbuf: bufio.NewReaderSize(repR, 64<<10), pid: pid, done: done, busy: true}
	h.cur = c
	return c, nil
}

// release marks c idle and arms its idle stop.
func (h *Helper) release(c *conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.busy = false
	if h.cur != c {
		return
	}
	c.timer = time.AfterFunc(h.idle, func() {
		h.mu.Lock()
		if h.cur != c || c.busy {
			h.mu.Unlock()
			return
		}
		h.cur = nil
		h.mu.Unlock()
		c.kill()
	})
}

// Run is the Runner of the session's FS: it serves the operation args
// (boxhelper.Arg first) with stdin its input, and writes its answer to
// stdout — or kills the process when the answer is over max bytes. It
// returns 0, or 2 for a request the helper refused.
func (h *Helper) Run(ctx context.Context, args []string, stdin []byte, max int64, stdout io.Writer) (int, error) {
	if len(args) > 0 && args[0] == boxhelper.Arg {
		args = args[1:]
	}
	raw, err := json.Marshal(args)
	if err != nil || len(raw) > boxhelper.MaxArgs || len(stdin) > boxhelper.MaxInput {
		return 0, errors.New("the file operation's request is too large")
	}
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	defer func() { <-h.sem }()
	for try := 0; ; try++ {
		c, err := h.take()
		if err != nil {
			return 0, err
		}
		fresh := !c.used
		c.used = true
		code, st, err := c.do(ctx, raw, stdin, max, stdout)
		if err == nil {
			h.release(c)
			return code, nil
		}
		h.drop(c)
		switch {
		case ctx.Err() != nil:
			return 0, context.Cause(ctx)
		case errors.Is(err, errOver):
			return 0, err
		case try == 0 && !fresh && (st == unsent || st == unanswered && retryable(args)):
			// The process had ended (idle, killed) before it took the
			// request, or ended without answering an operation that
			// changes nothing: once more, with a new one.
			continue
		}
		return 0, ErrDied
	}
}

// retryable: the operation args changes nothing, or doing it twice does
// what doing it once does.
func retryable(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "read", "stat", "list", "mkdir":
		return true
	case "write":
		return len(args) > 2 && args[2] == "replace"
	}
	return false
}

// how far a request got before it failed
const (
	unsent     = iota // not all of it reached the pipe
	unanswered        // sent, and not a byte of the answer came
	answering         // part of the answer came
)

// do sends one request and copies its answer; st says how far it got
// when it fails.
func (c *conn) do(ctx context.Context, raw, stdin []byte, max int64, stdout io.Writer) (code, st int, err error) {
	stop := context.AfterFunc(ctx, func() {
		now := time.Now()
		_ = c.req.SetWriteDeadline(now) // best effort: the pipe may be closed
		_ = c.rep.SetReadDeadline(now)
	})
	defer stop()
	hdr := make([]byte, 0, 4+len(raw)+8)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(raw)))
	hdr = append(hdr, raw...)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(stdin)))
	if len(stdin) <= 64<<10 {
		hdr = append(hdr, stdin...)
		stdin = nil
	}
	if _, err := c.req.Write(hdr); err != nil {
		return 0, unsent, err
	}
	if len(stdin) > 0 {
		if _, err := c.req.Write(stdin); err != nil {
			return 0, unsent, err
		}
	}
	var rh [9]byte
	if n, err := io.ReadFull(c.rbuf, rh[:]); err != nil {
		if n == 0 {
			return 0, unanswered, err
		}
		return 0, answering, err
	}
	n := binary.BigEndian.Uint64(rh[1:])
	if n > uint64(max) {
		return 0, answering, errOver
	}
	if _, err := io.CopyN(stdout, c.rbuf, int64(n)); err != nil {
		return 0, answering, err
	}
	if rh[0] != boxhelper.StatusOK {
		return 2, answering, nil
	}
	return 0, answering, nil
}
