package transpile

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/quro-dev/quro/internal/limitbuf"
	"github.com/quro-dev/quro/internal/sandbox"
)

// A child, once confined, says hello (an empty frame) on its stdout, then
// serves requests one at a time, each framed as a uint32 big-endian length
// and that many bytes of JSON, on its stdin and stdout, until its stdin
// ends. A child that exits before its hello could not start: the error
// passes on its stderr's first line instead of blaming the code. Starting the quro binary costs some 100 ms on a
// loaded machine, esbuild's transform of a snippet 2 ms: idle children are
// kept and reused. A child that crashed, timed out or answered out of
// shape is killed and never reused; a child is retired once the requests
// it served add up to retireAfter of wall-clock time, well within its CPU
// limit (childCPU, counted over its life; GOMAXPROCS=2 spends at most
// twice the wall-clock time).
const (
	retireAfter = 2 * time.Minute
	childCPU    = 600 // seconds
	maxIdle     = 2
)

type child struct {
	in     *os.File // the child's stdin (ours to write)
	out    *os.File // the child's stdout (ours to read)
	kill   context.CancelFunc
	dead   chan struct{}    // closed when the child has exited
	stderr *limitbuf.Buffer // the child's stderr; read once dead is closed
	hello  bool             // the child's hello has been read: it started
	busy   time.Duration    // the wall-clock time of the requests it served
}

// childArgs is the child's command line after the binary.
var childArgs = []string{Arg, fmt.Sprint(childCPU)}

var (
	idleMu sync.Mutex
	idle   []*child
)

// startChild starts a child through sandbox.RunHelper, which owns its
// process group and reaps it.
func startChild() (*child, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &child{in: inW, out: outR, kill: cancel, dead: make(chan struct{}), stderr: &limitbuf.Buffer{Max: 4 << 10}}
	args := childArgs
	go func() {
		_ = sandbox.RunHelper(ctx, &sandbox.Helper{
			Path:         "/proc/self/exe",
			Args:         args,
			Env:          []string{"GOMAXPROCS=2", "GOTRACEBACK=none"},
			Stdin:        inR,
			Stdout:       outW,
			Stderr:       c.stderr,
			Unprivileged: true,
			WaitDelay:    time.Second,
		})
		// The child has exited: its ends of the pipes go, so that a read
		// of its stdout ends.
		inR.Close()
		outW.Close()
		close(c.dead)
	}()
	return c, nil
}

// close ends the child and releases our ends of its pipes.
func (c *child) close() {
	c.kill()
	c.in.Close()
	<-c.dead
	c.out.Close()
}

func getChild() (*child, error) {
	idleMu.Lock()
	for len(idle) > 0 {
		c := idle[len(idle)-1]
		idle = idle[:len(idle)-1]
		select {
		case <-c.dead:
			go c.close()
			continue
		default:
		}
		idleMu.Unlock()
		return c, nil
	}
	idleMu.Unlock()
	return startChild()
}

func putChild(c *child) {
	idleMu.Lock()
	if c.busy < retireAfter && len(idle) < maxIdle {
		idle = append(idle, c)
		c = nil
	}
	idleMu.Unlock()
	if c != nil {
		c.close()
	}
}

// errDied is a child that ended before it answered.
var errDied = errors.New("transpile: the compiler died")

// errNoStart is a child that ended before its hello.
var errNoStart = errors.New("transpile: the compiler exited at start")

// startError is errNoStart with the first line of the dead child's stderr,
// bounded and made printable: the child's own word on what it refused.
func (c *child) startError() error {
	line, _, _ := strings.Cut(c.stderr.String(), "\n")
	line = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, strings.ToValidUTF8(line, "?"))
	if len(line) > maxStartLine {
		line = strings.ToValidUTF8(line[:maxStartLine], "") + "..."
	}
	if line == "" {
		line = "(nothing on its stderr)"
	}
	return fmt.Errorf("%w: %s", errNoStart, line)
}

// maxStartLine bounds the child's line passed on in a start error.
const maxStartLine = 300

// exchange sends body to a child and reads its reply, bounded by bound
// bytes. The child is killed when ctx ends.
func exchange(ctx context.Context, body []byte, bound int) ([]byte, error) {
	c, err := getChild()
	if err != nil {
		return nil, fmt.Errorf("transpile: starting the compiler: %w", err)
	}
	start := time.Now()
	type answer struct {
		b   []byte
		err error
	}
	got := make(chan answer, 1)
	go func() {
		if !c.hello {
			if _, err := readFrame(c.out, 0); err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					err = errNoStart
				}
				got <- answer{nil, err}
				return
			}
			c.hello = true
		}
		b, err := readFrame(c.out, bound)
		got <- answer{b, err}
	}()
	wrote := make(chan error, 1)
	go func() {
		frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
		_, err := c.in.Write(append(frame, body...))
		wrote <- err
	}()
	select {
	case a := <-got:
		c.busy += time.Since(start)
		if a.err != nil {
			c.close()
			if errors.Is(a.err, errNoStart) {
				return nil, c.startError()
			}
			if errors.Is(a.err, io.EOF) || errors.Is(a.err, io.ErrUnexpectedEOF) || errors.Is(a.err, os.ErrClosed) {
				return nil, errDied
			}
			return nil, a.err
		}
		if err := <-wrote; err != nil {
			c.close()
			return nil, errDied
		}
		putChild(c)
		return a.b, nil
	case <-ctx.Done():
		c.close()
		<-got // the writer ends too: its pipe is closed
		return nil, ctx.Err()
	}
}

// readFrame reads one length-prefixed frame of at most bound bytes.
func readFrame(r io.Reader, bound int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if int64(size) > int64(bound) {
		return nil, fmt.Errorf("transpile: the compiler's reply of %d bytes is over its bound of %d", size, bound)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
