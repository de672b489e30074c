package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/textedit"
	"github.com/quro-dev/quro/internal/workspace"
)

// edit_file: the text-editor tool coding agents already use (view,
// str_replace, insert, with those argument names), on the session
// workspace through the one workspace layer: a file is read whole, edited
// in memory (internal/textedit) and written back atomically by
// workspace.FS.Write, as write_file writes.

// EditFileInput is edit_file's input.
type EditFileInput struct {
	Session    string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Command    string `json:"command" jsonschema:"view, str_replace or insert"`
	Path       string `json:"path" jsonschema:"under /home/user, or relative to it; any other absolute path is the session box's own (/tmp/x)"`
	OldStr     string `json:"old_str,omitempty" jsonschema:"str_replace: the exact text, which must occur once"`
	NewStr     string `json:"new_str,omitempty" jsonschema:"str_replace: its replacement (empty deletes); insert: the lines to insert"`
	InsertLine *int   `json:"insert_line,omitempty" jsonschema:"insert: after this line (0: at the top)"`
	ViewRange  []int  `json:"view_range,omitempty" jsonschema:"view: [first, last] line; last -1: to the end"`
}

// FileEdited is edit_file's output.
type FileEdited struct {
	Session string `json:"session"`
	Command string `json:"command"`
	Path    string `json:"path" jsonschema:"workspace-relative path of the file (a symbolic link resolved)"`
	Summary string `json:"summary" jsonschema:"what was shown or changed"`
	Lines   int    `json:"lines" jsonschema:"the file's lines (after an edit); a directory's entries shown"`
	Shown   string `json:"shown" jsonschema:"numbered lines (cat -n): the range viewed, or the edit with lines around it; a directory's entries"`
	More    bool   `json:"more,omitempty" jsonschema:"view: lines of the range were left out; summary says how to see them"`
}

// Text is the summary over the numbered lines.
func (e *FileEdited) Text() string {
	if e.Shown == "" {
		return e.Summary
	}
	return e.Summary + "\n" + strings.TrimRight(e.Shown, "\n")
}

// What edit_file shows at most: a view is cut at viewBudget bytes (with a
// note of how to page on), an edit shows snippetContext lines either side
// and at most snippetLines lines, and every line shown is cut at lineCut
// bytes.
var (
	viewBudget     = textedit.Budget{Bytes: 16 << 10, LineCut: 1000}
	snippetBudget  = textedit.Budget{Bytes: 4 << 10, LineCut: 300, MaxLines: 24}
	snippetContext = 4
	maxDirEntries  = 200
)

func (a *App) registerEdit(reg *capability.Registry) {
	reg.Register(capability.New("edit_file",
		"View or edit a text file of the workspace: view shows numbered lines (a directory: its entries); "+
			"str_replace replaces old_str, which must occur exactly once, with new_str; insert puts new_str after line insert_line. "+
			"An edit answers with the lines around it. To create or overwrite a whole file use write_file.",
		capability.ScopeExec, a.editFile).InSession(capability.UseHold))
}

func (a *App) editFile(ctx context.Context, in EditFileInput) (*FileEdited, error) {
	switch in.Command {
	case "view", "str_replace", "insert":
	case "":
		return nil, capability.Errorf(capability.InvalidArgument, "command is empty: use view, str_replace or insert")
	default:
		msg := fmt.Sprintf("command %q: use view, str_replace or insert", in.Command)
		if in.Command == "create" {
			msg += " (write_file creates a file)"
		} else if c := capability.Closest(in.Command, []string{"view", "str_replace", "insert"}); c != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", c)
		}
		return nil, capability.Errorf(capability.InvalidArgument, "%s", msg)
	}
	if err := needPath(in.Path, "path"); err != nil {
		return nil, err
	}
	p := in.Path // the workspace layer reads /home/user/x, ~/x and x alike
	if err := checkEditArgs(in); err != nil {
		return nil, err
	}
	sess, w, done, err := a.openFiles(ctx, p)
	if err != nil {
		return nil, err
	}
	defer done()
	if in.Command != "view" {
		// Two edits of one file in the same turn each read it, change it
		// and write it back: one at a time, or the second would write
		// over the first.
		unlock, err := a.edits.lock(ctx, sess.ID)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	c, err := w.Read(p, 0, 0)
	switch {
	case in.Command == "view" && errors.Is(err, workspace.ErrIsDir):
		return viewDir(sess.ID, w, p)
	case errors.Is(err, workspace.ErrIsDir):
		return nil, fmt.Errorf("%w: edit_file edits a file; view lists a directory", err)
	case errors.Is(err, workspace.ErrTooLarge):
		return nil, fmt.Errorf("%w: edit_file reads files up to %s; change a bigger one with run_code or terminal_exec", err, workspace.Human(w.Options().MaxRead))
	case err != nil:
		return nil, err
	}
	if !c.Text {
		return nil, capability.Errorf(capability.InvalidArgument,
			"%q is not UTF-8 text (it has invalid UTF-8 or NUL bytes): edit_file edits text; read_file and write_file (encoding base64) handle any file", c.Path)
	}
	out := &FileEdited{Session: sess.ID, Command: in.Command, Path: c.Path}
	if in.Command == "view" {
		return viewFile(out, c.Data, in.ViewRange)
	}
	var data []byte
	var e textedit.Edit
	if in.Command == "str_replace" {
		data, e, err = textedit.Replace(c.Data, in.OldStr, in.NewStr)
	} else {
		data, e, err = textedit.Insert(c.Data, *in.InsertLine, in.NewStr)
	}
	if err != nil {
		// The file is unchanged: say which one, and why.
		return nil, capability.Errorf(capability.InvalidArgument, "%s: %v", c.Path, err)
	}
	if n, most := int64(len(data)), w.Options().MaxWrite; n > most {
		return nil, capability.Errorf(capability.InvalidArgument, "%s: the edited file would be %s, over the %s one write takes: change it with run_code or terminal_exec",
			c.Path, workspace.Human(n), workspace.Human(most))
	}
	// Written where it was read: a symbolic link it went through stays.
	if _, err := w.Write(c.Path, data, false); err != nil {
		return nil, err
	}
	out.Lines = textedit.Lines(data)
	lines := func(from, to int) string {
		if to <= from {
			return fmt.Sprintf("line %d", from)
		}
		return fmt.Sprintf("lines %d-%d", from, to)
	}
	if in.Command == "str_replace" {
		out.Summary = fmt.Sprintf("edited %s: %d line(s) replaced, now %s", c.Path, e.Removed, lines(e.First, e.Last))
		if in.NewStr == "" {
			out.Summary = fmt.Sprintf("edited %s: text removed at %s", c.Path, lines(e.First, e.First))
		}
	} else {
		out.Summary = fmt.Sprintf("edited %s: inserted %s", c.Path, lines(e.First, e.Last))
	}
	out.Summary += fmt.Sprintf(" (%d lines in all):", out.Lines)
	out.Shown = textedit.Snippet(data, e, snippetContext, snippetBudget)
	return out, nil
}

// checkEditArgs refuses arguments that do not belong to the command, so
// that a model that mixed them up learns it at once.
func checkEditArgs(in EditFileInput) error {
	bad := func(format string, a ...any) error {
		return capability.Errorf(capability.InvalidArgument, format, a...)
	}
	switch in.Command {
	case "view":
		if in.OldStr != "" || in.NewStr != "" || in.InsertLine != nil {
			return bad("view takes path and view_range only: old_str, new_str and insert_line belong to str_replace and insert")
		}
		if r := in.ViewRange; r != nil && len(r) != 2 {
			return bad("view_range is [first, last] (two line numbers; last -1 means to the end), not %d numbers", len(r))
		}
	case "str_replace":
		if in.InsertLine != nil || in.ViewRange != nil {
			return bad("str_replace takes path, old_str and new_str: insert_line belongs to insert, view_range to view")
		}
		if in.OldStr == "" {
			return bad("str_replace needs old_str, the exact text to replace (view shows the file)")
		}
	case "insert":
		if in.OldStr != "" || in.ViewRange != nil {
			return bad("insert takes path, insert_line and new_str: old_str belongs to str_replace, view_range to view")
		}
		if in.InsertLine == nil {
			return bad("insert needs insert_line: new_str goes after that line (0: at the top)")
		}
	}
	if strings.IndexByte(in.NewStr, 0) >= 0 {
		return bad("new_str has a NUL byte: edit_file writes text; write_file (encoding base64) writes bytes")
	}
	return nil
}

func viewFile(out *FileEdited, data []byte, r []int) (*FileEdited, error) {
	from, to := 1, -1
	if r != nil {
		from, to = r[0], r[1]
	}
	v, err := textedit.ViewLines(data, from, to, viewBudget)
	if err != nil {
		return nil, capability.Errorf(capability.InvalidArgument, "%s: %v", out.Path, err)
	}
	out.Lines, out.Shown, out.More = v.Lines, v.Text, v.Cut
	switch {
	case v.Lines == 0:
		out.Summary = out.Path + " is empty"
	case v.Cut:
		out.Summary = fmt.Sprintf("%s lines %d-%d of %d (cut at %s; view_range [%d, %d] shows the next part):", out.Path, v.From, v.To, v.Lines,
			workspace.Human(int64(viewBudget.Bytes)), v.To+1, to)
	case v.From == 1 && v.To == v.Lines:
		out.Summary = fmt.Sprintf("%s (%d lines):", out.Path, v.Lines)
	default:
		out.Summary = fmt.Sprintf("%s lines %d-%d of %d:", out.Path, v.From, v.To, v.Lines)
	}
	return out, nil
}

// viewDir lists a directory two levels deep, as the text-editor tool
// does; list_files describes entries in full.
func viewDir(id string, w fileOps, p string) (*FileEdited, error) {
	l, err := w.List(p, workspace.ListOptions{Depth: 2, MaxEntries: maxDirEntries})
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	for _, e := range l.Entries {
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "%s/\n", e.Path)
		case "symlink":
			fmt.Fprintf(&b, "%s -> %s\n", e.Path, e.Target)
		default:
			fmt.Fprintf(&b, "%s\n", e.Path)
		}
	}
	out := &FileEdited{Session: id, Command: "view", Path: l.Path, Lines: len(l.Entries), Shown: b.String(), More: l.Truncated}
	name := l.Path
	if name == "." {
		name = sandbox.HomeUser
	}
	out.Summary = fmt.Sprintf("%s/ (directory, 2 levels, %d entries):", name, len(l.Entries))
	if l.Truncated {
		out.Summary = fmt.Sprintf("%s/ (directory, 2 levels, first %d entries; list_files lists a subdirectory, or more):", name, len(l.Entries))
	}
	return out, nil
}

// editLocks lets one edit_file call at a time change a session's files;
// the others wait, in no promised order, until their context ends.
type editLocks struct {
	mu sync.Mutex
	m  map[string]*editLock
}

type editLock struct {
	ch      chan struct{} // holds a value while an edit runs
	waiters int           // calls holding or waiting for ch
}

// lock waits for session id's turn; unlock ends it. The entry of a
// session goes when no call holds or waits for it.
func (l *editLocks) lock(ctx context.Context, id string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*editLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &editLock{ch: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.waiters++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.waiters--; e.waiters == 0 {
			delete(l.m, id)
		}
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, context.Cause(ctx)
	}
}
