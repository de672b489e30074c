// Package boxhelper is the in-box side of internal/boxfs: the quro
// binary re-executed in a session's box with Arg serves one file
// operation as a program of the session and answers one JSON line (Reply)
// on stdout, then a read's bytes. It imports only a few standard packages
// so that it starts before the binary's heavy package initialisers.
//
//	quro __quro_boxfs OP PATH ARGS…   one operation, then exit
//	quro __quro_boxfs serve           operations framed on stdin/stdout (Serve)
package boxhelper

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strconv"
	"syscall"
)

// Arg is the argument that makes quro the box's file helper.
const Arg = "__quro_boxfs"

// Stat is one file as the helper describes it.
type Stat struct {
	Rel    string      `json:"rel,omitempty"` // in a listing: the path below the listed directory
	Mode   fs.FileMode `json:"mode"`
	Size   int64       `json:"size"`
	MTime  int64       `json:"mtime"` // unix nanoseconds
	UID    uint32      `json:"uid"`
	GID    uint32      `json:"gid"`
	Target string      `json:"target,omitempty"`
	// TargetType is what a link finally leads to, as the session sees
	// it: "file", "dir", "other", or "" when it dangles.
	TargetType string `json:"target_type,omitempty"`
}

// Reply is the helper's one JSON line.
type Reply struct {
	Errno   int    `json:"errno,omitempty"`
	Where   string `json:"where,omitempty"` // the path of the request the errno is about: "", "src" or "dst"
	Entry   *Stat  `json:"entry,omitempty"`
	Entries []Stat `json:"entries,omitempty"`
	// Skipped are directories of a listing not read (their Rel, and the
	// errno in Size).
	Skipped   []Stat `json:"skipped,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Existed   bool   `json:"existed,omitempty"`
	Created   bool   `json:"created,omitempty"`
	N         int64  `json:"n,omitempty"` // read: bytes following the reply
}

func init() {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		if len(os.Args) == 3 && os.Args[2] == ServeOp {
			os.Exit(Serve(os.Stdin, os.Stdout))
		}
		os.Exit(helperMain(os.Args[2:]))
	}
}

// ServeOp is the argument after Arg that makes the helper serve requests
// until its standard input ends.
const ServeOp = "serve"

// The framing of Serve. A request is
//
//	uint32 n, n bytes: a JSON array of strings (the arguments: OP PATH …)
//	uint64 m, m bytes: the operation's input (a write's content)
//
// and its answer
//
//	uint8 status (StatusOK, or StatusBad: a malformed request)
//	uint64 k, k bytes: what the one-operation helper writes on stdout
//	(the Reply line, then a read's bytes)
//
// all integers big-endian. One request at a time: the next is read once
// the answer is written.
const (
	StatusOK  = 0
	StatusBad = 2
	// MaxArgs bounds a request's arguments; MaxInput its input.
	MaxArgs  = 64 << 10
	MaxInput = 1 << 30
)

// Serve answers framed requests from in on out until in ends; it returns
// the exit code (0 at the end of in, 1 when out or in broke, 2 on a
// request that breaks the framing).
func Serve(in io.Reader, out io.Writer) int {
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriterSize(out, 64<<10)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(r, hdr[:4]); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			return 1
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n > MaxArgs {
			return 2
		}
		raw := make([]byte, n)
		if _, err := io.ReadFull(r, raw); err != nil {
			return 1
		}
		if _, err := io.ReadFull(r, hdr[:8]); err != nil {
			return 1
		}
		m := binary.BigEndian.Uint64(hdr[:8])
		if m > MaxInput {
			return 2
		}
		input := io.LimitReader(r, int64(m))
		var args []string
		status := byte(StatusOK)
		var reply []byte
		var data []byte
		if err := json.Unmarshal(raw, &args); err != nil {
			status = StatusBad
		} else if rep, d, ok := serve(args, input); !ok {
			status = StatusBad
		} else {
			reply, _ = json.Marshal(rep)
			reply = append(reply, '\n')
			data = d
		}
		if _, err := io.Copy(io.Discard, input); err != nil { // what the operation left of its input
			return 1
		}
		hdr[0] = status
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(reply)+len(data)))
		if _, err := w.Write(hdr[:9]); err != nil {
			return 1
		}
		if _, err := w.Write(reply); err != nil {
			return 1
		}
		if _, err := w.Write(data); err != nil {
			return 1
		}
		if err := w.Flush(); err != nil {
			return 1
		}
	}
}

// helperMain serves one operation. It returns 2 when the request is
// malformed (the server never sends one), else 0 with the outcome in the
// reply.
func helperMain(args []string) int {
	out := os.Stdout
	r, data, ok := serve(args, os.Stdin)
	if !ok {
		os.Stderr.WriteString("quro boxfs: bad request\n")
		return 2
	}
	b, _ := json.Marshal(r)
	b = append(b, '\n')
	if _, err := out.Write(b); err != nil {
		return 1
	}
	if len(data) > 0 {
		if _, err := out.Write(data); err != nil {
			return 1
		}
	}
	return 0
}

func errnoOf(err error) int {
	var e syscall.Errno
	if errors.As(err, &e) {
		return int(e)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return int(syscall.ENOENT)
	}
	return int(syscall.EIO)
}

func fail(err error) *Reply { return &Reply{Errno: errnoOf(err)} }

func describe(p string, fi fs.FileInfo) *Stat {
	s := &Stat{Mode: fi.Mode(), Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.UID, s.GID = st.Uid, st.Gid
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		s.Target, _ = os.Readlink(p)
		if t, err := os.Stat(p); err == nil {
			switch {
			case t.Mode().IsRegular():
				s.TargetType = "file"
			case t.IsDir():
				s.TargetType = "dir"
			default:
				s.TargetType = "other"
			}
		}
	}
	return s
}

func serve(args []string, stdin io.Reader) (*Reply, []byte, bool) {
	if len(args) < 2 {
		return nil, nil, false
	}
	op, p := args[0], args[1]
	num := func(i int) (int64, bool) {
		if i >= len(args) {
			return 0, false
		}
		n, err := strconv.ParseInt(args[i], 10, 64)
		return n, err == nil && n >= 0
	}
	switch op {
	case "stat":
		fi, err := os.Lstat(p)
		if err != nil {
			return fail(err), nil, true
		}
		return &Reply{Entry: describe(p, fi)}, nil, true
	case "read":
		off, ok1 := num(2)
		limit, ok2 := num(3)
		if !ok1 || !ok2 || limit <= 0 {
			return nil, nil, false
		}
		return read(p, off, limit)
	case "write":
		appendTo := len(args) > 2 && args[2] == "append"
		max, ok := num(3)
		if !ok {
			return nil, nil, false
		}
		data, err := io.ReadAll(io.LimitReader(stdin, max+1))
		if err != nil || int64(len(data)) > max {
			return nil, nil, false
		}
		return write(p, data, appendTo), nil, true
	case "list":
		depth, ok1 := num(2)
		max, ok2 := num(3)
		if !ok1 || !ok2 || depth < 1 || max < 1 {
			return nil, nil, false
		}
		return list(p, int(depth), int(max)), nil, true
	case "mkdir":
		r := &Reply{}
		if fi, err := os.Stat(p); err == nil {
			if !fi.IsDir() {
				return &Reply{Errno: int(syscall.ENOTDIR)}, nil, true
			}
			r.Existed = true
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fail(err), nil, true
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return fail(err), nil, true
		}
		r.Entry = describe(p, fi)
		return r, nil, true
	case "remove":
		if _, err := os.Lstat(p); err != nil {
			return fail(err), nil, true
		}
		if err := os.RemoveAll(p); err != nil {
			return fail(err), nil, true
		}
		return &Reply{}, nil, true
	case "move":
		if len(args) < 3 {
			return nil, nil, false
		}
		dst := args[2]
		if _, err := os.Lstat(p); err != nil {
			return &Reply{Errno: errnoOf(err), Where: "src"}, nil, true
		}
		if err := os.MkdirAll(path.Dir(dst), 0o755); err != nil {
			return &Reply{Errno: errnoOf(err), Where: "dst"}, nil, true
		}
		if err := os.Rename(p, dst); errors.Is(err, syscall.EXDEV) {
			// Another mount of the box (/tmp and /home/user are two):
			// copied, then removed, as mv does.
			if err := copyTree(p, dst); err != nil {
				_ = os.RemoveAll(dst) // the half copy; the error to report is err
				return fail(err), nil, true
			}
			if err := os.RemoveAll(p); err != nil {
				return fail(err), nil, true
			}
		} else if err != nil {
			return fail(err), nil, true
		}
		fi, err := os.Lstat(dst)
		if err != nil {
			return fail(err), nil, true
		}
		return &Reply{Entry: describe(dst, fi)}, nil, true
	}
	return nil, nil, false
}

// copyTree copies src (a file, a link, a directory with what is in it)
// to dst, which it replaces when it is a file; modes are kept.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		_ = os.Remove(dst) // what was there is replaced, as rename would
		return os.Symlink(t, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		names, err := readNames(src)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := copyTree(path.Join(src, n), path.Join(dst, n)); err != nil {
				return err
			}
		}
		return os.Chmod(dst, fi.Mode().Perm())
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return syscall.EXDEV // a device, pipe or socket is not copied
}

// read reads at most limit bytes of the regular file p from off.
func read(p string, off, limit int64) (*Reply, []byte, bool) {
	// O_NONBLOCK: a FIFO opens at once and reads as empty.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fail(err), nil, true
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail(err), nil, true
	}
	if fi.IsDir() {
		return &Reply{Errno: int(syscall.EISDIR)}, nil, true
	}
	if !fi.Mode().IsRegular() {
		return &Reply{Errno: int(syscall.ENXIO), Entry: describe(p, fi)}, nil, true
	}
	// /proc and /sys files say size 0 and have content: read to the end
	// (or the limit), whatever the size says.
	data, err := io.ReadAll(io.NewSectionReader(f, off, limit))
	if err != nil {
		return fail(err), nil, true
	}
	return &Reply{Entry: describe(p, fi), N: int64(len(data))}, data, true
}

// write replaces p with data (a temporary file beside it renamed over it,
// so readers see the old or the new content) or appends to it, creating
// missing parents. Where the directory refuses a new file but the file
// itself is writable, the file is written in place.
func write(p string, data []byte, appendTo bool) *Reply {
	if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
		return fail(err)
	}
	mode, created := fs.FileMode(0o644), true
	if fi, err := os.Stat(p); err == nil {
		switch {
		case fi.IsDir():
			return &Reply{Errno: int(syscall.EISDIR)}
		case !fi.Mode().IsRegular():
			return &Reply{Errno: int(syscall.ENXIO), Entry: describe(p, fi)}
		}
		mode, created = fi.Mode().Perm(), false
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fail(err)
	}
	done := func() *Reply {
		fi, err := os.Stat(p)
		if err != nil {
			return fail(err)
		}
		return &Reply{Entry: describe(p, fi), Created: created}
	}
	if appendTo {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o644)
		if err != nil {
			return fail(err)
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err)
		}
		return done()
	}
	// A link at p is written through, as a program of the session writing
	// p would: the temporary file goes beside what it names.
	target := p
	if t, err := evalLink(p); err == nil {
		target = t
	}
	base := path.Base(target)
	// O_EXCL below keeps a planted name from being opened; the random
	// part only keeps two writes apart.
	tmp := path.Join(path.Dir(target), "."+base[:min(len(base), 190)]+".quro-tmp-"+strconv.FormatUint(rand.Uint64(), 16))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if created || !errors.Is(err, fs.ErrPermission) {
			return fail(err)
		}
		// The directory is not the session's; the file may be.
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_TRUNC|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fail(err)
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fail(err)
		}
		return done()
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, target)
	}
	if err != nil {
		_ = os.Remove(tmp) // clean-up; the error to report is err
		return fail(err)
	}
	return done()
}

// evalLink is the path a chain of symbolic links at p ends at (the last
// component only; the kernel resolves the parents).
func evalLink(p string) (string, error) {
	for range 40 {
		t, err := os.Readlink(p)
		if err != nil {
			return p, nil //nolint:nilerr // not a link: p itself
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return "", syscall.ELOOP
}

// list walks p down to depth levels, at most max entries, depth first in
// name order; links are described, never followed.
func list(p string, depth, max int) *Reply {
	fi, err := os.Stat(p)
	if err != nil {
		return fail(err)
	}
	if !fi.IsDir() {
		return &Reply{Errno: int(syscall.ENOTDIR), Entry: describe(p, fi)}
	}
	r := &Reply{Entries: []Stat{}}
	var walk func(rel string, level int)
	walk = func(rel string, level int) {
		dir := path.Join(p, rel)
		names, err := readNames(dir)
		if err != nil {
			r.Skipped = append(r.Skipped, Stat{Rel: rel, Size: int64(errnoOf(err))})
			return
		}
		for _, name := range names {
			if len(r.Entries) >= max {
				r.Truncated = true
				return
			}
			child := path.Join(rel, name)
			fi, err := os.Lstat(path.Join(p, child))
			if err != nil {
				continue // gone meanwhile
			}
			s := describe(path.Join(p, child), fi)
			s.Rel = child
			r.Entries = append(r.Entries, *s)
			if fi.IsDir() && level < depth {
				walk(child, level+1)
			}
		}
	}
	walk("", 1)
	return r
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}
