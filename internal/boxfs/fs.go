// Package boxfs is the file API's access to a session's box beyond its
// workspace: /tmp, paths the session made elsewhere, the box's read-only
// system directories. Each operation runs inside the session's box as a
// program of the session (the quro binary re-executed with boxhelper.Arg,
// spawned through the box init like any run: the session's uid, mount
// namespace, Landlock rules and seccomp filter), so it reaches exactly what
// the session's own code reaches and never anything of the server's. The
// server (FS) reads the helper's boxhelper.Reply as hostile bytes: bounded, decoded
// strictly, every name and number checked, and its errors rebuilt from an
// errno alone.
package boxfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quro-dev/quro/internal/boxfs/boxhelper"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/workspace"
)

// Runner serves the helper's operation args (boxhelper.Arg first) in the
// session's box as a program of the session (Helper.Run), stdin its
// input, its answer written to stdout; it returns the helper's code (0,
// or 2: the request was refused). An answer over max bytes is an error,
// or is written in part (the FS finds it short or over).
type Runner func(ctx context.Context, args []string, stdin []byte, max int64, stdout io.Writer) (int, error)

// FS is one call's access to the files of a session's box. MaxRead,
// MaxWrite and Names of the options are used as workspace.FS uses them.
type FS struct {
	ctx  context.Context
	run  Runner
	opts workspace.Options
}

// New returns the box's files for the call ctx.
func New(ctx context.Context, run Runner, opts workspace.Options) *FS {
	if opts.MaxRead <= 0 {
		opts.MaxRead = workspace.DefaultMaxRead
	}
	if opts.MaxWrite <= 0 {
		opts.MaxWrite = workspace.DefaultMaxWrite
	}
	return &FS{ctx: ctx, run: run, opts: opts}
}

// Options are the options in force.
func (b *FS) Options() workspace.Options { return b.opts }

// IsBoxPath reports whether p names a path of the box outside the
// workspace: absolute, and neither /home/user nor under it once clean.
func IsBoxPath(p string) bool {
	if !path.IsAbs(p) {
		return false
	}
	c := path.Clean(p)
	return c != hostpath.Home && !strings.HasPrefix(c, hostpath.Home+"/")
}

// Path checks the box path p and returns it clean.
func Path(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, workspace.ErrInvalid)
	}
	if err := workspace.CheckLength(p); err != nil {
		return "", err
	}
	if !path.IsAbs(p) {
		return "", fmt.Errorf("%q is not an absolute path of the box: %w", p, workspace.ErrInvalid)
	}
	return path.Clean(p), nil
}

// Error is a failure of an operation in the box: its message names the
// box path, and it wraps the workspace error of its kind (so callers and
// the controller classify it as a workspace's).
type Error struct {
	msg  string
	kind error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.kind }

// errnoError is the error for errno from the helper: built here from the
// number alone, never from text the box wrote.
func errnoError(p string, errno int) error {
	kind := workspace.ErrInvalid
	var what string
	switch syscall.Errno(errno) {
	case syscall.ENOENT:
		kind, what = workspace.ErrNotFound, "no such file or directory in the session's box"
	case syscall.EACCES, syscall.EPERM:
		kind, what = workspace.ErrPermission, "permission denied: the session's user may not do that there (its code would be refused too)"
	case syscall.EROFS:
		kind, what = workspace.ErrPermission, "permission denied: a read-only directory of the session's box (write under /home/user or /tmp)"
	case syscall.EISDIR:
		kind, what = workspace.ErrIsDir, "is a directory"
	case syscall.ENOTDIR:
		kind, what = workspace.ErrNotDir, "a part of the path is not a directory"
	case syscall.EEXIST, syscall.ENOTEMPTY:
		kind, what = workspace.ErrExists, "a directory that is not empty is in the way"
	case syscall.ENOSPC, syscall.EDQUOT:
		kind, what = workspace.ErrNoSpace, "no space left on that disk of the session's box"
	case syscall.ELOOP:
		what = "too many levels of symbolic links"
	case syscall.ENAMETOOLONG:
		what = "path is too long"
	case syscall.ENXIO:
		what = "not a regular file (a named pipe, socket or device)"
	case syscall.EXDEV:
		what = "source and destination are on different disks of the box; copy it with a command instead"
	case syscall.EINVAL:
		what = "invalid argument (moving a directory into itself?)"
	case syscall.EFBIG:
		kind, what = workspace.ErrTooLarge, "file too large"
	default:
		what = "failed in the session's box (errno " + strconv.Itoa(errno) + ")"
	}
	return &Error{msg: fmt.Sprintf("%s: %s", p, what), kind: kind}
}

// ErrHelper is the kind of every error of the helper not answering as it
// must: the call may be tried again.
var ErrHelper = errors.New("the session box's file helper failed")

// errHelper is the helper not answering as it must (it died, was killed,
// or wrote something else).
func errHelper(p, why string) error {
	return &Error{msg: fmt.Sprintf("%s: the session box's file helper %s; try again (if the box is being paused, resumed or destroyed, after that)", p, why), kind: ErrHelper}
}

// bounds of a reply
const (
	maxReplyLine = 16 << 20 // a listing of 10,000 entries fits several times
	maxEntries   = 10000
)

// call runs op on p with more args and stdin, and decodes the reply. data
// is what follows the boxhelper.Reply line (a read's bytes).
func (b *FS) call(p string, args []string, stdin []byte, maxData int64) (*boxhelper.Reply, []byte, error) {
	out := &capped{max: maxReplyLine + maxData}
	code, err := b.run(b.ctx, append([]string{boxhelper.Arg}, args...), stdin, out.max, out)
	switch {
	case errors.Is(err, errOver):
		return nil, nil, errHelper(p, "answered more than a boxhelper.Reply may hold")
	case errors.Is(err, ErrDied):
		return nil, nil, errHelper(p, "ended during the operation (killed by the session's code, or the box paused or ended)")
	case errors.Is(err, ErrClosed):
		return nil, nil, errHelper(p, "is gone: the session ended")
	case err != nil:
		return nil, nil, err
	}
	if out.over {
		return nil, nil, errHelper(p, "answered more than a boxhelper.Reply may hold")
	}
	if code != 0 {
		return nil, nil, errHelper(p, "failed (exit "+strconv.Itoa(code)+")")
	}
	line, rest, ok := bytes.Cut(out.buf.Bytes(), []byte{'\n'})
	if !ok || len(line) > maxReplyLine {
		return nil, nil, errHelper(p, "answered no reply")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var r boxhelper.Reply
	if err := dec.Decode(&r); err != nil || dec.More() {
		return nil, nil, errHelper(p, "answered a malformed reply")
	}
	if r.N < 0 || r.N != int64(len(rest)) || r.N > maxData || r.Errno < 0 || r.Errno > 4095 || len(r.Entries) > maxEntries || len(r.Skipped) > maxEntries {
		return nil, nil, errHelper(p, "answered a malformed reply")
	}
	for _, s := range append(r.Entries, r.Skipped...) {
		if !validRel(s.Rel) || s.Size < 0 || len(s.Target) > workspace.MaxPath || strings.IndexByte(s.Target, 0) >= 0 || !validTargetType(s.TargetType) {
			return nil, nil, errHelper(p, "answered a malformed entry")
		}
	}
	if r.Entry != nil && (r.Entry.Rel != "" || r.Entry.Size < 0 || len(r.Entry.Target) > workspace.MaxPath || strings.IndexByte(r.Entry.Target, 0) >= 0 || !validTargetType(r.Entry.TargetType)) {
		return nil, nil, errHelper(p, "answered a malformed entry")
	}
	return &r, rest, nil
}

// validTargetType: one of the link target types, or none.
func validTargetType(t string) bool {
	return t == "" || t == "file" || t == "dir" || t == "other"
}

// validRel: a clean relative path of names, each at most NAME_MAX bytes.
func validRel(rel string) bool {
	if rel == "" || len(rel) > workspace.MaxPath || path.IsAbs(rel) || path.Clean(rel) != rel || strings.IndexByte(rel, 0) >= 0 {
		return false
	}
	for name := range strings.SplitSeq(rel, "/") {
		if name == ".." || name == "." || len(name) > workspace.MaxName {
			return false
		}
	}
	return true
}

// capped keeps at most max bytes and notes more.
type capped struct {
	buf  bytes.Buffer
	max  int64
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if int64(c.buf.Len()+len(p)) > c.max {
		c.over = true
		return len(p), nil
	}
	return c.buf.Write(p)
}

// entry turns the helper's s of the box path p into a workspace.Entry.
func (b *FS) entry(p string, s *boxhelper.Stat) *workspace.Entry {
	e := &workspace.Entry{Name: path.Base(p), Path: p, Size: s.Size, ModTime: time.Unix(0, s.MTime)}
	m := s.Mode
	letter := "-"
	switch {
	case m.IsRegular():
		e.Type = "file"
	case m&fs.ModeDir != 0:
		e.Type, letter = "dir", "d"
	case m&fs.ModeSymlink != 0:
		e.Type, letter, e.Target, e.TargetType, e.Size = "symlink", "l", s.Target, s.TargetType, 0
	default:
		e.Type, e.Size = "other", 0
		switch {
		case m&fs.ModeNamedPipe != 0:
			letter = "p"
		case m&fs.ModeSocket != 0:
			letter = "s"
		case m&fs.ModeCharDevice != 0:
			letter = "c"
		case m&fs.ModeDevice != 0:
			letter = "b"
		}
	}
	e.Mode = fmt.Sprintf("%04o", m.Perm())
	perm := m.Perm().String()
	e.Permissions = letter + perm[len(perm)-9:]
	if b.opts.Names != nil {
		e.Owner, e.Group = b.opts.Names(s.UID, s.GID)
	} else {
		e.Owner, e.Group = strconv.FormatUint(uint64(s.UID), 10), strconv.FormatUint(uint64(s.GID), 10)
	}
	return e
}

// Read reads the regular file p as workspace.FS.Read does: the whole file
// when limit is 0 (at most MaxRead), else at most limit bytes from offset.
func (b *FS) Read(p string, offset, limit int64) (*workspace.Content, error) {
	p, err := Path(p)
	if err != nil {
		return nil, err
	}
	if offset < 0 || limit < 0 {
		return nil, fmt.Errorf("offset and limit must not be negative: %w", workspace.ErrInvalid)
	}
	if limit > b.opts.MaxRead {
		return nil, fmt.Errorf("limit %d is over the %s one read returns: %w", limit, workspace.Human(b.opts.MaxRead), workspace.ErrTooLarge)
	}
	ask := limit
	if ask == 0 {
		ask = b.opts.MaxRead + 1 // one more: is there more?
	}
	r, data, err := b.call(p, []string{"read", p, strconv.FormatInt(offset, 10), strconv.FormatInt(ask, 10)}, nil, ask)
	if err != nil {
		return nil, err
	}
	if r.Errno == int(syscall.ENXIO) && r.Entry != nil {
		return nil, &Error{msg: fmt.Sprintf("%s is not a regular file (%s): %s", p, b.entry(p, r.Entry).Type, "read_file reads regular files"), kind: workspace.ErrInvalid}
	}
	if r.Errno != 0 {
		return nil, errnoError(p, r.Errno)
	}
	if r.Entry == nil {
		return nil, errHelper(p, "answered a malformed reply")
	}
	if limit == 0 && int64(len(data)) > b.opts.MaxRead {
		return nil, &Error{msg: fmt.Sprintf("%s is more than the %s one read returns", p, workspace.Human(b.opts.MaxRead)), kind: workspace.ErrTooLarge}
	}
	size := max(r.Entry.Size, offset+int64(len(data))) // /proc files say 0
	if limit == 0 {
		size = offset + int64(len(data))
	}
	return &workspace.Content{
		Path: p, Data: data, Size: size, Offset: offset, Mode: r.Entry.Mode.Perm(), ModTime: time.Unix(0, r.Entry.MTime),
		Text: workspace.IsText(data), Complete: offset == 0 && int64(len(data)) >= size,
	}, nil
}

// Write replaces p with data, or appends data to it, as a program of the
// session would, creating missing parents: a replacement goes through a
// temporary file renamed over p where the directory lets the session
// create one.
func (b *FS) Write(p string, data []byte, appendTo bool) (*workspace.Written, error) {
	p, err := Path(p)
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, fmt.Errorf("/ is a directory; name a file in it: %w", workspace.ErrIsDir)
	}
	if int64(len(data)) > b.opts.MaxWrite {
		return nil, fmt.Errorf("%s of content is over the %s one write takes: %w", workspace.Human(int64(len(data))), workspace.Human(b.opts.MaxWrite), workspace.ErrTooLarge)
	}
	how := "replace"
	if appendTo {
		how = "append"
	}
	r, _, err := b.call(p, []string{"write", p, how, strconv.Itoa(len(data))}, data, 0)
	if err != nil {
		return nil, err
	}
	if r.Errno == int(syscall.ENXIO) && r.Entry != nil {
		return nil, &Error{msg: fmt.Sprintf("%s is not a regular file (%s)", p, b.entry(p, r.Entry).Type), kind: workspace.ErrInvalid}
	}
	if r.Errno != 0 {
		return nil, errnoError(p, r.Errno)
	}
	if r.Entry == nil {
		return nil, errHelper(p, "answered a malformed reply")
	}
	return &workspace.Written{Path: p, Size: r.Entry.Size, Wrote: int64(len(data)), Created: r.Created, Mode: r.Entry.Mode.Perm()}, nil
}

// Info describes p itself (a link is described, not followed).
func (b *FS) Info(p string) (*workspace.Entry, error) {
	p, err := Path(p)
	if err != nil {
		return nil, err
	}
	r, _, err := b.call(p, []string{"stat", p}, nil, 0)
	if err != nil {
		return nil, err
	}
	if r.Errno != 0 {
		return nil, errnoError(p, r.Errno)
	}
	if r.Entry == nil {
		return nil, errHelper(p, "answered a malformed reply")
	}
	return b.entry(p, r.Entry), nil
}

// List lists the directory p down to o.Depth levels; links are described,
// never followed. Entries' paths are absolute paths of the box.
func (b *FS) List(p string, o workspace.ListOptions) (*workspace.Listing, error) {
	p, err := Path(p)
	if err != nil {
		return nil, err
	}
	if o.Depth <= 0 {
		o.Depth = 1
	}
	if o.Depth > workspace.MaxDepth {
		return nil, fmt.Errorf("depth %d is over the deepest listing, %d: %w", o.Depth, workspace.MaxDepth, workspace.ErrInvalid)
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = workspace.DefaultMaxEntries
	}
	o.MaxEntries = min(o.MaxEntries, maxEntries)
	r, _, err := b.call(p, []string{"list", p, strconv.Itoa(o.Depth), strconv.Itoa(o.MaxEntries)}, nil, 0)
	if err != nil {
		return nil, err
	}
	if r.Errno == int(syscall.ENOTDIR) && r.Entry != nil {
		return nil, &Error{msg: fmt.Sprintf("%s is a %s, not a directory", p, b.entry(p, r.Entry).Type), kind: workspace.ErrNotDir}
	}
	if r.Errno != 0 {
		return nil, errnoError(p, r.Errno)
	}
	if len(r.Entries) > o.MaxEntries {
		return nil, errHelper(p, "answered more entries than asked")
	}
	l := &workspace.Listing{Path: p, Entries: make([]workspace.Entry, 0, len(r.Entries)), Truncated: r.Truncated}
	for i := range r.Entries {
		l.Entries = append(l.Entries, *b.entry(path.Join(p, r.Entries[i].Rel), &r.Entries[i]))
	}
	for _, s := range r.Skipped {
		l.Skipped = append(l.Skipped, errnoError(path.Join(p, s.Rel), int(min(s.Size, 4095))).Error())
	}
	return l, nil
}

// MakeDir creates the directory p and its missing parents (mkdir -p);
// existed says it was there already.
func (b *FS) MakeDir(p string) (*workspace.Entry, bool, error) {
	p, err := Path(p)
	if err != nil {
		return nil, false, err
	}
	r, _, err := b.call(p, []string{"mkdir", p}, nil, 0)
	if err != nil {
		return nil, false, err
	}
	if r.Errno != 0 {
		return nil, false, errnoError(p, r.Errno)
	}
	if r.Entry == nil {
		return nil, false, errHelper(p, "answered a malformed reply")
	}
	return b.entry(p, r.Entry), r.Existed, nil
}

// Move renames src to dst (rename(2)), creating dst's missing parents.
func (b *FS) Move(src, dst string) (*workspace.Entry, error) {
	src, err := Path(src)
	if err != nil {
		return nil, err
	}
	if dst, err = Path(dst); err != nil {
		return nil, err
	}
	r, _, err := b.call(src, []string{"move", src, dst}, nil, 0)
	if err != nil {
		return nil, err
	}
	if r.Errno != 0 {
		p := src
		if r.Where == "dst" {
			p = dst
		}
		return nil, errnoError(p, r.Errno)
	}
	if r.Entry == nil {
		return nil, errHelper(src, "answered a malformed reply")
	}
	return b.entry(dst, r.Entry), nil
}

// Remove removes p: a file, a link (never its target), or a directory
// with everything in it.
func (b *FS) Remove(p string) (string, error) {
	p, err := Path(p)
	if err != nil {
		return "", err
	}
	if p == "/" {
		return "", fmt.Errorf("cannot remove the box's root: %w", workspace.ErrInvalid)
	}
	r, _, err := b.call(p, []string{"remove", p}, nil, 0)
	if err != nil {
		return "", err
	}
	if r.Errno != 0 {
		return "", errnoError(p, r.Errno)
	}
	return p, nil
}

// ErrNoBox is the answer for a box path where the server runs without
// session boxes: there is no box its files could be reached in.
var ErrNoBox = errors.New("paths outside /home/user are reached in the session's box, and this server runs without session boxes (bubblewrap)")
