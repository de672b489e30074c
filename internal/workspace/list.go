package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
)

// Entry is one item of a listing.
type Entry struct {
	Name    string    `json:"name"`
	Path    string    `json:"path" jsonschema:"workspace-relative path (absolute for a path of the session box outside the workspace)"`
	Type    string    `json:"type" jsonschema:"file, dir, symlink or other"`
	Size    int64     `json:"size" jsonschema:"bytes: a file's content; a directory's own size as stat gives it (e.g. 4096); 0 for a symlink"`
	Mode    string    `json:"mode" jsonschema:"permission bits, octal"`
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"target,omitempty" jsonschema:"where a symlink points (not followed)"`
	// TargetType is what a symlink finally leads to, when that is inside
	// the workspace.
	TargetType string `json:"target_type,omitempty" jsonschema:"a symlink's: the type of what it finally leads to (file, dir or other), when that is inside the workspace; absent when it dangles or leads out"`
	// Permissions is the mode as ls shows it ("-rw-r--r--", "drwxr-xr-x").
	Permissions string `json:"permissions,omitempty" jsonschema:"the mode as ls -l shows it"`
	Owner       string `json:"owner,omitempty" jsonschema:"the owning user as the session box names it"`
	Group       string `json:"group,omitempty" jsonschema:"the owning group as the session box names it"`
	// Metadata is the file's user metadata (its user.e2b.* xattrs).
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"the file's metadata (write_file's metadata; its user.e2b.* extended attributes)"`
}

// Listing is what List returns.
type Listing struct {
	Path      string   // the listed directory, workspace-relative
	Entries   []Entry  // sorted by path
	Truncated bool     // more entries than the limit
	Skipped   []string // directories not descended into, with why
}

// ListOptions bound a listing.
type ListOptions struct {
	Depth      int // 1 lists the directory itself; 0 means 1; at most MaxDepth
	MaxEntries int // 0 means DefaultMaxEntries
}

// List lists the directory p (the workspace when empty) down to Depth
// levels, depth first in name order (a directory's entries right after
// it). Symbolic links are listed as such with their target, never followed,
// so a listing cannot lead out of the workspace. The server's directory
// .quro at the top is listed but not descended into unless p is inside it.
func (w *FS) List(p string, o ListOptions) (*Listing, error) {
	rel, err := w.Rel(p)
	if err != nil {
		return nil, err
	}
	if o.Depth <= 0 {
		o.Depth = 1
	}
	if o.Depth > MaxDepth {
		return nil, fmt.Errorf("depth %d is over the deepest listing, %d: %w", o.Depth, MaxDepth, ErrInvalid)
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	fi, err := w.root.Stat(rel)
	if err != nil {
		return nil, explain(rel, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%q is a %s, %w", rel, typeName(fi.Mode()), ErrNotDir)
	}
	l := &Listing{Path: rel, Entries: []Entry{}}
	w.walk(l, rel, 1, o)
	return l, nil
}

func (w *FS) walk(l *Listing, dir string, depth int, o ListOptions) {
	f, err := w.root.Open(dir)
	if err != nil {
		l.Skipped = append(l.Skipped, fmt.Sprintf("%s: %v", dir, explain(dir, err)))
		return
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		l.Skipped = append(l.Skipped, fmt.Sprintf("%s: %v", dir, explain(dir, err)))
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, d := range ents {
		if len(l.Entries) >= o.MaxEntries {
			l.Truncated = true
			return
		}
		p := path.Join(dir, d.Name())
		e := Entry{Name: d.Name(), Path: p, Type: "other"}
		if fi, err := d.Info(); err == nil { // lstat, relative to the open directory
			w.describe(&e, fi)
			e.Metadata = w.metadata(p, fi)
		} else if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		l.Entries = append(l.Entries, e)
		if e.Type != "dir" || depth >= o.Depth {
			continue
		}
		if p == Internal && dir == "." {
			l.Skipped = append(l.Skipped, Internal+": the server's own files (cut outputs, logs); list it by path to see them")
			continue
		}
		w.walk(l, p, depth+1, o)
		if l.Truncated {
			return
		}
	}
}
