package terminal

import (
	"bytes"
	"io"
	"path/filepath"
	"strconv"
)

// The shell's two record streams, both NUL-separated and both read from
// the box, so hostile input: every field is checked and every chunk is
// bounded.
//
// Status (fd 3, written only by the resident shell, which runs no user
// code): "<nonce>:<exit>:<marker>". The exit code is the real exit status
// of the command's subshell ($? after it), so a command cannot choose it
// except by exiting with it.
//
// State (fd 6, a Unix socket whose reads carry the writer's pid: only the
// resident shell's bytes and the current subshell's count, see
// Shell.readState; the subshell runs user code, so its bytes are as much
// the command's as Quro's dump): "S<state nonce>:<mode>:<cwd>" then "B<blob>", where
// the blob is the shell state (variables, functions, aliases, options,
// traps) that the next command's subshell evaluates; and "E<marker>",
// which the resident shell writes once the subshell has exited. The state
// of a command is the last S/B pair with its state nonce before the E
// whose marker the status record names: the marker is drawn by the
// resident shell after the subshell exited, so nothing the command left
// behind can know it.

const (
	maxStatusChunk = 256
	maxHeaderChunk = 8 << 10
	// maxStateBlob bounds the state carried from command to command.
	maxStateBlob = 8 << 20
	maxCwd       = 4096
)

// splitter splits a stream at NUL bytes as it comes. A chunk longer than
// max is handed on empty with overflow set (its bytes are dropped as they
// come, so memory stays bounded).
type splitter struct {
	max      int
	buf      []byte
	overflow bool
}

// feed takes the next bytes of the stream and calls fn for each complete
// chunk.
func (sp *splitter) feed(b []byte, fn func(chunk []byte, overflow bool)) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		part := b
		if i >= 0 {
			part = b[:i]
		}
		if !sp.overflow {
			if len(sp.buf)+len(part) > sp.max {
				sp.overflow = true
				sp.buf = sp.buf[:0]
			} else {
				sp.buf = append(sp.buf, part...)
			}
		}
		if i < 0 {
			return
		}
		if sp.overflow {
			fn(nil, true)
		} else {
			fn(sp.buf, false)
		}
		sp.buf, sp.overflow = sp.buf[:0], false
		b = b[i+1:]
	}
}

// readChunks reads r to its end through a splitter.
func readChunks(r io.Reader, max int, fn func(chunk []byte, overflow bool)) {
	sp := splitter{max: max}
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		sp.feed(buf[:n], fn)
		if err != nil {
			return
		}
	}
}

// statusRecord is one parsed status record.
type statusRecord struct {
	nonce  string
	code   int
	marker string
}

// parseStatus parses "<nonce>:<exit>:<marker>".
func parseStatus(b []byte) (statusRecord, bool) {
	f := bytes.Split(b, []byte(":"))
	if len(f) != 3 || !isHex(f[0], 32) || !isDigits(f[2], 1, 64) || !isDigits(f[1], 1, 3) {
		return statusRecord{}, false
	}
	code, err := strconv.Atoi(string(f[1]))
	if err != nil || code > 255 {
		return statusRecord{}, false
	}
	return statusRecord{nonce: string(f[0]), code: code, marker: string(f[2])}, true
}

// stateEvent is what the state stream reports: a state (kind 'S') or an
// end marker (kind 'E').
type stateEvent struct {
	kind   byte
	nonce  string
	exited bool // mode x: the command ended the shell (exit, set -e)
	cwd    string
	blob   string
	big    bool // the blob was over maxStateBlob and was dropped
	marker string
}

// stateParser turns chunks of the state stream into events.
type stateParser struct {
	hdr *stateEvent // a header waiting for its blob
}

// feed takes one chunk; it returns an event or nil.
func (p *stateParser) feed(chunk []byte, overflow bool) *stateEvent {
	if h := p.hdr; h != nil {
		p.hdr = nil
		if overflow {
			h.big = true
			return h
		}
		if len(chunk) > 0 && chunk[0] == 'B' {
			h.blob = string(chunk[1:])
			return h
		}
		// Not a blob: the header was cut short; read chunk afresh.
	}
	if overflow || len(chunk) == 0 {
		return nil
	}
	switch chunk[0] {
	case 'S':
		if len(chunk) > maxHeaderChunk {
			return nil
		}
		f := bytes.SplitN(chunk[1:], []byte(":"), 3)
		if len(f) != 3 || !isHex(f[0], 32) || len(f[1]) != 1 || (f[1][0] != 'k' && f[1][0] != 'x') {
			return nil
		}
		cwd := string(f[2])
		if cwd == "" || len(cwd) > maxCwd || !filepath.IsAbs(cwd) {
			return nil
		}
		p.hdr = &stateEvent{kind: 'S', nonce: string(f[0]), exited: f[1][0] == 'x', cwd: cwd}
		return nil
	case 'E':
		if !isDigits(chunk[1:], 1, 64) {
			return nil
		}
		return &stateEvent{kind: 'E', marker: string(chunk[1:])}
	}
	return nil
}

func isHex(b []byte, n int) bool {
	if len(b) != n {
		return false
	}
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isDigits(b []byte, lo, hi int) bool {
	if len(b) < lo || len(b) > hi {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
