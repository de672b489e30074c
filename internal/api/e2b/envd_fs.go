package e2b

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem/filesystemconnect"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/workspace"
)

// envd's filesystem: filesystem.Filesystem over Connect-RPC, GET and POST
// /files, GET /health. Every operation is a capability call (stat_file,
// make_dir, move_file, list_files, remove_file, watch_dir, read_file,
// write_file) as the sandbox's caller, so it reaches only that session.
//
// Paths: E2B's /home/user (the sandbox user's home and working
// directory) is the session workspace; "/home/user/<rel>", "~/<rel>" and
// relative paths name <rel> in it (internal/workspace), and answers carry
// /home/user/<rel> back. Any other absolute path is the sandbox's own
// (/tmp/x), served in the session's box as its user (internal/boxfs), as
// envd serves it from inside the sandbox; watches reach only the
// workspace.

// Home is where E2B's paths see the session workspace.
const Home = "/home/user"

// The transfer bounds of /files: bytes move to and from the workspace in
// chunks of transferChunk (one read_file or write_file call each, under
// their 8 MiB bound), a file of at most maxTransfer.
const (
	transferChunk = 4 << 20
	maxTransfer   = 1 << 30
	sendChunk     = 1 << 20 // the gzip stream of a download leaves in pieces this big
)

// Bounds of the polling watchers (CreateWatcher, the Python SDK's
// watch_dir): per sandbox (running or ended with events still to poll;
// watch_dir itself bounds the watches running in a session, WatchDir
// streams and polling watchers together, to as many, and those of a
// tenant and of the server), and events kept between two polls.
const (
	maxWatchersPerSandbox = 8
	maxWatcherEvents      = 10000
	watcherLinger         = time.Minute // an ended watcher's events wait this long for a poll
)

// DefaultWatcherIdle is how long a polling watcher lives without a poll
// (Options.WatcherIdle): the SDK polls each time its caller asks for new
// events, so a watcher nobody asks about for a minute is taken to be
// forgotten, and its watch ends (the next poll says so).
const DefaultWatcherIdle = time.Minute

// toWorkspace maps an E2B path to what the file capabilities take: a
// workspace-relative path for /home/user and under it (and relative
// paths, taken from there), the clean absolute path for any other path
// of the box (its /tmp, /app, …), which the capabilities serve inside the
// sandbox as its user (internal/boxfs).
func toWorkspace(p string) (string, error) {
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = Home + p[1:]
	}
	if !strings.HasPrefix(p, "/") {
		if p == "" {
			return ".", nil
		}
		return p, nil // relative: taken from the home, the workspace (which refuses ".." out)
	}
	c := path.Clean(p)
	if c == Home {
		return ".", nil
	}
	if rest, ok := strings.CutPrefix(c, Home+"/"); ok {
		return rest, nil
	}
	return c, nil
}

// fromWorkspace is the E2B path of what the file capabilities answer: a
// workspace-relative path is under /home/user, an absolute one is the
// box's own.
func fromWorkspace(rel string) string {
	if rel == "" || rel == "." {
		return Home
	}
	if path.IsAbs(rel) {
		return rel
	}
	return Home + "/" + rel
}

// entryInfo is a workspace entry as envd's EntryInfo.
func entryInfo(e *workspace.Entry) *filesystem.EntryInfo {
	perm, _ := strconv.ParseUint(e.Mode, 8, 32)
	mode := fs.FileMode(perm)
	name := e.Name
	if e.Path == "." || e.Path == "" {
		name = path.Base(Home) // the home itself
	} else if e.Path == "/" {
		name = "/"
	}
	out := &filesystem.EntryInfo{
		Name: name, Path: fromWorkspace(e.Path), Size: e.Size,
		Permissions: e.Permissions, Owner: e.Owner, Group: e.Group, Metadata: e.Metadata,
	}
	switch e.Type {
	case "file":
		out.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		out.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		out.Size = dirSize(e.Size)
	case "symlink":
		// As envd: a link's type is its target's (file or directory;
		// unspecified when it dangles, or leads where Quro's file API
		// does not reach), never FILE_TYPE_SYMLINK (the SDKs' own tests
		// expect a link to a file to be a file; the Python SDK before
		// 2.45 maps no symlink type). symlinkTarget says it is a link,
		// and its size is lstat's (the target's length).
		switch e.TargetType {
		case "file":
			out.Type = filesystem.FileType_FILE_TYPE_FILE
		case "dir":
			out.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		}
		t := linkTarget(out.Path, e.Target)
		out.SymlinkTarget = &t
		out.Size = int64(len(e.Target))
	}
	out.Mode = uint32(mode.Perm()) // as envd: the permission bits only (0o644, 0o755)
	if !e.ModTime.IsZero() {
		out.ModifiedTime = timestamppb.New(e.ModTime)
	}
	return out
}

// dirBlock is the block of the ext4 disk E2B's sandboxes run on.
const dirBlock = 4096

// dirSize is a directory's size as envd reports it on E2B's ext4 disk:
// whole blocks, at least one (an empty directory is 4096), where stat on
// another filesystem says less (btrfs, a session disk, counts the bytes of
// the names in it: 0 for an empty directory). The SDKs' own tests take a
// directory's size above 0 as given.
func dirSize(n int64) int64 {
	return max(dirBlock, (n+dirBlock-1)/dirBlock*dirBlock)
}

// linkTarget is a symbolic link's target as the box sees it, as envd
// answers it: an absolute path, a relative target taken from the link's
// directory (a link /home/user/l to f.txt: /home/user/f.txt). It is only
// text: nothing is followed or opened.
func linkTarget(link, target string) string {
	if target == "" || path.IsAbs(target) {
		return target
	}
	return path.Join(path.Dir(link), target)
}

type fsService struct {
	s        *Server
	watchers *watchers
}

// envdFSRoutes serves envd's filesystem.Filesystem (Connect-RPC), GET and
// POST /files and GET /health.
func (s *Server) envdFSRoutes(m *http.ServeMux) {
	f := &fsService{s: s, watchers: &watchers{byID: map[string]*pollWatcher{}}}
	p, h := filesystemconnect.NewFilesystemHandler(f, s.envdHandlerOptions()...)
	m.Handle(p, h)
	m.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		drain(r)
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("/files", func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			f.download(w, r)
		case http.MethodPost:
			f.upload(w, r)
		default:
			drain(r)
			s.unsupported(w, r.Method+" /files of envd (GET downloads, POST uploads)")
		}
	})
}

// rpcUser refuses an envd user other than the sandbox's own.
func (f *fsService) rpcUser(h http.Header) error { return f.s.checkUser(h) }

func (f *fsService) rpcPath(h http.Header, p string) (string, error) {
	if err := f.rpcUser(h); err != nil {
		return "", err
	}
	rel, err := toWorkspace(p)
	if err != nil {
		return "", rpcError(err)
	}
	return rel, nil
}

// entryCall calls stat_file, make_dir or move_file, whose output
// describes one entry.
func (f *fsService) entryCall(ctx context.Context, name string, in any) (*app.FileInfo, error) {
	out, err := invoke[*app.FileInfo](ctx, f.s, name, in)
	if err != nil {
		return nil, rpcError(err)
	}
	if out.Entry == nil {
		return nil, rpcErrorf(connect.CodeInternal, name+" described nothing")
	}
	return out, nil
}

func (f *fsService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	out, err := f.entryCall(ctx, "stat_file", app.PathInput{Session: sandboxOf(ctx), Path: rel})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(out.Entry)}), nil
}

func (f *fsService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	out, err := f.entryCall(ctx, "make_dir", app.PathInput{Session: sandboxOf(ctx), Path: rel})
	if err != nil {
		return nil, err
	}
	if out.Existed {
		// envd's answer, which the SDKs turn into makeDir() == false.
		return nil, rpcErrorf(connect.CodeAlreadyExists, "directory "+fromWorkspace(out.Entry.Path)+" already exists")
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(out.Entry)}), nil
}

func (f *fsService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	src, err := f.rpcPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := f.rpcPath(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	out, err := f.entryCall(ctx, "move_file", app.MoveFileInput{Session: sandboxOf(ctx), Source: src, Destination: dst})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(out.Entry)}), nil
}

// maxListEntries is list_files' own bound: a listing with more is
// refused rather than cut short.
const maxListEntries = 10000

func (f *fsService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(min(req.Msg.GetDepth(), 1<<16))
	if depth == 0 {
		depth = 1
	}
	out, err := invoke[*app.FileList](ctx, f.s, "list_files", app.ListFilesInput{Session: sandboxOf(ctx), Path: rel, Depth: depth, MaxEntries: maxListEntries})
	if err != nil {
		return nil, rpcError(err)
	}
	if out.Truncated {
		return nil, rpcErrorf(connect.CodeResourceExhausted, fmt.Sprintf(
			"%s has more than %d entries down to depth %d, more than Quro %s lists at once: list a subdirectory, or with a smaller depth",
			fromWorkspace(rel), maxListEntries, depth, f.s.version()))
	}
	res := &filesystem.ListDirResponse{Entries: make([]*filesystem.EntryInfo, 0, len(out.Entries))}
	for i := range out.Entries {
		res.Entries = append(res.Entries, entryInfo(&out.Entries[i]))
	}
	return connect.NewResponse(res), nil
}

func (f *fsService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// envd removes with os.RemoveAll: a path already gone is no error (the
	// SDKs' files.remove of a missing file succeeds). Quro's remove_file
	// says not_found, which is dropped here.
	if _, err := invoke[*app.Removed](ctx, f.s, "remove_file", app.PathInput{Session: sandboxOf(ctx), Path: rel}); err != nil && asCapError(err).Code != capability.NotFound {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

var eventTypes = map[string]filesystem.EventType{
	"create": filesystem.EventType_EVENT_TYPE_CREATE,
	"write":  filesystem.EventType_EVENT_TYPE_WRITE,
	"remove": filesystem.EventType_EVENT_TYPE_REMOVE,
	"rename": filesystem.EventType_EVENT_TYPE_RENAME,
	"chmod":  filesystem.EventType_EVENT_TYPE_CHMOD,
}

// eventProto is a watch_dir event as envd's FilesystemEvent.
func eventProto(e *workspace.Event) *filesystem.FilesystemEvent {
	ev := &filesystem.FilesystemEvent{Name: e.Name, Type: eventTypes[e.Type]}
	if e.Entry != nil {
		ev.Entry = entryInfo(e.Entry)
	}
	return ev
}

// watchRun is one watch_dir call in the background, its reports handed
// over a bounded channel (an observer must not block: a consumer that
// falls behind by more than the channel ends the watch, overflowed).
type watchRun struct {
	reports  chan report
	done     chan error    // the call's error, once
	ended    string        // watch_dir's Ended, once done has its error
	overflow chan struct{} // closed when reports overflowed
	once     sync.Once
}

type report struct {
	ready bool
	event *workspace.Event
}

// startWatch starts watch_dir as ctx's caller; the watch ends with ctx.
func (f *fsService) startWatch(ctx context.Context, in app.WatchDirInput) *watchRun {
	ctx, cancel := context.WithCancel(ctx)
	wr := &watchRun{reports: make(chan report, 4096), done: make(chan error, 1), overflow: make(chan struct{})}
	observe := func(stream string, p []byte) {
		var r report
		switch stream {
		case app.WatchStreamReady:
			r.ready = true
		case app.WatchStreamEvent:
			// The stream carries each event's JSON (app.WatchStreamEvent).
			var e workspace.Event
			if json.Unmarshal(p, &e) != nil {
				return
			}
			r.event = &e
		default:
			return
		}
		select {
		case wr.reports <- r:
		default:
			wr.once.Do(func() { close(wr.overflow) })
			cancel()
		}
	}
	go func() {
		defer cancel()
		out, err := invoke[*app.Watched](runcode.WithOutput(ctx, observe), f.s, "watch_dir", in)
		if err == nil {
			wr.ended = out.Ended
		}
		wr.done <- err
	}()
	return wr
}

// wait waits for the call's end and returns its error.
func (wr *watchRun) wait() error { return <-wr.done }

// endError is why a watch that ran ended by itself (nil: its caller went).
func (wr *watchRun) endError(err error) error {
	select {
	case <-wr.overflow:
		return rpcErrorf(connect.CodeResourceExhausted, "the watch ended: changes came faster than they were read and some would have been lost; watch a smaller directory")
	default:
	}
	if err != nil {
		return rpcError(err)
	}
	if wr.ended != "" {
		return rpcErrorf(connect.CodeNotFound, wr.ended)
	}
	return nil
}

func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wr := f.startWatch(ctx, app.WatchDirInput{Session: sandboxOf(ctx), Path: rel, Recursive: req.Msg.GetRecursive(), IncludeEntry: req.Msg.GetIncludeEntry()})
	tick := time.NewTicker(keepaliveInterval(req.Header()))
	defer tick.Stop()
	started := false
	send := func(r report) error {
		if r.ready {
			started = true
			return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}) //nolint:protogetter // building a message
		}
		tick.Reset(keepaliveInterval(req.Header()))
		return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: eventProto(r.event)}})
	}
	for {
		select {
		case r := <-wr.reports:
			if err := send(r); err != nil {
				cancel()
				_ = wr.wait()
				return err
			}
		case err := <-wr.done:
			for { // what was reported before the end goes out first
				select {
				case r := <-wr.reports:
					if serr := send(r); serr != nil {
						return serr
					}
					continue
				default:
				}
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			if !started && err == nil {
				return rpcErrorf(connect.CodeInternal, "the watch ended before it started")
			}
			return wr.endError(err)
		case <-tick.C:
			if started {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
					cancel()
					_ = wr.wait()
					return err
				}
			}
		}
	}
}

// watchers are the polling watchers of every sandbox (CreateWatcher):
// a watch_dir call each, detached from the request that made it, running
// until RemoveWatcher, its directory goes or its sandbox is killed (the
// destroy cancels the calls in the session), it overflows, or no poll
// came for Options.WatcherIdle.
type watchers struct {
	mu   sync.Mutex
	byID map[string]*pollWatcher
}

type pollWatcher struct {
	sandbox string
	cancel  context.CancelFunc
	idle    *time.Timer   // ends the watch when no poll came for Options.WatcherIdle
	stopped chan struct{} // closed once its watch has ended
	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	ended   error // why it ended, once it did
	done    bool
}

func (f *fsService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	rel, err := f.rpcPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	sb := sandboxOf(ctx)
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	pw := &pollWatcher{sandbox: sb, cancel: cancel, stopped: make(chan struct{})}
	idle := f.s.opts.WatcherIdle
	pw.idle = time.AfterFunc(idle, func() {
		pw.mu.Lock()
		if pw.ended == nil {
			pw.ended = rpcErrorf(connect.CodeNotFound, fmt.Sprintf(
				"the watcher expired: it was not polled (GetWatcherEvents) for %s, and Quro %s ends a watcher left that long", idle, f.s.version()))
		}
		pw.mu.Unlock()
		cancel()
	})
	f.watchers.mu.Lock()
	n := 0
	for _, w := range f.watchers.byID {
		if w.sandbox == sb {
			n++
		}
	}
	if n >= maxWatchersPerSandbox {
		f.watchers.mu.Unlock()
		pw.idle.Stop()
		cancel()
		return nil, rpcErrorf(connect.CodeResourceExhausted, fmt.Sprintf(
			"this sandbox has %d watchers, the most Quro %s keeps: remove one (RemoveWatcher, or stop() the watch handle) first", n, f.s.version()))
	}
	f.watchers.byID[id] = pw
	f.watchers.mu.Unlock()

	wr := f.startWatch(wctx, app.WatchDirInput{Session: sb, Path: rel, Recursive: req.Msg.GetRecursive(), IncludeEntry: req.Msg.GetIncludeEntry()})
	// Wait until the watch is in place (or failed): changes made after
	// CreateWatcher returns are reported.
	select {
	case r := <-wr.reports:
		if !r.ready {
			pw.add(r.event)
		}
	case err := <-wr.done:
		f.watchers.drop(id)
		cancel()
		if err == nil {
			err = wr.endError(nil)
		}
		if err == nil {
			err = rpcErrorf(connect.CodeInternal, "the watch ended before it started")
		}
		return nil, rpcError(err)
	}
	go func() {
		for {
			select {
			case r := <-wr.reports:
				if r.event != nil && !pw.add(r.event) {
					cancel()
				}
			case err := <-wr.done:
				for {
					select {
					case r := <-wr.reports:
						if r.event != nil {
							pw.add(r.event)
						}
						continue
					default:
					}
					break
				}
				pw.idle.Stop()
				pw.mu.Lock()
				pw.done = true
				if pw.ended == nil {
					pw.ended = wr.endError(err)
				}
				if pw.ended == nil {
					pw.ended = rpcErrorf(connect.CodeNotFound, "the watcher was removed")
				}
				pw.mu.Unlock()
				close(pw.stopped)
				time.AfterFunc(watcherLinger, func() { f.watchers.drop(id) })
				return
			}
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// add keeps e for the next poll; false when the watcher holds its most.
func (pw *pollWatcher) add(e *workspace.Event) bool {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.events) >= maxWatcherEvents {
		if pw.ended == nil {
			pw.ended = rpcErrorf(connect.CodeResourceExhausted, fmt.Sprintf(
				"the watcher ended: %d events came without a poll and more would have been lost; poll more often (GetWatcherEvents)", maxWatcherEvents))
		}
		return false
	}
	pw.events = append(pw.events, eventProto(e))
	return true
}

func (ws *watchers) drop(id string) {
	ws.mu.Lock()
	w := ws.byID[id]
	delete(ws.byID, id)
	ws.mu.Unlock()
	if w != nil {
		w.idle.Stop()
		w.cancel()
	}
}

// get is watcher id of the request's sandbox (another sandbox's is not
// found).
func (ws *watchers) get(ctx context.Context, id string) (*pollWatcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.byID[id]
	if w == nil || w.sandbox != sandboxOf(ctx) {
		return nil, rpcErrorf(connect.CodeNotFound, "watcher "+strconv.Quote(id)+" not found (removed, ended a minute ago, expired unpolled, or never made in this sandbox)")
	}
	return w, nil
}

func (f *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	if err := f.rpcUser(req.Header()); err != nil {
		return nil, err
	}
	w, err := f.watchers.get(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if !w.done {
		w.idle.Reset(f.s.opts.WatcherIdle)
	}
	events := w.events
	w.events = nil
	done, ended := w.done, w.ended
	w.mu.Unlock()
	if len(events) == 0 && done {
		f.watchers.drop(req.Msg.GetWatcherId())
		return nil, ended
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

func (f *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	if err := f.rpcUser(req.Header()); err != nil {
		return nil, err
	}
	pw, err := f.watchers.get(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	f.watchers.drop(req.Msg.GetWatcherId())
	// Once removed, its watch no longer counts against the session's:
	// a watcher made right after finds the room (the caller's deadline
	// bounds the wait for the watch to end).
	select {
	case <-pw.stopped:
	case <-ctx.Done():
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

// httpUser checks the envd user of a /files request: its username
// parameter, else its Basic auth user.
func (f *fsService) httpUser(w http.ResponseWriter, r *http.Request) bool {
	u := r.URL.Query().Get("username")
	if u == "" {
		u = user(r)
	}
	if msg := f.s.userRefusal(u); msg != "" {
		drain(r)
		writeJSONError(w, http.StatusUnauthorized, msg)
		return false
	}
	return true
}

// writeFileError answers a failed file call; the session's full disk
// (workspace.ErrNoSpace, which the controller's error keeps as its cause)
// is envd's 507 (the SDK's NotEnoughSpaceError).
func writeFileError(w http.ResponseWriter, err error) {
	if controller.NoSpace(err) {
		writeJSONError(w, http.StatusInsufficientStorage, messageOf(err))
		return
	}
	writeError(w, err)
}

// contentBytes are the bytes of read_file's content.
func contentBytes(c *app.FileContent) ([]byte, error) {
	if c.Encoding == "base64" {
		return base64.StdEncoding.DecodeString(c.Content)
	}
	return []byte(c.Content), nil
}

func (f *fsService) readChunk(ctx context.Context, rel string, off int64, open bool) (*app.FileContent, []byte, error) {
	c, err := invoke[*app.FileContent](ctx, f.s, "read_file", app.ReadFileInput{Session: sandboxOf(ctx), Path: rel, Offset: off, Limit: transferChunk, Open: open})
	if err != nil {
		return nil, nil, err
	}
	if c.File != nil {
		return c, nil, nil
	}
	b, err := contentBytes(c)
	if err != nil {
		return nil, nil, capability.Errorf(capability.Internal, "read_file's content: %v", err)
	}
	return c, b, nil
}

// download is GET /files: a regular file of the workspace from the file
// read_file opened (sendFile), any other (a path of the box: its helper
// reads) in chunks.
func (f *fsService) download(w http.ResponseWriter, r *http.Request) {
	if !f.httpUser(w, r) {
		return
	}
	rel, err := toWorkspace(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	c, b, err := f.readChunk(ctx, rel, 0, true)
	if err != nil {
		writeFileError(w, err)
		return
	}
	if c.Release != nil {
		defer c.Release()
	}
	if c.Size > maxTransfer {
		writeJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf(
			"%s is %d bytes, over the %d bytes (1 GiB) Quro %s sends through /files: read it in parts (read_file with offset and limit) or process it with a command in the sandbox",
			fromWorkspace(c.Path), c.Size, int64(maxTransfer), f.s.version()))
		return
	}
	if c.File != nil {
		// The first bytes decide whether the rest is worth compressing.
		b = make([]byte, min(c.Size, gzipSample))
		n, err := c.File.ReadAt(b, 0)
		if err != nil && err != io.EOF {
			var pe *fs.PathError
			if errors.As(err, &pe) { // its path is the file's on the host
				err = pe.Err
			}
			writeFileError(w, capability.Errorf(capability.Internal, "reading %s: %v", fromWorkspace(c.Path), err))
			return
		}
		b = b[:n]
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(c.Path)}))
	var out io.Writer = w
	end := func() error { return nil }
	h.Add("Vary", "Accept-Encoding")
	switch {
	case acceptsGzip(r) && compressible(b):
		h.Set("Content-Encoding", "gzip")
		// The compressor writes a few KiB at a time, and each write
		// would be an HTTP chunk of its own; Node's fetch (the JS SDK)
		// decodes a stream of small chunks very slowly (a 50 MB file in
		// 16 KiB chunks took over 90 s, in 1 MiB chunks 2 s). So the
		// compressed stream goes out in sendChunk pieces.
		bw := bufio.NewWriterSize(w, sendChunk)
		gz, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed) // a valid level: no error
		out = gz
		end = func() error {
			if err := gz.Close(); err != nil {
				return err
			}
			return bw.Flush()
		}
	case c.File != nil:
		h.Set("Content-Length", strconv.FormatInt(c.Size, 10))
	case c.Complete:
		h.Set("Content-Length", strconv.Itoa(len(b)))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if c.File != nil {
		sendFile(out, c)
		_ = end() // an error here is the client gone: nothing to tell it
		return
	}
	off := int64(0)
	for {
		if _, err := out.Write(b); err != nil {
			return // the client went away
		}
		off += int64(len(b))
		if c.Complete || len(b) == 0 || off >= c.Size {
			_ = end() // an error here is the client gone: nothing to tell it
			return
		}
		if off >= maxTransfer {
			panic(http.ErrAbortHandler) // grew past the bound: a cut body, never a silently short file
		}
		p := c.Path
		if c, b, err = f.readChunk(ctx, p, off, false); err != nil {
			f.s.log.Warn("e2b: reading a file on", "path", p, "offset", off, "err", err)
			panic(http.ErrAbortHandler) // the status is out: only a cut body says it failed
		}
	}
}

// sendFile sends the c.Size bytes of c.File, a regular file of the
// workspace as read_file opened it, to out: the response itself (the
// server hands a file to the kernel's copy, sendfile, when nothing
// between them hides it), or the gzip stream. The file is the one
// opened: one renamed over its path meanwhile is not sent, one grown is
// sent as it was (its Content-Length), and one cut short ends the body
// short, which the client sees as a failed read (never a silently short
// file).
func sendFile(out io.Writer, c *app.FileContent) {
	// A LimitedReader of the *os.File itself: what the server's copy
	// hands to sendfile (a SectionReader it would not).
	if n, _ := io.Copy(out, io.LimitReader(c.File, c.Size)); n != c.Size {
		panic(http.ErrAbortHandler) // the client went away, or the file was cut: a cut body
	}
}

// gzipSample is how much of a download's first bytes compressible
// compresses to decide whether the rest is worth compressing.
const gzipSample = 64 << 10

// compressible says whether a download that starts with b is worth
// sending gzip-encoded: its first gzipSample bytes compress to under
// seven eighths. Random bytes, archives, images and other compressed
// data do not, and compressing them costs both ends CPU for nothing
// (Node's fetch, the JS SDK's, took 3.2 times curl's time to read 50 MB
// of random bytes gzip-encoded). A file under 1 KiB is sent as it is.
func compressible(b []byte) bool {
	if len(b) < 1<<10 {
		return false
	}
	sample := b[:min(len(b), gzipSample)]
	var n countWriter
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(&n)
	_, _ = gz.Write(sample) // a countWriter never fails
	_ = gz.Close()
	gz.Reset(io.Discard)
	gzipWriters.Put(gz)
	return int64(n) < int64(len(sample))*7/8
}

// gzipWriters keeps compressible's compressors (each holds ~1 MiB).
var gzipWriters = sync.Pool{New: func() any {
	gz, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed) // a valid level: no error
	return gz
}}

// countWriter counts the bytes written to it.
type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

// acceptsGzip says the request's Accept-Encoding accepts gzip: named
// with a quality (q) over 0, or none (RFC 9110 12.5.3).
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		q := 1.0
		for _, p := range strings.Split(params, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(strings.TrimSpace(k), "q") {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					f = 0 // unreadable: not an acceptance
				}
				q = f
			}
		}
		return q > 0
	}
	return false
}

// writeInfo is one element of POST /files' answer.
type writeInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader prefixes the upload headers that carry file metadata
// (envd 0.6.2): X-Metadata-KEY: VALUE, KEY lowercased.
const metadataHeader = "X-Metadata-"

// uploadMetadata is the file metadata of an upload's headers, as envd
// reads them: each X-Metadata-KEY header's first value under KEY
// lowercased (nil when there is none; write_file checks it).
func uploadMetadata(h http.Header) map[string]string {
	var md map[string]string
	for name, vals := range h {
		k, ok := strings.CutPrefix(name, metadataHeader)
		if !ok || k == "" || len(vals) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(k)] = vals[0]
	}
	return md
}

// errTooBig: an upload over maxTransfer.
var errTooBig = errors.New("too big")

// store writes src to rel in chunks: the first replaces the file, the
// next are appended. A file over one chunk is thus visible in parts while
// it is written (one chunk is atomic).
func (f *fsService) store(ctx context.Context, rel string, src io.Reader, md map[string]string) (*writeInfo, error) {
	write := func(data []byte, appendTo bool) (string, error) {
		in := app.WriteFileInput{Session: sandboxOf(ctx), Path: rel,
			Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64", Append: appendTo}
		if !appendTo {
			in.Metadata = md // the new file carries it; appends keep it
		}
		out, err := invoke[*app.FileWritten](ctx, f.s, "write_file", in)
		if err != nil {
			return "", err
		}
		return out.Path, nil
	}
	// As envd: the file is made (or emptied) first, then written in
	// place, so a watcher sees the writes to it (E2B's watch tests wait
	// for a WRITE of an overwritten file), and a file of any size arrives
	// the same way.
	path0, err := write(nil, false)
	if err != nil {
		return nil, err
	}
	rel = path0 // a link written through: the data goes where the file was made
	buf := make([]byte, transferChunk)
	var total int64
	for {
		n, rerr := io.ReadFull(src, buf)
		if rerr != nil && rerr != io.EOF && rerr != io.ErrUnexpectedEOF {
			return nil, capability.Errorf(capability.InvalidArgument, "reading the upload of %s: %v", fromWorkspace(rel), rerr)
		}
		if n == 0 {
			break
		}
		total += int64(n)
		if total > maxTransfer {
			return nil, errTooBig
		}
		if _, err := write(buf[:n], true); err != nil {
			return nil, err
		}
		if n < len(buf) { // the end of the upload
			break
		}
	}
	info := &writeInfo{Name: path.Base(path0), Type: "file", Path: fromWorkspace(path0)}
	if md != nil {
		// As envd: what the file kept, read back (a filesystem without
		// user xattrs keeps none).
		out, err := invoke[*app.FileInfo](ctx, f.s, "stat_file", app.PathInput{Session: sandboxOf(ctx), Path: path0})
		if err != nil {
			return nil, err
		}
		if out.Entry != nil {
			info.Metadata = out.Entry.Metadata
		}
	}
	return info, nil
}

// upload is POST /files: multipart/form-data (a part named "file" per
// file, its filename the target path) or a raw body with ?path=
// (application/octet-stream, gzip with Content-Encoding: gzip).
func (f *fsService) upload(w http.ResponseWriter, r *http.Request) {
	defer drain(r)
	if !f.httpUser(w, r) {
		return
	}
	md := uploadMetadata(r.Header)
	ctx := r.Context()
	q := r.URL.Query().Get("path")
	fail := func(err error) {
		if errors.Is(err, errTooBig) {
			writeJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf(
				"the upload is over the %d bytes (1 GiB) Quro %s takes per file through /files: split it", int64(maxTransfer), f.s.version()))
			return
		}
		writeFileError(w, err)
	}
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "the body is not gzip data (Content-Encoding: gzip): "+err.Error())
			return
		}
		defer gz.Close()
		body = gz
	default:
		writeJSONError(w, http.StatusUnsupportedMediaType, "Content-Encoding "+strconv.Quote(enc)+": Quro takes gzip or none")
		return
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	results := []writeInfo{}
	switch mt {
	case "multipart/form-data":
		if params["boundary"] == "" {
			writeJSONError(w, http.StatusBadRequest, "multipart/form-data without a boundary")
			return
		}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, "reading the multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			// The target is the path parameter when there is one (as
			// envd: a single write, and a signed URL, whose signature
			// covers that path and nothing else), else the part's
			// filename (writeFiles), read from the header, as
			// part.FileName() keeps only its last element.
			target := q
			if target == "" {
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = dp["filename"]
			}
			if target == "" {
				part.Close()
				writeJSONError(w, http.StatusBadRequest, "a file part without a filename, and no path parameter: name the target path in the part's filename")
				return
			}
			rel, err := toWorkspace(target)
			if err != nil {
				part.Close()
				writeError(w, err)
				return
			}
			info, err := f.store(ctx, rel, part, md)
			part.Close()
			if err != nil {
				fail(err)
				return
			}
			results = append(results, *info)
		}
		if len(results) == 0 {
			writeJSONError(w, http.StatusBadRequest, `no file in the multipart body: send each file as a part named "file" whose filename is its path`)
			return
		}
	case "application/octet-stream", "":
		if q == "" {
			writeJSONError(w, http.StatusBadRequest, "an application/octet-stream upload needs the target in the path parameter (?path=/home/user/…)")
			return
		}
		rel, err := toWorkspace(q)
		if err != nil {
			writeError(w, err)
			return
		}
		info, err := f.store(ctx, rel, body, md)
		if err != nil {
			fail(err)
			return
		}
		results = append(results, *info)
	default:
		writeJSONError(w, http.StatusUnsupportedMediaType, "Content-Type "+strconv.Quote(mt)+": upload as multipart/form-data (parts named \"file\") or application/octet-stream with ?path=")
		return
	}
	writeJSON(w, http.StatusOK, results)
}
