package js

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/quro-dev/quro/internal/workspace"
)

// ErrOutside marks a path that leads out of the session workspace; it is
// workspace.ErrOutside (one workspace layer serves the file API and the
// engine). Test with errors.Is.
var ErrOutside = workspace.ErrOutside

// maxList is the most entries Tools.Files.list returns.
const maxList = 10000

// openWorkspace opens the session workspace dir through internal/workspace:
// paths confined by os.Root, only regular files read or written (a FIFO or
// a device the session planted is refused, never opened for blocking I/O),
// and what the run creates owned by the session's uid when the server runs
// as root, as the file API does, so the session's own code can change it.
func (e *Engine) openWorkspace(dir string, uid int) (*workspace.FS, error) {
	opts := workspace.Options{MaxRead: e.opts.MaxRead, MaxWrite: e.opts.MaxRead}
	if os.Geteuid() == 0 && uid > 0 {
		opts.Owner = &workspace.Owner{UID: uid, GID: uid}
	}
	return workspace.Open(dir, opts)
}

// rel turns a path of the code into a workspace-relative one: a relative
// path is taken from base (a workspace-relative directory), an absolute one
// must lie inside the workspace.
func wsRel(ws *workspace.FS, base, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", workspace.ErrInvalid)
	}
	if !filepath.IsAbs(p) {
		p = path.Join(filepath.ToSlash(base), filepath.ToSlash(p))
	}
	return ws.Rel(p)
}

// listEntry is one item of Tools.Files.list.
type listEntry struct {
	Name string `json:"name"`
	Type string `json:"type"` // file, dir, symlink or other
	Size int64  `json:"size"`
}

func list(ws *workspace.FS, rel string) ([]listEntry, error) {
	l, err := ws.List(rel, workspace.ListOptions{Depth: 1, MaxEntries: maxList})
	if err != nil {
		return nil, err
	}
	if l.Truncated {
		return nil, fmt.Errorf("%q has more than %d entries, more than one list returns", rel, maxList)
	}
	out := make([]listEntry, 0, len(l.Entries))
	for _, e := range l.Entries {
		out = append(out, listEntry{Name: e.Name, Type: e.Type, Size: e.Size})
	}
	return out, nil
}

// isOutside reports an error of a path that leads out of the workspace.
func isOutside(err error) bool { return errors.Is(err, workspace.ErrOutside) }
