package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"syscall"
)

// Event kinds Watch reports (fsnotify's, as E2B's envd reports them).
const (
	EventCreate = "create" // a file or directory appeared (created, or moved in)
	EventWrite  = "write"  // a file's content changed
	EventRemove = "remove" // removed (or the watched directory itself went)
	EventRename = "rename" // moved away (or renamed within)
	EventChmod  = "chmod"  // metadata changed: mode, owner, times
)

// Event is one change under a watched directory.
type Event struct {
	Name  string `json:"name" jsonschema:"path of what changed, relative to the watched directory"`
	Type  string `json:"type" jsonschema:"create, write, remove, rename or chmod"`
	Entry *Entry `json:"entry,omitempty" jsonschema:"what is there now (include_entry; absent when it is gone)"`
}

// DefaultMaxWatches bounds the directories one recursive Watch watches.
const DefaultMaxWatches = 1024

// ErrWatchEnded says the watched directory was removed or moved (the
// session's workspace is gone when the session was destroyed).
var ErrWatchEnded = errors.New("the watched directory was removed or moved away; the watch ended")

// ErrWatchLimit says the server cannot watch more now: a cap of its own
// (per tenant or for the server, on watches or watched directories; see
// HubLimits) or the host's inotify limits (fs.inotify.max_user_instances,
// max_user_watches, shared by every process of the server's user) are
// reached. The message names which. A watch ending frees its share.
var ErrWatchLimit = errors.New("the server cannot watch more directories now")

// ErrOverflow says changes came faster than they were read; some were
// lost: the watch's own queue overflowed, or the kernel's queue of the
// inotify instance it shares.
var ErrOverflow = errors.New("changes came faster than they were read and some were lost (an event queue overflowed); the watch ended: watch a smaller directory, or read events faster")

// WatchOptions configure a Watch.
type WatchOptions struct {
	Recursive    bool // watch subdirectories too (new ones as they appear)
	IncludeEntry bool // describe what is there in each event
	MaxWatches   int  // directories watched at most (recursive); 0: DefaultMaxWatches
	// Ready, when set, is called once the watches are in place: a change
	// made after it returns is reported.
	Ready func()
	// Hub holds the inotify instances the watch shares (nil:
	// DefaultHub()); Tenant is whose caps it counts against.
	Hub    *Hub
	Tenant string
}

const watchMask = syscall.IN_CREATE | syscall.IN_MOVED_TO | syscall.IN_MOVED_FROM | syscall.IN_DELETE |
	syscall.IN_MODIFY | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR

// watcher is one Watch: a subscriber of its tenant's inotify instance.
// dirs and wds are its goroutine's (changed under the Hub's lock, with
// the counts); q, over and err are the instance reader's hand-over.
type watcher struct {
	w    *FS
	h    *Hub
	g    *group
	in   *instance
	base string           // the watched directory, workspace-relative
	dirs map[int32]string // watch descriptor → directory relative to base
	wds  map[string]int32 // and back
	o    WatchOptions

	qmu  sync.Mutex
	q    []pending
	over bool
	err  error
	wake chan struct{}
}

// Watch reports the changes under the directory p to fn, one event at a
// time, until ctx ends (nil then), the directory goes (ErrWatchEnded) or
// events are lost (ErrOverflow). fn runs on Watch's goroutine; while it
// blocks, events are queued for it (up to HubLimits.Queue, then
// ErrOverflow: for this watch alone).
//
// The watch shares its tenant's inotify instance of o.Hub (see Hub) and
// counts against its caps (ErrWatchLimit). Each directory is opened
// through the workspace root (no path leads out, O_NOFOLLOW on the last
// component: a link is never watched) and watched through its descriptor
// (/proc/self/fd), so a path component the session's code swaps for a
// link meanwhile cannot redirect the watch. An event reaches only the
// watches that watch its directory, named relative to each one's
// directory.
func (w *FS) Watch(ctx context.Context, p string, o WatchOptions, fn func(Event)) error {
	rel, err := w.Rel(p)
	if err != nil {
		return err
	}
	if o.MaxWatches <= 0 {
		o.MaxWatches = DefaultMaxWatches
	}
	if o.Hub == nil {
		o.Hub = DefaultHub()
	}
	fi, err := w.root.Stat(rel)
	if err != nil {
		return explain(rel, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%q is a %s; only a directory can be watched: %w", rel, typeName(fi.Mode()), ErrNotDir)
	}
	wt := &watcher{w: w, h: o.Hub, base: rel, dirs: map[int32]string{}, wds: map[string]int32{}, o: o,
		wake: make(chan struct{}, 1)}
	if err := o.Hub.join(wt, o.Tenant); err != nil {
		return fmt.Errorf("watch %q: %w", rel, err)
	}
	defer o.Hub.leave(wt)
	if err := wt.add("", true); err != nil {
		return err
	}
	if o.Recursive {
		if err := wt.addTree("", nil); err != nil {
			return err
		}
	}
	if o.Ready != nil {
		o.Ready()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wt.wake:
		}
		q, over, err := wt.take()
		for _, ev := range q {
			if ctx.Err() != nil {
				return nil
			}
			if ended, err := wt.handle(ev.wd, ev.mask, ev.name, fn); ended || err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case over:
			return ErrOverflow
		case err != nil:
			return fmt.Errorf("watch %q: %w", rel, err)
		}
	}
}

// add watches the directory dir (relative to the watched one), opened
// through the root without following a link at its last component.
func (wt *watcher) add(dir string, top bool) error {
	if _, ok := wt.wds[dir]; ok {
		return nil
	}
	if len(wt.dirs) >= wt.o.MaxWatches {
		return fmt.Errorf("%q has more than %d directories to watch: watch a smaller directory, or not recursively: %w",
			wt.base, wt.o.MaxWatches, ErrTooLarge)
	}
	rel := path.Join(wt.base, dir)
	d, err := wt.w.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if !top {
			// Gone, or swapped for a link (os.Root refuses one out,
			// O_NOFOLLOW any other) meanwhile: nothing to watch.
			return nil
		}
		return explain(rel, err)
	}
	defer d.Close()
	if err := wt.h.addWatch(wt, d, dir); err != nil {
		return fmt.Errorf("watch %q: %w", rel, err)
	}
	return nil
}

// addTree watches the subdirectories of dir, depth first, never through a
// link. The server's own .quro at the top of the workspace is left out.
// found, when set, is told of every entry (made in a new directory before
// its watch was in place).
func (wt *watcher) addTree(dir string, found func(rel string)) error {
	d, err := wt.w.root.OpenFile(path.Join(wt.base, dir), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil //nolint:nilerr // gone or swapped meanwhile: nothing below to watch
	}
	ents, _ := d.ReadDir(-1)
	d.Close()
	for _, e := range ents {
		sub := path.Join(dir, e.Name())
		if wt.base == "." && sub == Internal || IsTemp(e.Name()) {
			continue
		}
		if found != nil {
			found(sub)
		}
		if !e.IsDir() { // DirEntry types come from getdents: a link is not a dir
			continue
		}
		if err := wt.add(sub, false); err != nil {
			return err
		}
		if err := wt.addTree(sub, found); err != nil {
			return err
		}
	}
	return nil
}

// handle turns one inotify event into Events. ended: the watched
// directory itself is gone.
func (wt *watcher) handle(wd int32, mask uint32, name string, fn func(Event)) (ended bool, err error) {
	if mask&syscall.IN_Q_OVERFLOW != 0 {
		return true, ErrOverflow
	}
	dir, ok := wt.dirs[wd]
	if !ok {
		return false, nil
	}
	if mask&syscall.IN_IGNORED != 0 {
		wt.h.forget(wt, wd)
		if dir == "" {
			return true, ErrWatchEnded
		}
		return false, nil
	}
	if name == "" { // about the directory itself
		if dir == "" && mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF) != 0 {
			fn(Event{Name: "", Type: map[bool]string{true: EventRemove, false: EventRename}[mask&syscall.IN_DELETE_SELF != 0]})
			return true, ErrWatchEnded
		}
		return false, nil // a subdirectory's own removal is reported by its parent
	}
	if wt.base == "." && dir == "" && name == Internal || IsTemp(name) {
		return false, nil // the server's own files: its directory, an atomic write's temporary file
	}
	rel := path.Join(dir, name)
	var typ string
	switch {
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		typ = EventCreate
		if wt.o.Recursive && mask&syscall.IN_ISDIR != 0 {
			if err := wt.add(rel, false); err != nil {
				return true, err
			}
			fn(wt.event(rel, EventCreate))
			// What was made in it before its watch was in place.
			if err := wt.addTree(rel, func(sub string) { fn(wt.event(sub, EventCreate)) }); err != nil {
				return true, err
			}
			return false, nil
		}
	case mask&syscall.IN_DELETE != 0:
		typ = EventRemove
	case mask&syscall.IN_MOVED_FROM != 0:
		typ = EventRename
	case mask&syscall.IN_MODIFY != 0:
		typ = EventWrite
	case mask&syscall.IN_ATTRIB != 0:
		typ = EventChmod
	default:
		return false, nil
	}
	fn(wt.event(rel, typ))
	return false, nil
}

// event is an Event about rel (relative to the watched directory), with
// its entry when asked for.
func (wt *watcher) event(rel, typ string) Event {
	ev := Event{Name: rel, Type: typ}
	if wt.o.IncludeEntry && typ != EventRemove && typ != EventRename {
		if e, err := wt.w.Info(path.Join(wt.base, rel)); err == nil {
			ev.Entry = e
		}
	}
	return ev
}
