package js

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// ErrOutside marks a path that leads out of the session workspace, by "..",
// by an absolute path elsewhere, or through a symbolic link. Test with
// errors.Is.
var ErrOutside = errors.New("path leads outside the session workspace")

// ErrNotFound marks a path that does not exist in the workspace; it matches
// fs.ErrNotExist too.
var ErrNotFound = fmt.Errorf("no such file or directory in the workspace (%w)", fs.ErrNotExist)

// Workspace is a session workspace opened for the host API. Every access
// goes through an os.Root, so a path is resolved one component at a time
// beneath the workspace directory and a symbolic link that points out of it
// is refused, also when the link is swapped in between a check and a use.
// A Workspace is used by one run at a time.
type Workspace struct {
	dir  string // absolute, symlinks resolved
	root *os.Root
	max  int64 // largest file read
}

// OpenWorkspace opens dir (a session workspace) for confined access; reads
// larger than maxRead bytes are refused.
func OpenWorkspace(dir string, maxRead int64) (*Workspace, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &Workspace{dir: abs, root: root, max: maxRead}, nil
}

// Close releases the workspace.
func (w *Workspace) Close() error { return w.root.Close() }

// Rel turns a user path into a clean path relative to the workspace, with
// forward slashes: relative paths are taken from the workspace root (or from
// base, a workspace-relative directory, when given), absolute paths must lie
// inside the workspace directory. "." is the workspace itself.
func (w *Workspace) Rel(base, p string) (string, error) {
	if p == "" {
		return "", errors.New("empty path")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errors.New("path contains a NUL byte")
	}
	var rel string
	if filepath.IsAbs(p) {
		r, err := filepath.Rel(w.dir, filepath.Clean(p))
		if err != nil {
			return "", fmt.Errorf("%q: %w", p, ErrOutside)
		}
		rel = filepath.ToSlash(r)
	} else {
		rel = path.Join(filepath.ToSlash(base), filepath.ToSlash(p))
	}
	rel = path.Clean(rel)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%q: %w", p, ErrOutside)
	}
	return rel, nil
}

// explain rewrites an os.Root error in the host API's words.
func explain(p string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return fmt.Errorf("%q: %w (a symbolic link on the way points out of it)", p, ErrOutside)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%q: %w", p, ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%q: permission denied", p)
	}
	if pe != nil {
		return fmt.Errorf("%q: %v", p, pe.Err)
	}
	return fmt.Errorf("%q: %v", p, err)
}

// Stat returns the file info of rel, following symbolic links that stay
// inside the workspace.
func (w *Workspace) Stat(rel string) (fs.FileInfo, error) {
	fi, err := w.root.Stat(rel)
	if err != nil {
		return nil, explain(rel, err)
	}
	return fi, nil
}

// ReadFile reads rel, refusing files over the read limit.
func (w *Workspace) ReadFile(rel string) ([]byte, error) {
	f, err := w.root.Open(rel)
	if err != nil {
		return nil, explain(rel, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, explain(rel, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%q is a directory", rel)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%q is not a regular file", rel)
	}
	b, err := io.ReadAll(io.LimitReader(f, w.max+1))
	if err != nil {
		return nil, explain(rel, err)
	}
	if int64(len(b)) > w.max {
		return nil, fmt.Errorf("%q is larger than the %s a run may read", rel, sizeText(w.max))
	}
	return b, nil
}

// WriteFile writes (or appends) data to rel, creating missing parent
// directories inside the workspace.
func (w *Workspace) WriteFile(rel string, data []byte, appendTo bool) error {
	if rel == "." {
		return errors.New("cannot write to the workspace directory itself")
	}
	if dir := path.Dir(rel); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return explain(rel, err)
		}
	}
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appendTo {
		flag = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := w.root.OpenFile(rel, flag, 0o644)
	if err != nil {
		return explain(rel, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return explain(rel, err)
	}
	return f.Close()
}

// Entry is one item of a directory listing.
type Entry struct {
	Name string `json:"name"`
	Type string `json:"type"` // file, dir, symlink or other
	Size int64  `json:"size"`
}

// List lists the directory rel, sorted by name. Symbolic links are listed as
// such, not followed.
func (w *Workspace) List(rel string) ([]Entry, error) {
	f, err := w.root.Open(rel)
	if err != nil {
		return nil, explain(rel, err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, explain(rel, err)
	}
	out := make([]Entry, 0, len(ents))
	for _, d := range ents {
		e := Entry{Name: d.Name(), Type: "other"}
		switch t := d.Type(); {
		case t.IsDir():
			e.Type = "dir"
		case t&fs.ModeSymlink != 0:
			e.Type = "symlink"
		case t.IsRegular():
			e.Type = "file"
			if fi, err := d.Info(); err == nil {
				e.Size = fi.Size()
			}
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Exists reports whether rel exists. A path that leads out of the workspace
// is an error, not false.
func (w *Workspace) Exists(rel string) (bool, error) {
	_, err := w.root.Stat(rel)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return false, explain(rel, err)
}

// Remove removes rel: a file, a symbolic link (not its target) or a
// directory with everything in it.
func (w *Workspace) Remove(rel string) error {
	if rel == "." {
		return errors.New("cannot remove the workspace itself")
	}
	if _, err := w.root.Lstat(rel); err != nil {
		return explain(rel, err)
	}
	if err := w.root.RemoveAll(rel); err != nil {
		return explain(rel, err)
	}
	return nil
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
