package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quro-dev/quro/internal/boxfs"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/hostpath"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/workspace"
)

// The file operations beyond read, write and list (stat_file, make_dir,
// move_file, remove_file, watch_dir): Quro's own, and what E2B's
// filesystem API (internal/api/e2b) calls.

// PathInput names one path of a session workspace.
type PathInput struct {
	Session string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path    string `json:"path" jsonschema:"path relative to the session workspace /home/user, or absolute (outside /home/user: the session box's own path, such as /tmp/x)"`
}

// FileInfo is stat_file's, make_dir's and move_file's output.
type FileInfo struct {
	Session string           `json:"session"`
	Entry   *workspace.Entry `json:"entry"`
	Existed bool             `json:"existed,omitempty" jsonschema:"make_dir: the directory was already there (nothing was made)"`
}

// Text is one line about the entry.
func (f *FileInfo) Text() string {
	e := f.Entry
	s := fmt.Sprintf("%s: %s %s %s:%s %s, modified %s", e.Path, e.Type, e.Permissions, e.Owner, e.Group,
		workspace.Human(e.Size), e.ModTime.UTC().Format(time.RFC3339))
	if e.Target != "" {
		s += " -> " + e.Target
	}
	if f.Existed {
		s += " (already existed)"
	}
	return s
}

// MoveFileInput is move_file's input.
type MoveFileInput struct {
	Session     string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Source      string `json:"source" jsonschema:"what to move, relative to the session workspace"`
	Destination string `json:"destination" jsonschema:"its new path, relative to the session workspace; missing parent directories are created"`
}

// Removed is remove_file's output.
type Removed struct {
	Session string `json:"session"`
	Path    string `json:"path" jsonschema:"workspace-relative path removed; absolute for a path of the box outside the workspace"`
}

// Text says what went.
func (r *Removed) Text() string { return "removed " + r.Path }

// WatchDirInput is watch_dir's input.
type WatchDirInput struct {
	Session      string `json:"session,omitempty" jsonschema:"session id or name; the default session when omitted"`
	Path         string `json:"path,omitempty" jsonschema:"directory relative to the session workspace; default the workspace itself"`
	Recursive    bool   `json:"recursive,omitempty" jsonschema:"watch subdirectories too, also those made during the watch"`
	IncludeEntry bool   `json:"include_entry,omitempty" jsonschema:"describe what is there in each event (type, size, mode, owner, mtime)"`
	TimeoutMS    int64  `json:"timeout_ms,omitempty" jsonschema:"how long to watch, in milliseconds (default 10000; at most 3600000); a streaming caller may watch until it goes away"`
	MaxEvents    int    `json:"max_events,omitempty" jsonschema:"return at most this many events (default 1000, at most 10000); the watch ends there unless the caller streams"`
}

// Watched is watch_dir's output.
type Watched struct {
	Session   string            `json:"session"`
	Path      string            `json:"path" jsonschema:"the directory watched, workspace-relative"`
	Events    []workspace.Event `json:"events" jsonschema:"the changes in order; name is relative to the watched directory"`
	Truncated bool              `json:"truncated" jsonschema:"there were more events than max_events"`
	Ended     string            `json:"ended,omitempty" jsonschema:"why the watch ended before its time, if it did"`
}

// Text is one line per event.
func (wd *Watched) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d change(s)", wd.Path, len(wd.Events))
	if wd.Truncated {
		b.WriteString(" (truncated: there were more)")
	}
	if wd.Ended != "" {
		b.WriteString("; the watch ended: " + wd.Ended)
	}
	for _, e := range wd.Events {
		fmt.Fprintf(&b, "\n%s %s", e.Type, e.Name)
	}
	return b.String()
}

// Streams watch_dir reports to the context's runcode.OutputFunc: "ready"
// once the watch is in place (a change made after it is reported), then
// one "event" per change: its JSON (a workspace.Event) on one line, so
// that a stream that joins its chunks (the WebSocket) carries NDJSON.
const (
	WatchStreamReady = "ready"
	WatchStreamEvent = "event"
)

// MaxWatchesPerSession bounds the watch_dir calls running at once in one
// session (E2B's watchDir streams and polling watchers are such calls).
// Every watch shares the server's inotify instances (workspace.Hub),
// which also caps the watches and watched directories of each tenant and
// of the server (Limits.Watch), well under the host's inotify limits.
const MaxWatchesPerSession = 8

// watchSlots counts the watch_dir calls running per session.
type watchSlots struct {
	mu sync.Mutex
	n  map[string]int
}

// take holds one of session id's watch slots; release gives it back.
// False when the session holds them all.
func (ws *watchSlots) take(id string) (release func(), ok bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.n[id] >= MaxWatchesPerSession {
		return nil, false
	}
	if ws.n == nil {
		ws.n = map[string]int{}
	}
	ws.n[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			ws.mu.Lock()
			defer ws.mu.Unlock()
			if ws.n[id]--; ws.n[id] <= 0 {
				delete(ws.n, id)
			}
		})
	}, true
}

const (
	defaultWatchTimeout = 10 * time.Second
	maxWatchTimeout     = time.Hour
	defaultWatchEvents  = 1000
	maxWatchEvents      = 10000
)

func (a *App) registerFSOps(reg *capability.Registry) {
	paths := "Paths are relative to the session workspace /home/user, or absolute. " +
		"In the workspace, '..' out of it and symbolic links that point out of it are refused. " +
		"Any other absolute path (/tmp/x, a directory the session's code made) is the session box's own, reached as the session's user: what its code may do there, nothing more. "
	reg.Register(capability.New("stat_file",
		"Describe one path of the session workspace without reading it: name, type (file, dir, symlink, other), size, permissions (as ls -l shows them), "+
			"owner and group (as the session's box names them), mtime, and for a symbolic link its target (the link itself is described, not followed). "+paths,
		capability.ScopeRead, a.statFile).InSession(capability.UseHold))
	reg.Register(capability.New("make_dir",
		"Create a directory in the session workspace, with its missing parents (mkdir -p), owned by the session so its code can use it. "+
			"A directory already there is no error: existed=true says nothing was made. "+paths,
		capability.ScopeExec, a.makeDir).InSession(capability.UseHold))
	reg.Register(capability.New("move_file",
		"Move or rename a file, directory or symbolic link within the session workspace (rename: what is at the destination, a file or an empty directory, is replaced). "+
			"Missing parent directories of the destination are created. A symbolic link is moved itself, never what it points to. "+paths,
		capability.ScopeExec, a.moveFile).InSession(capability.UseHold))
	reg.Register(capability.New("remove_file",
		"Remove a file, a symbolic link (never what it points to) or a directory with everything in it from the session workspace. The workspace itself cannot be removed. "+paths,
		capability.ScopeExec, a.removeFile).InSession(capability.UseHold))
	reg.Register(capability.New("watch_dir",
		"Watch a directory of the session workspace and return the changes made in it meanwhile (by the session's code or by file calls): "+
			"each event's name (relative to the directory) and type: create, write, remove, rename (moved away) or chmod (mode, owner or times changed). "+
			"recursive=true watches subdirectories too; include_entry=true describes what is there in each event. "+
			"The watch lasts timeout_ms (default 10 s) or until max_events changes; a streaming caller (WebSocket, E2B's watchDir) gets each event as it happens and may watch until it goes away. "+
			"It ends early when the directory is removed (as when the session is destroyed). Symbolic links are never followed. "+
			"A session runs at most "+strconv.Itoa(MaxWatchesPerSession)+" watches at once (streaming or not); a tenant, and the server, at most as many watches and watched directories as get_service_status shows (watches); another is refused, resource_exhausted naming the cap, until one ends. "+paths,
		capability.ScopeRead, a.watchDir).Streaming().InSession(capability.UseHold))
}

// boxNames names owners as the session's box does: its /etc/passwd has
// root, the account of the user code (sandbox.UserName) and nobody, which
// every other id shows as in the box's user namespace.
func boxNames(sessionUID int) workspace.Names {
	name := func(id uint32) string {
		switch {
		case int(id) == sessionUID:
			return sandbox.UserName
		case id == 0:
			return "root"
		}
		return "nobody"
	}
	return func(uid, gid uint32) (string, string) { return name(uid), name(gid) }
}

// openSessionFS opens the session's workspace: with the session's uid as
// the owner of what the server creates, as sandbox.Start hands the
// workspace over (a root server's runs go under the session's own uid,
// session.Session.UID), and owners named as the session's box names them.
func (a *App) openSessionFS(sess *session.Session) (string, *workspace.FS, error) {
	opts := workspace.Options{}
	uid := os.Geteuid()
	if uid == 0 {
		uid = sess.UID
		opts.Owner = &workspace.Owner{UID: uid, GID: uid}
	}
	opts.Names = boxNames(uid)
	w, err := workspace.Open(sess.Workspace(), opts)
	if err != nil {
		return "", nil, err
	}
	return sess.ID, w, nil
}

func needPath(p, what string) error {
	if p == "" {
		return capability.Errorf(capability.InvalidArgument, "%s is empty: name a path in the session workspace (list_files shows what there is)", what)
	}
	return nil
}

func (a *App) statFile(ctx context.Context, in PathInput) (*FileInfo, error) {
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	id := sess.ID
	e, err := w.Info(in.Path)
	if err != nil {
		return nil, err
	}
	return &FileInfo{Session: id, Entry: e}, nil
}

func (a *App) makeDir(ctx context.Context, in PathInput) (*FileInfo, error) {
	if err := needPath(in.Path, "path"); err != nil {
		return nil, err
	}
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	id := sess.ID
	e, existed, err := w.MakeDir(in.Path)
	if err != nil {
		return nil, err
	}
	return &FileInfo{Session: id, Entry: e, Existed: existed}, nil
}

func (a *App) moveFile(ctx context.Context, in MoveFileInput) (*FileInfo, error) {
	if err := needPath(in.Source, "source"); err != nil {
		return nil, err
	}
	if err := needPath(in.Destination, "destination"); err != nil {
		return nil, err
	}
	sess, w, done, err := a.openFiles(ctx, in.Source, in.Destination)
	if err != nil {
		return nil, err
	}
	defer done()
	id := sess.ID
	e, err := w.Move(in.Source, in.Destination)
	if err != nil {
		return nil, err
	}
	return &FileInfo{Session: id, Entry: e}, nil
}

func (a *App) removeFile(ctx context.Context, in PathInput) (*Removed, error) {
	if err := needPath(in.Path, "path"); err != nil {
		return nil, err
	}
	sess, w, done, err := a.openFiles(ctx, in.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	id := sess.ID
	rel, err := w.Remove(in.Path)
	if err != nil {
		return nil, err
	}
	return &Removed{Session: id, Path: rel}, nil
}

func (a *App) watchDir(ctx context.Context, in WatchDirInput) (*Watched, error) {
	if in.TimeoutMS < 0 || time.Duration(in.TimeoutMS)*time.Millisecond > maxWatchTimeout {
		return nil, capability.Errorf(capability.InvalidArgument, "timeout_ms must be between 1 and %d", maxWatchTimeout.Milliseconds())
	}
	if in.MaxEvents < 0 || in.MaxEvents > maxWatchEvents {
		return nil, capability.Errorf(capability.InvalidArgument, "max_events must be between 1 and %d", maxWatchEvents)
	}
	if in.MaxEvents == 0 {
		in.MaxEvents = defaultWatchEvents
	}
	observe := runcode.OutputFrom(ctx)
	timeout := time.Duration(in.TimeoutMS) * time.Millisecond
	if timeout == 0 && observe == nil {
		timeout = defaultWatchTimeout
	}
	sess, err := entered(ctx)
	if err != nil {
		return nil, err
	}
	free, ok := a.watches.take(sess.ID)
	if !ok {
		return nil, capability.Errorf(capability.ResourceExhausted,
			"session %s has %d watches running, the most one session may have: end one first (cancel a streaming watch_dir, stop() an E2B watch handle, RemoveWatcher)",
			sess.Name, MaxWatchesPerSession)
	}
	defer free()
	// A call in flight in the session: destroying the session ends the
	// watch (and its hold on the workspace) before the workspace goes.
	id, w, err := a.openSessionFS(sess)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if timeout > 0 {
		wctx, cancel = context.WithTimeout(wctx, timeout)
		defer cancel()
	}
	rel, err := w.Rel(in.Path)
	if errors.Is(err, workspace.ErrOutside) && boxfs.IsBoxPath(in.Path) {
		return nil, capability.Errorf(capability.InvalidArgument,
			"%s: watch_dir watches the session workspace %s and what is under it; other directories of the box are not watched (poll them with list_files, or watch from a command such as inotifywait)", path.Clean(in.Path), hostpath.Home)
	}
	if err != nil {
		return nil, err
	}
	out := &Watched{Session: id, Path: rel, Events: []workspace.Event{}}
	o := workspace.WatchOptions{Recursive: in.Recursive, IncludeEntry: in.IncludeEntry, Hub: a.watchHub, Tenant: sess.Tenant}
	if observe != nil {
		o.Ready = func() { observe(WatchStreamReady, nil) }
	}
	err = w.Watch(wctx, in.Path, o, func(e workspace.Event) {
		if observe != nil {
			if b, err := json.Marshal(e); err == nil {
				observe(WatchStreamEvent, append(b, '\n'))
			}
		}
		if len(out.Events) >= in.MaxEvents {
			out.Truncated = true
			if observe == nil {
				cancel()
			}
			return
		}
		out.Events = append(out.Events, e)
	})
	switch {
	case errors.Is(err, workspace.ErrWatchEnded), errors.Is(err, workspace.ErrOverflow):
		out.Ended = err.Error()
	case err != nil:
		return nil, err
	case ctx.Err() != nil:
		// The session was destroyed: say so. Else the caller went away,
		// and what was seen is still the answer.
		if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
			return nil, cause
		}
	}
	return out, nil
}
