package app

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/picture"
	"github.com/quro-dev/quro/internal/project"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/workspace"
)

// ReadFileInput is read_file's input.
type ReadFileInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path    string `json:"path" jsonschema:"file path relative to the session workspace /home/user, or absolute (outside /home/user: the session box's own path, such as /tmp/x)"`
	Offset  int64  `json:"offset,omitempty" jsonschema:"byte offset to start reading at; default 0"`
	Limit   int64  `json:"limit,omitempty" jsonschema:"read at most this many bytes from offset; default: the whole file"`
	// Open, for an in-process caller that sends a file's bytes itself
	// (the E2B access path's GET /files): a regular file of the session
	// workspace comes back open (FileContent.File) with no Content,
	// opened with the checks of a read, for the kernel to copy to the
	// client. A path of the box is read as without it. Never JSON: no
	// client names it, and a call forwarded to another node reads.
	Open bool `json:"-"`
}

// FileContent is read_file's output.
type FileContent struct {
	Session  string    `json:"session"`
	Path     string    `json:"path" jsonschema:"workspace-relative path of the file read; absolute for a path of the box outside the workspace"`
	Encoding string    `json:"encoding" jsonschema:"utf-8 (content is the text) or base64 (content is the bytes, base64-encoded)"`
	Content  string    `json:"content"`
	Size     int64     `json:"size" jsonschema:"size of the whole file in bytes"`
	Offset   int64     `json:"offset" jsonschema:"where content starts in the file"`
	Length   int64     `json:"length" jsonschema:"bytes of the file in content"`
	Complete bool      `json:"complete" jsonschema:"content is the whole file"`
	Mode     string    `json:"mode" jsonschema:"permission bits, octal"`
	ModTime  time.Time `json:"mtime"`
	// MediaType is set for a whole file that is an image, told from its
	// bytes (picture.Sniff), never its name.
	MediaType string `json:"media_type,omitempty" jsonschema:"set when the whole file is an image (told from its bytes): image/png, image/jpeg, image/gif, image/webp or image/svg+xml"`
	Width     int    `json:"width,omitempty" jsonschema:"a raster image's width in pixels"`
	Height    int    `json:"height,omitempty" jsonschema:"a raster image's height in pixels"`
	// File is the file opened for ReadFileInput.Open, which the caller
	// ends with Release; Size, Mode and ModTime are its own as opened,
	// Content empty.
	File *os.File `json:"-"`
	// Release closes File and ends its tie to the session (nil when no
	// file was opened). The file outlives the read_file call (a download
	// sends it after the call returned), so the session's end closes it
	// too: a destroyed session's disk is never held open by a download
	// still being sent, whatever pace its client reads at.
	Release func() `json:"-"`
}

// Text is the content under a one-line header; a raster image is named
// instead of shown as base64 (its bytes stay in Content).
func (c *FileContent) Text() string {
	part := ""
	if !c.Complete {
		part = fmt.Sprintf(", bytes %d-%d of %d", c.Offset, c.Offset+c.Length, c.Size)
	}
	if c.MediaType != "" && c.Encoding == "base64" {
		img := picture.Image{MIME: c.MediaType, Width: c.Width, Height: c.Height}
		return fmt.Sprintf("%s (%s, mode %s): %s", c.Path, workspace.Human(c.Size), c.Mode, img)
	}
	if c.Encoding == "base64" {
		return fmt.Sprintf("%s (%s, mode %s%s; not UTF-8 text, so base64):\n%s", c.Path, workspace.Human(c.Size), c.Mode, part, c.Content)
	}
	return fmt.Sprintf("%s (%s, mode %s%s):\n%s", c.Path, workspace.Human(c.Size), c.Mode, part, c.Content)
}

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	Session  string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path     string `json:"path" jsonschema:"file path relative to the session workspace /home/user, or absolute (outside /home/user: the session box's own path, such as /tmp/x)"`
	Content  string `json:"content" jsonschema:"the file's content (may be empty)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (default: content is the text) or base64 (content is base64-encoded bytes)"`
	Append   bool   `json:"append,omitempty" jsonschema:"add content to the end of the file instead of replacing it"`
	// Metadata is what E2B's file metadata (X-Metadata-* upload headers) arrives as.
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"labels to keep on the replaced file (its user.e2b.KEY extended attributes, shown by stat_file and list_files): lowercase HTTP-token keys, printable ASCII values, at most 4096 bytes in all; a file replaced without metadata has none; not with append"`
}

// FileWritten is write_file's output.
type FileWritten struct {
	Session string `json:"session"`
	Path    string `json:"path" jsonschema:"workspace-relative path of the file written; absolute for a path of the box outside the workspace"`
	Wrote   int64  `json:"wrote" jsonschema:"bytes written"`
	Size    int64  `json:"size" jsonschema:"the file's size afterwards"`
	Created bool   `json:"created" jsonschema:"the file is new"`
	Append  bool   `json:"append"`
	Mode    string `json:"mode" jsonschema:"permission bits, octal"`
}

// Text says what happened.
func (w *FileWritten) Text() string {
	how := "replaced"
	switch {
	case w.Created:
		how = "created"
	case w.Append:
		how = "appended to"
	}
	return fmt.Sprintf("%s %s: wrote %s, now %s (mode %s)", how, w.Path, workspace.Human(w.Wrote), workspace.Human(w.Size), w.Mode)
}

// ListFilesInput is list_files' input.
type ListFilesInput struct {
	Session    string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path       string `json:"path,omitempty" jsonschema:"directory relative to the session workspace; default the workspace itself"`
	Recursive  bool   `json:"recursive,omitempty" jsonschema:"list subdirectories too, down to depth (default 16 when recursive)"`
	Depth      int    `json:"depth,omitempty" jsonschema:"levels to list: 1 (default) is the directory's own entries, 2 adds theirs, … at most 16"`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"return at most this many entries (default 1000, at most 10000); truncated says when there were more"`
}

// FileList is list_files' output.
type FileList struct {
	Session   string            `json:"session"`
	Path      string            `json:"path" jsonschema:"the directory listed, workspace-relative"`
	Entries   []workspace.Entry `json:"entries" jsonschema:"sorted by path; a directory's entries follow it"`
	Truncated bool              `json:"truncated" jsonschema:"there were more entries than max_entries"`
	Skipped   []string          `json:"skipped,omitempty" jsonschema:"directories not descended into, and why"`
}

// Text is one line per entry.
func (l *FileList) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d entries", l.Path, len(l.Entries))
	if l.Truncated {
		b.WriteString(" (truncated: there are more; list a subdirectory, or raise max_entries)")
	}
	b.WriteString("\n")
	for _, e := range l.Entries {
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "%s/\n", e.Path)
		case "symlink":
			fmt.Fprintf(&b, "%s -> %s\n", e.Path, e.Target)
		case "file":
			fmt.Fprintf(&b, "%s  %s  %s\n", e.Path, workspace.Human(e.Size), e.Mode)
		default:
			fmt.Fprintf(&b, "%s  (%s)\n", e.Path, e.Type)
		}
	}
	for _, s := range l.Skipped {
		fmt.Fprintf(&b, "not listed: %s\n", s)
	}
	return strings.TrimRight(b.String(), "\n")
}

// CreateProjectInput is create_project's input.
type CreateProjectInput struct {
	Session  string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Template string `json:"template" jsonschema:"python, node or shell"`
	Name     string `json:"name" jsonschema:"the project's directory, relative to the workspace (letters, digits, . _ -; / for subdirectories); must not exist or be empty"`
}

// ProjectCreated is create_project's output.
type ProjectCreated struct {
	Session string `json:"session"`
	project.Project
}

// Text lists the files and how to run the project.
func (p *ProjectCreated) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "created %s project in %s/: %s\n", p.Template, p.Path, strings.Join(p.Files, ", "))
	b.WriteString("run it with:\n")
	for _, r := range p.Run {
		var args strings.Builder
		enc := json.NewEncoder(&args)
		enc.SetEscapeHTML(false) // && stays readable
		// The template's own arguments (strings, numbers, bools) encode.
		_ = enc.Encode(r.Args)
		fmt.Fprintf(&b, "- %s: %s %s", r.What, r.Capability, strings.TrimSpace(args.String()))
		if r.Expect != "" {
			fmt.Fprintf(&b, " (prints %s)", r.Expect)
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

const maxListEntries = 10000

func (a *App) registerFiles(reg *capability.Registry) {
	maxRead, maxWrite := workspace.Human(workspace.DefaultMaxRead), workspace.Human(workspace.DefaultMaxWrite)
	paths := "Paths are relative to the session workspace /home/user (the working directory of run_code and the terminal), or absolute. " +
		"In the workspace, '..' out of it and symbolic links that point out of it (or are absolute, in the middle of a path) are refused. " +
		"Any other absolute path (/tmp/x, a directory the session's code made) is the session box's own, reached as the session's user: what its code may read or write there, nothing more. "
	reg.Register(capability.New("read_file",
		"Read a file of the session workspace. UTF-8 text comes back as text (encoding utf-8); anything else (invalid UTF-8, NUL bytes) as base64 (encoding base64), "+
			"and a whole image file (PNG, JPEG, GIF, WebP, SVG) also as an image where the client shows images (MCP), with media_type, width and height. "+
			"Also returns size, mode and mtime. "+paths+
			"At most "+maxRead+" come back at once: for a bigger file pass offset and limit (bytes) to read a part; complete says whether content is the whole file "+
			"(a part cut inside a multi-byte character comes back as base64). A directory is an error: use list_files.",
		capability.ScopeRead, a.readFile).InSession(capability.UseHold))
	reg.Register(capability.New("write_file",
		"Write a file in the session workspace: replaces it (atomically: readers see the old or the new content, never a part), or with append=true adds to its end. "+
			"Missing parent directories are created. content is text, or base64 with encoding=base64 for bytes. At most "+maxWrite+" per call (append more in further calls). "+
			"New files get mode 0644 (an existing file keeps its mode) and belong to the session, so its code can change them. "+paths+
			"A symbolic link inside the workspace is written through.",
		capability.ScopeExec, a.writeFile).InSession(capability.UseHold))
	reg.Register(capability.New("list_files",
		"List a directory of the session workspace (default the workspace itself): each entry's name, path, type (file, dir, symlink, other), size, mode and mtime, sorted by path. "+
			"By default one level; recursive=true (or depth) goes deeper. At most max_entries (default 1000) come back, with truncated=true when there were more. "+
			"Symbolic links are shown with their target and never followed. The workspace's .quro directory (the server's cut outputs and logs) is shown but not descended into unless you list it by path. "+
			paths,
		capability.ScopeRead, a.listFiles).InSession(capability.UseHold))
	reg.Register(capability.New("create_project",
		"Create a small runnable starter project in a new directory of the session workspace, from a template: "+
			"python (main.py, test_main.py, README.md), node (package.json, index.js, greet.js, test.js, README.md: CommonJS that both node and run_js_file run) or shell (run.sh, executable, README.md). "+
			"The result lists the files and the exact capability calls that run it and its tests. An existing non-empty directory (or file) of that name is refused.",
		capability.ScopeExec, a.createProject).InSession(capability.UseHold))
}

// openWorkspace opens the workspace of the session the call entered its workspace (see
// openSessionFS).
func (a *App) openWorkspace(ctx context.Context) (*session.Session, *workspace.FS, error) {
	sess, err := entered(ctx)
	if err != nil {
		return nil, nil, err
	}
	_, w, err := a.openSessionFS(sess)
	if err != nil {
		return nil, nil, err
	}
	return sess, w, nil
}

func (a *App) readFile(ctx context.Context, in ReadFileInput) (*FileContent, error) {
	if in.Path == "" {
		return nil, capability.Errorf(capability.InvalidArgument, "path is empty: name a file (list_files shows what there is)")
	}
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	if ws, ok := w.(*workspace.FS); ok && in.Open {
		f, c, err := ws.Open(in.Path)
		if err != nil {
			return nil, readError(err, ws)
		}
		// The session's end closes the file: a send in progress then
		// ends within its current piece (its client sees a cut body).
		unhook := a.lives.OnEnd(sess.ID, func() { f.Close() })
		release := func() { unhook(); f.Close() }
		return &FileContent{Session: sess.ID, Path: c.Path, Size: c.Size, Mode: fmt.Sprintf("%04o", c.Mode), ModTime: c.ModTime, Encoding: "base64", File: f, Release: release}, nil
	}
	c, err := w.Read(in.Path, in.Offset, in.Limit)
	if err != nil {
		return nil, readError(err, w)
	}
	out := &FileContent{
		Session: sess.ID, Path: c.Path, Size: c.Size, Offset: c.Offset, Length: int64(len(c.Data)),
		Complete: c.Complete, Mode: fmt.Sprintf("%04o", c.Mode), ModTime: c.ModTime, Encoding: "utf-8",
	}
	if c.Text {
		out.Content = string(c.Data)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(c.Data)
	}
	if c.Complete && c.Offset == 0 {
		if img, ok := picture.Sniff(c.Data); ok {
			out.MediaType, out.Width, out.Height = img.MIME, img.Width, img.Height
		}
	}
	return out, nil
}

// readError says what to do instead of a failed read.
func readError(err error, w fileOps) error {
	switch {
	case errors.Is(err, workspace.ErrIsDir):
		return fmt.Errorf("%w: list_files lists a directory", err)
	case errors.Is(err, workspace.ErrTooLarge):
		return fmt.Errorf("%w; read it in parts with offset and limit (limit at most %d), or process it with run_code", err, w.Options().MaxRead)
	}
	return err
}

// Image is the file's bytes when it is a whole image, for an access path
// that shows images (MCP's image content).
func (c *FileContent) Image() (data []byte, mime string, ok bool) {
	if c.MediaType == "" {
		return nil, "", false
	}
	if c.Encoding != "base64" {
		return []byte(c.Content), c.MediaType, true
	}
	b, err := base64.StdEncoding.DecodeString(c.Content)
	return b, c.MediaType, err == nil
}

func (a *App) writeFile(ctx context.Context, in WriteFileInput) (*FileWritten, error) {
	if in.Path == "" {
		return nil, capability.Errorf(capability.InvalidArgument, "path is empty: name the file to write")
	}
	data := []byte(in.Content)
	switch strings.ToLower(in.Encoding) {
	case "", "utf-8", "utf8", "text":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, capability.Errorf(capability.InvalidArgument, "content is not valid base64: %v", err)
		}
	default:
		return nil, capability.Errorf(capability.InvalidArgument, "encoding %q: use utf-8 (the default) or base64", in.Encoding)
	}
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	var res *workspace.Written
	switch ws, inWorkspace := w.(*workspace.FS); {
	case in.Metadata != nil && in.Append:
		return nil, capability.Errorf(capability.InvalidArgument, "metadata goes with a replacement, not append: write the file with its metadata first, then append")
	case in.Metadata != nil && !inWorkspace:
		return nil, capability.Errorf(capability.InvalidArgument, "metadata is kept for files under %s only: write %s without it, or under %s", hostpath.Home, in.Path, hostpath.Home)
	case in.Metadata != nil:
		res, err = ws.WriteMetadata(in.Path, data, in.Metadata)
	default:
		res, err = w.Write(in.Path, data, in.Append)
	}
	if err != nil {
		return nil, err
	}
	return &FileWritten{
		Session: sess.ID, Path: res.Path, Wrote: res.Wrote, Size: res.Size, Created: res.Created,
		Append: in.Append, Mode: fmt.Sprintf("%04o", res.Mode),
	}, nil
}

func (a *App) listFiles(ctx context.Context, in ListFilesInput) (*FileList, error) {
	if in.Depth < 0 || in.Depth > workspace.MaxDepth {
		return nil, capability.Errorf(capability.InvalidArgument, "depth must be between 1 and %d", workspace.MaxDepth)
	}
	if in.MaxEntries < 0 || in.MaxEntries > maxListEntries {
		return nil, capability.Errorf(capability.InvalidArgument, "max_entries must be between 1 and %d", maxListEntries)
	}
	depth := in.Depth
	if depth == 0 && in.Recursive {
		depth = workspace.MaxDepth
	}
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	l, err := w.List(in.Path, workspace.ListOptions{Depth: depth, MaxEntries: in.MaxEntries})
	if errors.Is(err, workspace.ErrNotDir) {
		return nil, fmt.Errorf("%w: read_file reads a file", err)
	}
	if err != nil {
		return nil, err
	}
	return &FileList{Session: sess.ID, Path: l.Path, Entries: l.Entries, Truncated: l.Truncated, Skipped: l.Skipped}, nil
}

func (a *App) createProject(ctx context.Context, in CreateProjectInput) (*ProjectCreated, error) {
	sess, w, err := a.openWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	p, err := project.Create(w, in.Template, in.Name)
	if err != nil {
		return nil, err
	}
	p.InSession(sess.ID)
	return &ProjectCreated{Session: sess.ID, Project: *p}, nil
}
