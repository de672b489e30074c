package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"syscall"
)

// Names turns a file's uid and gid into the names the session's box gives
// them (Options.Names); nil writes the numbers.
type Names func(uid, gid uint32) (owner, group string)

// describe fills e's type, size, mode, times, owner and link target from
// fi, an lstat of e.Path made through the root.
func (w *FS) describe(e *Entry, fi fs.FileInfo) {
	var letter string
	e.Type, letter = kindOf(fi.Mode())
	e.Mode = fmt.Sprintf("%04o", fi.Mode().Perm())
	// Go writes e.g. "Lrwxrwxrwx", "Dcrw-…": ls writes one letter of type.
	perm := fi.Mode().String()
	e.Permissions = letter + perm[len(perm)-9:]
	e.ModTime = fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if w.opts.Names != nil {
			e.Owner, e.Group = w.opts.Names(st.Uid, st.Gid)
		} else {
			e.Owner, e.Group = strconv.FormatUint(uint64(st.Uid), 10), strconv.FormatUint(uint64(st.Gid), 10)
		}
	}
	switch e.Type {
	case "file", "dir": // a directory's is what stat says (4096 on ext4)
		e.Size = fi.Size()
	case "symlink":
		e.Target, _ = w.root.Readlink(e.Path)
		e.TargetType = w.targetType(e.Path, e.Target)
	default:
		e.Type = "other"
	}
}

// maxLinkHops bounds the links targetType follows (the kernel's ELOOP
// bound).
const maxLinkHops = 40

// targetType is the type ("file", "dir", "other") of what the link at rel,
// pointing to target, finally leads to, when every step stays inside the
// workspace (a target under /home/user or relative to the link's
// directory), else "" (dangling, a loop, or outside: not known here).
// Every step is an lstat through the root, so nothing outside is touched.
func (w *FS) targetType(rel, target string) string {
	for range maxLinkHops {
		next := target
		if !path.IsAbs(next) {
			next = path.Join(path.Dir(rel), next)
		}
		r, err := w.Rel(next)
		if err != nil {
			return ""
		}
		fi, err := w.root.Lstat(r)
		if err != nil {
			return ""
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if t, _ := kindOf(fi.Mode()); t == "file" || t == "dir" {
				return t
			}
			return "other"
		}
		if target, err = w.root.Readlink(r); err != nil {
			return ""
		}
		rel = r
	}
	return ""
}

// Info describes p itself: a symbolic link is described as a link (with
// its target), never followed, so describing cannot lead out of the
// workspace; links in the parent directories are followed only while they
// stay inside (os.Root).
func (w *FS) Info(p string) (*Entry, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, err
	}
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return nil, explain(rel, err)
	}
	return w.entry(rel, fi), nil
}

func (w *FS) entry(rel string, fi fs.FileInfo) *Entry {
	e := &Entry{Name: path.Base(rel), Path: rel}
	w.describe(e, fi)
	e.Metadata = w.metadata(rel, fi)
	return e
}

// MakeDir creates the directory p and its missing parents, owned by the
// session (mkdir -p), and describes it. existed says p was already a
// directory (or a link inside the workspace to one); a file there is an
// error wrapping ErrNotDir.
func (w *FS) MakeDir(p string) (e *Entry, existed bool, err error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, false, err
	}
	if rel != "." {
		// Is it there already? Stat through the root follows a link
		// that stays inside and refuses one that leads out.
		if fi, err := w.root.Stat(rel); err == nil {
			if !fi.IsDir() {
				return nil, false, fmt.Errorf("%q is a %s, not a directory: %w", rel, typeName(fi.Mode()), ErrNotDir)
			}
			existed = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, false, explain(rel, err)
		}
	} else {
		existed = true
	}
	if err := w.mkdirAll(rel); err != nil {
		return nil, false, err
	}
	e, err = w.Info(rel)
	return e, existed, err
}

// Move renames src to dst, both inside the workspace; missing parents of
// dst are created. What is at dst (a file, an empty directory) is replaced
// as rename(2) does. A symbolic link at src is moved itself, never its
// target; links in the parent directories are followed only while they
// stay inside (os.Root resolves both paths beneath the workspace at the
// moment of the rename).
func (w *FS) Move(src, dst string) (*Entry, error) {
	from, err := w.Rel(src)
	if err != nil {
		return nil, err
	}
	to, err := w.Rel(dst)
	if err != nil {
		return nil, err
	}
	if from == "." || to == "." {
		return nil, fmt.Errorf("cannot move the workspace itself, nor over it: %w", ErrInvalid)
	}
	if _, err := w.root.Lstat(from); err != nil {
		return nil, explain(from, err)
	}
	if err := w.mkdirAll(path.Dir(to)); err != nil {
		return nil, err
	}
	if err := w.root.Rename(from, to); err != nil {
		switch {
		case errors.Is(err, syscall.EINVAL):
			return nil, fmt.Errorf("cannot move %q into itself (%q): %w", from, to, ErrInvalid)
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			return nil, fmt.Errorf("%q: a directory that is not empty is in the way: %w", to, ErrExists)
		case errors.Is(err, syscall.EISDIR):
			return nil, fmt.Errorf("%q is a directory; a file cannot replace it: %w", to, ErrIsDir)
		case errors.Is(err, syscall.ENOTDIR):
			return nil, fmt.Errorf("%q: a directory cannot replace a file: %w", to, ErrNotDir)
		}
		return nil, explain(from+" -> "+to, err)
	}
	return w.Info(to)
}
