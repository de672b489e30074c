package runcode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"
)

// Capture is an io.Writer that keeps a bounded view of a stream: everything
// while the stream fits in limit bytes, then its head and tail. The whole
// stream (up to spillLimit bytes) goes to a spill file, opened only when the
// stream outgrows limit, so that nothing is lost. Memory use is O(limit)
// whatever the stream's size. Safe for concurrent use.
type Capture struct {
	mu         sync.Mutex
	limit      int
	buf        []byte // the whole stream while total <= limit, else its head
	tail       []byte // ring of the last limit/2 bytes, once past limit
	tailPos    int
	total      int64
	spillPath  string
	root       string // when set, the spill file is opened through os.Root here
	spillLimit int64
	spill      *os.File
	spilled    int64
	spillErr   error
	observe    OutputFunc // told of every write (streaming), or nil
	stream     string
}

// NewCapture returns a Capture that keeps limit bytes in memory and spills the
// full stream to spillPath (created on demand) up to spillLimit bytes.
func NewCapture(limit int, spillPath string, spillLimit int64) *Capture {
	if limit < 64 {
		limit = 64
	}
	return &Capture{limit: limit, spillPath: spillPath, spillLimit: spillLimit}
}

// Within confines the spill file to the directory root: it is created
// through os.Root, so a symlink planted by the session's code (say
// .quro -> /etc) cannot make the server write outside root.
func (c *Capture) Within(root string) *Capture {
	c.root = root
	return c
}

// Write never fails: a spill problem is reported in the final view.
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	n := c.write(p)
	fn, stream := c.observe, c.stream
	c.mu.Unlock()
	// Outside the lock: the observer may take its own locks.
	if fn != nil && n > 0 {
		fn(stream, p)
	}
	return n, nil
}

func (c *Capture) write(p []byte) int {
	n := len(p)
	c.total += int64(n)
	if c.tail == nil && len(c.buf)+len(p) <= c.limit {
		c.buf = append(c.buf, p...)
		return n
	}
	head := c.limit - c.limit/2
	if c.tail == nil {
		// First overflow: start the spill with everything seen so far and
		// split memory into head and tail.
		c.writeSpill(c.buf)
		c.tail = make([]byte, c.limit/2)
		if len(c.buf) > head {
			rest := c.buf[head:]
			c.buf = c.buf[:head:head]
			c.pushTail(rest)
		}
	}
	c.writeSpill(p)
	if k := min(head-len(c.buf), len(p)); k > 0 {
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
	}
	c.pushTail(p)
	return n
}

// pushTail appends p to the tail ring; tailPos counts bytes ever pushed.
func (c *Capture) pushTail(p []byte) {
	size := len(c.tail)
	if len(p) > size {
		c.tailPos += len(p) - size
		p = p[len(p)-size:]
	}
	for len(p) > 0 {
		i := c.tailPos % size
		k := copy(c.tail[i:], p)
		p = p[k:]
		c.tailPos += k
	}
}

func (c *Capture) tailBytes() []byte {
	size := len(c.tail)
	if c.tailPos < size {
		return append([]byte(nil), c.tail[:c.tailPos]...)
	}
	i := c.tailPos % size
	return append(append([]byte(nil), c.tail[i:]...), c.tail[:i]...)
}

func (c *Capture) writeSpill(p []byte) {
	if c.spillErr != nil || c.spillPath == "" || len(p) == 0 {
		return
	}
	if c.spill == nil {
		f, err := c.openSpill()
		if err != nil {
			c.spillErr = err
			return
		}
		c.spill = f
	}
	room := c.spillLimit - c.spilled
	if room <= 0 {
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	k, err := c.spill.Write(p)
	c.spilled += int64(k)
	if err != nil {
		c.spillErr = err
	}
}

func (c *Capture) openSpill() (*os.File, error) {
	const flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if c.root == "" {
		if err := os.MkdirAll(filepath.Dir(c.spillPath), 0o755); err != nil {
			return nil, err
		}
		return os.OpenFile(c.spillPath, flags, 0o644)
	}
	rel, err := filepath.Rel(c.root, c.spillPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("spill file %s is not inside %s", c.spillPath, c.root)
	}
	r, err := os.OpenRoot(c.root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := r.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return nil, err
	}
	return r.OpenFile(rel, flags|syscall.O_NOFOLLOW, 0o644)
}

// Len is the number of bytes written so far.
func (c *Capture) Len() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// Snapshot returns the text captured so far, as Finish would show it,
// without ending the capture.
func (c *Capture) Snapshot() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tail == nil {
		t, _ := escapeBytes(c.buf)
		return t
	}
	head, tail := trimPartialEnd(c.buf), trimPartialStart(c.tailBytes())
	ht, _ := escapeBytes(head)
	tt, _ := escapeBytes(tail)
	return ht + fmt.Sprintf("\n… [%s cut from the middle so far] …\n", HumanBytes(c.total-int64(len(head))-int64(len(tail)))) + tt
}

// View is the final, model-safe view of a captured stream.
type View struct {
	Text      string // valid UTF-8; invalid bytes and NUL as \xNN; middle cut when too long
	Bytes     int64  // size of the whole stream
	Cut       bool   // the middle was cut out of Text
	Escaped   bool   // Text escapes bytes that are not valid UTF-8 (or NUL)
	File      string // where the full raw stream is kept, if anywhere
	FileBytes int64  // how much of the stream the file holds
	FileError string // why the full stream could not be kept
}

// Finish closes the spill file and returns the view. If the stream was not
// cut but needed escaping, the raw bytes are written to the spill file so
// that they are not lost.
func (c *Capture) Finish() View {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := View{Bytes: c.total}
	if c.tail == nil {
		text, escaped := escapeBytes(c.buf)
		v.Text, v.Escaped = text, escaped
		if escaped {
			c.writeSpill(c.buf)
		}
	} else {
		head, tail := c.buf, c.tailBytes()
		head, tail = trimPartialEnd(head), trimPartialStart(tail)
		cut := c.total - int64(len(head)) - int64(len(tail))
		ht, e1 := escapeBytes(head)
		tt, e2 := escapeBytes(tail)
		v.Cut, v.Escaped = true, e1 || e2
		v.Text = ht + fmt.Sprintf("\n… [%s cut from the middle; %s in all] …\n", HumanBytes(cut), HumanBytes(c.total)) + tt
	}
	if c.spill != nil {
		c.spill.Close()
		c.spill = nil
		v.File = c.spillPath
		v.FileBytes = c.spilled
	}
	if c.spillErr != nil {
		v.FileError = c.spillErr.Error()
	}
	return v
}

// escapeBytes returns b as valid UTF-8 text: invalid bytes and NUL become
// \xNN. The boolean says whether anything was escaped.
func escapeBytes(b []byte) (string, bool) {
	if utf8.Valid(b) && !strings.ContainsRune(string(b), 0) {
		return string(b), false
	}
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if (r == utf8.RuneError && size == 1) || r == 0 {
			fmt.Fprintf(&sb, `\x%02x`, b[0])
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String(), true
}

// trimPartialEnd drops a UTF-8 sequence cut short at the end of b.
func trimPartialEnd(b []byte) []byte {
	for back := 1; back <= utf8.UTFMax && back <= len(b); back++ {
		i := len(b) - back
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// trimPartialStart drops continuation bytes (at most 3) at the start of b.
func trimPartialStart(b []byte) []byte {
	for k := 0; k < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); k++ {
		b = b[1:]
	}
	return b
}

// HumanBytes renders a size for people: "12 bytes", "3.4 KiB", "1.2 GiB".
func HumanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
