// Package workspace is the server's own access to a session workspace: the
// file API (read_file, write_file, list_files) and project templates use FS,
// snapshots and forks CopyTree (copy.go, which walks from directory
// descriptors with O_NOFOLLOW and follows no link at all).
//
// Every operation of FS goes through an os.Root opened at the workspace, so a path
// is resolved one component at a time beneath the workspace directory by the
// kernel (openat with O_NOFOLLOW and checks on each link): a ".." or a
// symbolic link that leads out of the workspace is refused, also when the
// session's code swaps a link in between a check and a use. String checks
// (Rel) only give clearer errors; they are not what keeps paths inside.
package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/quro-dev/quro/internal/hostpath"
)

// Defaults for Options.
const (
	DefaultMaxRead    = 8 << 20 // bytes one Read returns at most
	DefaultMaxWrite   = 8 << 20 // bytes one Write takes at most
	DefaultMaxEntries = 1000    // entries one List returns at most
	MaxDepth          = 16      // deepest List
	Internal          = ".quro" // the server's own directory in a workspace
)

// Errors, to test with errors.Is; the messages around them name the path.
var (
	ErrOutside  = errors.New("path leads outside the session workspace")
	ErrNotFound = fmt.Errorf("no such file or directory in the workspace (%w)", fs.ErrNotExist)
	ErrIsDir    = errors.New("is a directory")
	ErrNotDir   = errors.New("not a directory")
	ErrTooLarge = errors.New("too large")
	ErrExists   = fmt.Errorf("already exists (%w)", fs.ErrExist)
	ErrInvalid  = errors.New("invalid argument")
	// ErrPermission: the file's permissions refuse the server (code in
	// the session changed them).
	ErrPermission = errors.New("permission denied")
	// ErrNoSpace: the session's disk (its quota) is full.
	ErrNoSpace = errors.New("no space left on the session's disk: remove files it no longer needs")
)

// Owner is the uid and gid that files and directories the server creates
// are given, so that the session's code (which runs as that uid) can change
// them.
type Owner struct{ UID, GID int }

// Options configure an FS.
type Options struct {
	MaxRead  int64  // 0 means DefaultMaxRead
	MaxWrite int64  // 0 means DefaultMaxWrite
	Owner    *Owner // nil leaves new files to the server's uid
	Names    Names  // the box's names of owners (Entry.Owner, Group); nil: numbers
}

// FS is one session workspace opened for confined access. Safe for
// concurrent use.
type FS struct {
	dir  string // as given, absolute and clean
	real string // dir with symbolic links resolved
	root *os.Root
	opts Options
}

// Open opens the workspace directory dir.
func Open(dir string, opts Options) (*FS, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	if opts.MaxRead <= 0 {
		opts.MaxRead = DefaultMaxRead
	}
	if opts.MaxWrite <= 0 {
		opts.MaxWrite = DefaultMaxWrite
	}
	return &FS{dir: abs, real: real, root: root, opts: opts}, nil
}

// Close releases the workspace.
func (w *FS) Close() error { return w.root.Close() }

// Dir is the workspace directory.
func (w *FS) Dir() string { return w.dir }

// Options are the options in force (defaults filled in).
func (w *FS) Options() Options { return w.opts }

// Rel turns a user path into a clean workspace-relative path with forward
// slashes. Relative paths are taken from the workspace root; an absolute
// path must lie under /home/user (hostpath.Home, the workspace's name in
// every box) or inside the workspace directory. "" and "." are the
// workspace itself, as "~" is (and "~/x" is x), the shell's name of it. A path that leaves the workspace by its text is refused
// here; one that leaves it through a symbolic link is refused by each
// operation.
func (w *FS) Rel(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path %q contains a NUL byte: %w", p, ErrInvalid)
	}
	if p == "" {
		return ".", nil
	}
	if err := CheckLength(p); err != nil {
		return "", err
	}
	rel := filepath.ToSlash(p)
	if rel == "~" || strings.HasPrefix(rel, "~/") {
		rel = "." + rel[1:]
	}
	if filepath.IsAbs(p) {
		c := filepath.Clean(p)
		// The host path first: a data directory may lie under /home/user.
		r, ok := within(w.dir, c)
		if !ok {
			r, ok = within(w.real, c)
		}
		if !ok {
			r, ok = within(hostpath.Home, c)
		}
		if !ok {
			return "", fmt.Errorf("%q is not inside the session workspace %s (give a path under it or relative to it): %w", p, hostpath.Home, ErrOutside)
		}
		rel = r
	}
	rel = path.Clean(rel)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%q leads out of the session workspace: %w", p, ErrOutside)
	}
	return rel, nil
}

// The kernel's limits on a path (PATH_MAX) and on one name in it
// (NAME_MAX): past them a call fails with ENAMETOOLONG.
const (
	MaxPath = 4095
	MaxName = 255
)

// CheckLength refuses a path the kernel would refuse as too long (an
// error wrapping ErrInvalid), with a message that says which limit it is
// over.
func CheckLength(p string) error {
	if len(p) > MaxPath {
		return fmt.Errorf("path is too long: %d bytes, over the %d bytes a path may have: %w", len(p), MaxPath, ErrInvalid)
	}
	for name := range strings.SplitSeq(filepath.ToSlash(p), "/") {
		if len(name) > MaxName {
			return fmt.Errorf("path is too long: the name %q… is %d bytes, over the %d bytes one file or directory name may have: %w",
				name[:32], len(name), MaxName, ErrInvalid)
		}
	}
	return nil
}

func within(dir, p string) (string, bool) {
	r, err := filepath.Rel(dir, p)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", false
	}
	return filepath.ToSlash(r), true
}

// explain rewrites an os.Root error in the words of this package, wrapping
// one of its errors.
func explain(rel string, err error) error {
	var pe *fs.PathError
	errors.As(err, &pe)
	var le *os.LinkError
	errors.As(err, &le)
	switch {
	case pe != nil && strings.Contains(pe.Err.Error(), "escapes"),
		le != nil && strings.Contains(le.Err.Error(), "escapes"):
		return fmt.Errorf("%q: %w (a symbolic link on the way points out of it; only relative links that stay inside are followed)", rel, ErrOutside)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%q: %w", rel, ErrNotFound)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%q: a part of the path is a file, not a directory: %w", rel, ErrNotDir)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%q %w", rel, ErrIsDir)
	case errors.Is(err, syscall.ENXIO):
		return fmt.Errorf("%q is not a regular file (a named pipe or a device with nothing behind it): %w", rel, ErrInvalid)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%.64q…: path is too long (at most %d bytes, %d per name): %w", rel, MaxPath, MaxName, ErrInvalid)
	case errors.Is(err, syscall.ELOOP):
		return fmt.Errorf("%q: too many levels of symbolic links: %w", rel, ErrInvalid)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%q: %w", rel, ErrPermission)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%q: %w", rel, ErrNoSpace)
	}
	switch {
	case pe != nil:
		return fmt.Errorf("%q: %s: %v", rel, pe.Op, pe.Err)
	case le != nil:
		return fmt.Errorf("%q: %s: %v", rel, le.Op, le.Err)
	}
	return fmt.Errorf("%q: %v", rel, err)
}

// Content is what Read returns.
type Content struct {
	Path     string      // workspace-relative
	Data     []byte      // the bytes read
	Size     int64       // the whole file's size
	Offset   int64       // where Data starts
	Mode     fs.FileMode // permission bits
	ModTime  time.Time
	Text     bool // Data is valid UTF-8 without NUL bytes
	Complete bool // Data is the whole file
}

// Read reads the regular file at p: the whole file when limit is 0 (refused
// with ErrTooLarge when it is over MaxRead), else at most limit bytes from
// offset (limit at most MaxRead). Symbolic links are followed only while
// they stay inside the workspace.
func (w *FS) Read(p string, offset, limit int64) (*Content, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, err
	}
	if offset < 0 || limit < 0 {
		return nil, fmt.Errorf("offset and limit must not be negative: %w", ErrInvalid)
	}
	if limit > w.opts.MaxRead {
		return nil, fmt.Errorf("limit %d is over the %s one read returns: %w", limit, Human(w.opts.MaxRead), ErrTooLarge)
	}
	f, c, err := w.openRegular(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rel, c.Offset = c.Path, offset
	var r io.Reader
	if limit == 0 {
		if offset == 0 && c.Size > w.opts.MaxRead {
			return nil, fmt.Errorf("%q is %s, over the %s one read returns: %w", rel, Human(c.Size), Human(w.opts.MaxRead), ErrTooLarge)
		}
		// Read one byte more than allowed: the file may grow meanwhile.
		r = io.LimitReader(io.NewSectionReader(f, offset, w.opts.MaxRead+1), w.opts.MaxRead+1)
	} else {
		r = io.NewSectionReader(f, offset, limit)
	}
	c.Data, err = io.ReadAll(r)
	if err != nil {
		return nil, explain(rel, err)
	}
	if int64(len(c.Data)) > w.opts.MaxRead {
		return nil, fmt.Errorf("%q is more than the %s one read returns: %w", rel, Human(w.opts.MaxRead), ErrTooLarge)
	}
	c.Complete = offset == 0 && int64(len(c.Data)) >= c.Size
	c.Text = IsText(c.Data)
	return c, nil
}

// Open opens the regular file at p for reading, with the checks of Read
// (symbolic links followed only while they stay inside the workspace, a
// FIFO or device refused): the caller sends its bytes itself (an HTTP
// download: the kernel's copy from the file to the socket) and closes it.
// The Content describes the file as opened (Path, Size, Mode, ModTime;
// no Data): the file may change afterwards, and a reader that must send
// Size bytes checks that it could.
func (w *FS) Open(p string) (*os.File, *Content, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, nil, err
	}
	return w.openRegular(rel)
}

// openRegular opens the workspace-relative rel for reading, refusing what
// is not a regular file.
func (w *FS) openRegular(rel string) (*os.File, *Content, error) {
	rel, err := w.resolveLinks(rel)
	if err != nil {
		return nil, nil, err
	}
	// O_NONBLOCK: opening a FIFO the session planted must not hang the
	// server; regular files read as usual.
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, explain(rel, err)
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		err = explain(rel, err)
	case fi.IsDir():
		err = fmt.Errorf("%q %w", rel, ErrIsDir)
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("%q is not a regular file (%s): %w", rel, typeName(fi.Mode()), ErrInvalid)
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, &Content{Path: rel, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime()}, nil
}

// IsText reports whether b is valid UTF-8 without NUL bytes.
func IsText(b []byte) bool { return utf8.Valid(b) && !slices.Contains(b, 0) }

// Written describes a Write.
type Written struct {
	Path    string // workspace-relative, as written (a symbolic link resolved)
	Size    int64  // the file's size afterwards
	Wrote   int64  // bytes written
	Created bool   // the file did not exist before
	Mode    fs.FileMode
}

// Write replaces the file at p with data, or appends data to it, creating
// the file and its missing parent directories. A replacement is atomic:
// data goes to a temporary file beside it, which is then renamed over it,
// so a reader sees the old content or the new, never a part. An existing
// file keeps its permission bits; a new one gets 0644. A symbolic link at
// p is written through when it points inside the workspace and refused when
// it points out.
func (w *FS) Write(p string, data []byte, appendTo bool) (*Written, error) {
	return w.write(p, data, appendTo, nil)
}

// WriteMetadata replaces the file at p with data as Write does, the new
// file carrying the metadata md (CheckMetadata) and no other: a file
// replaced without metadata has none.
func (w *FS) WriteMetadata(p string, data []byte, md map[string]string) (*Written, error) {
	if err := CheckMetadata(md); err != nil {
		return nil, err
	}
	return w.write(p, data, false, md)
}

func (w *FS) write(p string, data []byte, appendTo bool, md map[string]string) (*Written, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, fmt.Errorf("the workspace itself is a directory; name a file in it: %w", ErrIsDir)
	}
	if int64(len(data)) > w.opts.MaxWrite {
		return nil, fmt.Errorf("%s of content is over the %s one write takes: %w", Human(int64(len(data))), Human(w.opts.MaxWrite), ErrTooLarge)
	}
	if rel, err = w.resolveLinks(rel); err != nil {
		return nil, err
	}
	if err := w.mkdirAll(path.Dir(rel)); err != nil {
		return nil, err
	}
	if appendTo {
		f, err := w.root.OpenFile(rel, os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if err == nil {
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return nil, explain(rel, err)
			}
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%q is not a regular file (%s): %w", rel, typeName(fi.Mode()), ErrInvalid)
			}
			if _, err := f.Write(data); err != nil {
				return nil, explain(rel, err)
			}
			if err := f.Close(); err != nil {
				return nil, explain(rel, err)
			}
			return &Written{Path: rel, Size: fi.Size() + int64(len(data)), Wrote: int64(len(data)), Mode: fi.Mode().Perm()}, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, explain(rel, err)
		}
		// No file yet: create it like a replacement.
	}
	mode, created := fs.FileMode(0o644), true
	if fi, err := w.root.Lstat(rel); err == nil {
		switch {
		case fi.IsDir():
			return nil, fmt.Errorf("%q %w", rel, ErrIsDir)
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("%q is not a regular file (%s): %w", rel, typeName(fi.Mode()), ErrInvalid)
		}
		mode, created = fi.Mode().Perm(), false
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, explain(rel, err)
	}
	if err := w.replace(rel, data, mode, md); err != nil {
		return nil, err
	}
	return &Written{Path: rel, Size: int64(len(data)), Wrote: int64(len(data)), Created: created, Mode: mode}, nil
}

// WriteNew creates the file rel with data and mode; an existing file (or
// anything else at rel) is an error wrapping ErrExists. Parent directories
// are created.
func (w *FS) WriteNew(p string, data []byte, mode fs.FileMode) error {
	rel, err := w.Rel(p)
	if err != nil {
		return err
	}
	if err := w.mkdirAll(path.Dir(rel)); err != nil {
		return err
	}
	f, err := w.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%q %w", rel, ErrExists)
		}
		return explain(rel, err)
	}
	return w.finish(rel, f, data, mode, nil)
}

// tempMark names replace's temporary files: "." + the file's name +
// tempMark + 16 hex digits.
const tempMark = ".quro-tmp-"

// IsTemp says name (one path element) is one of replace's temporary
// files, which are the server's own: watches leave them out.
func IsTemp(name string) bool {
	i := strings.LastIndex(name, tempMark)
	if i < 1 || name[0] != '.' {
		return false
	}
	h := name[i+len(tempMark):]
	if len(h) != 16 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// replace writes data to a new temporary file in rel's directory and
// renames it over rel. Both happen through one root opened at that
// directory, so a parent link swapped meanwhile cannot split them.
func (w *FS) replace(rel string, data []byte, mode fs.FileMode, md map[string]string) error {
	dir, err := w.root.OpenRoot(path.Dir(rel))
	if err != nil {
		return explain(rel, err)
	}
	defer dir.Close()
	var rnd [8]byte
	rand.Read(rnd[:])
	base := path.Base(rel)
	// The temporary name keeps under NAME_MAX whatever base's length.
	tmp := "." + base[:min(len(base), MaxName-64)] + tempMark + hex.EncodeToString(rnd[:])
	// O_EXCL: never opens an existing file, nor follows a link planted there.
	f, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return explain(rel, err)
	}
	if err := w.finish(rel, f, data, mode, md); err != nil {
		_ = dir.Remove(tmp) // clean-up; the error to report is err
		return err
	}
	// Rename replaces what is at rel itself (a link planted there since the
	// check is replaced, not followed).
	if err := dir.Rename(tmp, base); err != nil {
		_ = dir.Remove(tmp) // clean-up; the error to report is err
		if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			return fmt.Errorf("%q %w", rel, ErrIsDir)
		}
		return explain(rel, err)
	}
	return nil
}

// finish writes data to the open file f, gives it mode, the owner and
// the metadata md, and closes it. All are set on the descriptor, not by
// name.
func (w *FS) finish(rel string, f *os.File, data []byte, mode fs.FileMode, md map[string]string) error {
	_, err := f.Write(data)
	if err == nil && md != nil {
		err = setMetadata(f, md)
	}
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if err == nil && w.opts.Owner != nil {
		err = f.Chown(w.opts.Owner.UID, w.opts.Owner.GID)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return explain(rel, err)
	}
	return nil
}

// resolveLinks follows a symbolic link at rel (and links it points to) as
// long as it stays inside the workspace, and returns the path of what it
// finally names: an absolute link to a file inside the workspace works too
// (os.Root refuses every absolute link). It only reads links through the
// root; what it returns is opened through the root again, so a link swapped
// meanwhile still cannot lead out. Links in parent directories are left to
// os.Root.
func (w *FS) resolveLinks(rel string) (string, error) {
	orig := rel
	for range 40 {
		fi, err := w.root.Lstat(rel)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return rel, nil //nolint:nilerr // not a link (or gone): the open through the root that follows reports it
		}
		target, err := w.root.Readlink(rel)
		if err != nil {
			return "", explain(orig, err)
		}
		var next string
		if filepath.IsAbs(target) {
			r, ok := within(w.real, filepath.Clean(target))
			if !ok {
				r, ok = within(w.dir, filepath.Clean(target))
			}
			if !ok { // the box's name of the workspace
				r, ok = within(hostpath.Home, filepath.Clean(target))
			}
			if !ok {
				return "", fmt.Errorf("%q: %w (it is a symbolic link to %s)", orig, ErrOutside, target)
			}
			next = r
		} else {
			next = path.Clean(path.Join(w.canonicalDir(path.Dir(rel)), filepath.ToSlash(target)))
		}
		if next == ".." || strings.HasPrefix(next, "../") {
			return "", fmt.Errorf("%q: %w (it is a symbolic link to %s)", orig, ErrOutside, target)
		}
		rel = next
	}
	return "", fmt.Errorf("%q: too many levels of symbolic links: %w", orig, ErrInvalid)
}

// canonicalDir is the workspace-relative path of the directory rel with the
// links in it resolved by the kernel (through the root, so never outside):
// a relative link target is taken from there, as the kernel would.
func (w *FS) canonicalDir(rel string) string {
	if rel == "." {
		return rel
	}
	f, err := w.root.Open(rel)
	if err != nil {
		return rel // the open of the result reports the problem
	}
	defer f.Close()
	real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return rel
	}
	if r, ok := within(w.real, real); ok {
		return r
	}
	return rel
}

// MkdirAll creates the directory p and its missing parents, owned by the
// session.
func (w *FS) MkdirAll(p string) (string, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return "", err
	}
	return rel, w.mkdirAll(rel)
}

func (w *FS) mkdirAll(rel string) error {
	if rel == "." {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		dir := strings.Join(parts[:i+1], "/")
		err := w.root.Mkdir(dir, 0o755)
		if err == nil {
			if w.opts.Owner != nil {
				if err := w.root.Lchown(dir, w.opts.Owner.UID, w.opts.Owner.GID); err != nil {
					return explain(dir, err)
				}
			}
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return explain(dir, err)
		}
		// Something is there: it must be a directory, or a link to one
		// inside the workspace (Stat through the root refuses one out).
		fi, err := w.root.Stat(dir)
		if err != nil {
			return explain(dir, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%q is a file, not a directory: %w", dir, ErrNotDir)
		}
	}
	return nil
}

// Stat describes p, following symbolic links that stay inside.
func (w *FS) Stat(p string) (string, fs.FileInfo, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return "", nil, err
	}
	fi, err := w.root.Stat(rel)
	if err != nil {
		return rel, nil, explain(rel, err)
	}
	return rel, fi, nil
}

// Human writes n bytes for people: 512 bytes, 3.0 KiB, 8 MiB.
func Human(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n == 1:
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// kinds are the types of file by their mode bits: the name messages and
// Entry.Type use, and the letter ls -l writes first. The first match wins
// (a character device has ModeDevice too).
var kinds = []struct {
	bit          fs.FileMode
	name, letter string
}{
	{fs.ModeDir, "dir", "d"},
	{fs.ModeSymlink, "symlink", "l"},
	{fs.ModeNamedPipe, "named pipe", "p"},
	{fs.ModeSocket, "socket", "s"},
	{fs.ModeCharDevice, "device", "c"},
	{fs.ModeDevice, "device", "b"},
}

// kindOf is the type of a file of mode m: its name and ls's letter.
func kindOf(m fs.FileMode) (name, letter string) {
	if m.IsRegular() {
		return "file", "-"
	}
	for _, k := range kinds {
		if m&k.bit != 0 {
			return k.name, k.letter
		}
	}
	return "other", "-"
}

// typeName is the name of the type of a file of mode m.
func typeName(m fs.FileMode) string {
	name, _ := kindOf(m)
	return name
}

// Exists reports whether p exists (a symbolic link that stays inside is
// followed; a dangling one does not exist). A path that leads out of the
// workspace is an error, not false.
func (w *FS) Exists(p string) (bool, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return false, err
	}
	if _, err := w.root.Stat(rel); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, explain(rel, err)
	}
	return true, nil
}

// Remove removes p: a file, a symbolic link (never its target), or a
// directory with everything in it. The workspace itself cannot be removed.
func (w *FS) Remove(p string) (string, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return "", err
	}
	if rel == "." {
		return "", fmt.Errorf("cannot remove the workspace itself: %w", ErrInvalid)
	}
	if _, err := w.root.Lstat(rel); err != nil {
		return "", explain(rel, err)
	}
	if err := w.root.RemoveAll(rel); err != nil {
		return "", explain(rel, err)
	}
	return rel, nil
}
