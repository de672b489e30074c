package workspace

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Watches share the server's inotify instances. The kernel counts
// instances (fs.inotify.max_user_instances, 128 by default) and watched
// directories (fs.inotify.max_user_watches) per user for the whole host,
// and the server runs as root: an instance per watch let one tenant use up
// every root process's instances. A Hub holds a few instances for the
// whole server instead — one per tenant that watches, up to its cap, past
// which tenants share the least shared one — and multiplexes their watch
// descriptors to the watches (subscribers) of that tenant: one descriptor
// per directory and instance, counted by the subscribers that watch it and
// removed with the last. One reader per instance hands each event to the
// queues of the descriptor's subscribers without waiting on any, so a
// subscriber that reads slowly overflows (and ends) alone; the kernel's
// own overflow of an instance's queue ends every subscriber of that
// instance, each told so (ErrOverflow). Caps on watches and watched
// directories, per tenant and for the server, are taken well under the
// host's limits, read at start.

// HubLimits bound the watches of a Hub. A zero field takes its default,
// derived from the host's limits (HostInotify) where it is one of the
// kernel's.
type HubLimits struct {
	// Instances: inotify instances the server holds at most (default an
	// eighth of max_user_instances, 1 to 16). A tenant uses one.
	Instances int `json:"inotify_instances"`
	// Watches: Watch calls running at once on the server (default 512)
	// and of one tenant (default 64).
	Watches       int `json:"watches"`
	TenantWatches int `json:"watches_per_tenant"`
	// Dirs: directories watched at once, counted per watch (a directory
	// two watches watch counts twice, though the kernel holds it once), on
	// the server (default a quarter of max_user_watches) and of one tenant
	// (default an eighth of the server's).
	Dirs       int `json:"watched_dirs"`
	TenantDirs int `json:"watched_dirs_per_tenant"`
	// Queue: events kept for one watch that has not read them yet
	// (default 16384, the kernel's own max_queued_events); past it the
	// watch ends with ErrOverflow.
	Queue int `json:"queue"`
}

// HostInotify are the host's inotify limits, per user.
type HostInotify struct {
	MaxUserInstances int `json:"max_user_instances"`
	MaxUserWatches   int `json:"max_user_watches"`
}

// ReadHostInotify reads the host's limits from /proc/sys/fs/inotify; a
// value it cannot read is the kernel's old default (128 instances, 8192
// watches).
func ReadHostInotify() HostInotify {
	read := func(name string, def int) int {
		b, err := os.ReadFile("/proc/sys/fs/inotify/" + name)
		if err != nil {
			return def
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n <= 0 {
			return def
		}
		return n
	}
	return HostInotify{MaxUserInstances: read("max_user_instances", 128), MaxUserWatches: read("max_user_watches", 8192)}
}

// Limits fills in l's zero fields from the host's limits.
func (host HostInotify) Limits(l HubLimits) HubLimits {
	if l.Instances <= 0 {
		l.Instances = min(max(host.MaxUserInstances/8, 1), 16)
	}
	if l.Watches <= 0 {
		l.Watches = 512
	}
	if l.TenantWatches <= 0 {
		l.TenantWatches = min(64, l.Watches)
	}
	if l.Dirs <= 0 {
		l.Dirs = max(host.MaxUserWatches/4, 1)
	}
	if l.TenantDirs <= 0 {
		l.TenantDirs = max(l.Dirs/8, 1)
	}
	if l.Queue <= 0 {
		l.Queue = 16384
	}
	return l
}

// WatchStats are a Hub's counts and caps, for the service status and
// metrics (no tenant is named).
type WatchStats struct {
	Instances int         `json:"inotify_instances" jsonschema:"inotify instances the server holds now"`
	Watches   int         `json:"watches" jsonschema:"watches running now (watch_dir calls, E2B watch streams and polling watchers)"`
	Dirs      int         `json:"watched_dirs" jsonschema:"directories watched now, counted per watch"`
	Limits    HubLimits   `json:"limits" jsonschema:"the caps: the server's, and each tenant's"`
	Host      HostInotify `json:"host" jsonschema:"the host's inotify limits per user, of which the caps take a fraction"`
	// Refused counts the watches (and directories of a recursive watch)
	// refused at a cap since the start, by cap: watches_per_tenant,
	// watches, watched_dirs_per_tenant, watched_dirs, host (the kernel
	// refused: other processes of the server's user hold the rest).
	Refused map[string]uint64 `json:"refused,omitempty" jsonschema:"refused at a cap since the start, by cap"`
	// Overflows counts the watches ended because events were lost since
	// the start: kernel (an instance's queue overflowed), watch (the
	// watch's own queue did: it read too slowly).
	Overflows map[string]uint64 `json:"overflows,omitempty" jsonschema:"watches ended by lost events since the start, by queue (kernel, watch)"`
}

// The caps WatchStats.Refused counts by.
const (
	CapTenantWatches = "watches_per_tenant"
	CapWatches       = "watches"
	CapTenantDirs    = "watched_dirs_per_tenant"
	CapDirs          = "watched_dirs"
	CapHost          = "host"
)

// Hub is the server's inotify instances, shared by every Watch given it
// (WatchOptions.Hub). Safe for concurrent use. It needs no closing: an
// instance is closed when its last watch ends.
type Hub struct {
	host HostInotify
	lim  HubLimits

	mu        sync.Mutex
	insts     []*instance
	groups    map[string]*group // by tenant
	watches   int
	dirs      int
	refused   map[string]uint64
	overflows map[string]uint64
}

// NewHub returns a Hub bounded by l (zero fields: defaults from the
// host's limits).
func NewHub(l HubLimits) *Hub {
	host := ReadHostInotify()
	return &Hub{host: host, lim: host.Limits(l), groups: map[string]*group{},
		refused: map[string]uint64{}, overflows: map[string]uint64{}}
}

var defaultHub = sync.OnceValue(func() *Hub { return NewHub(HubLimits{}) })

// DefaultHub is the Hub of a Watch given none.
func DefaultHub() *Hub { return defaultHub() }

// Limits are the caps in force.
func (h *Hub) Limits() HubLimits { return h.lim }

// Stats are the counts now.
func (h *Hub) Stats() WatchStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := WatchStats{Instances: len(h.insts), Watches: h.watches, Dirs: h.dirs, Limits: h.lim, Host: h.host,
		Refused: map[string]uint64{}, Overflows: map[string]uint64{}}
	for k, v := range h.refused {
		s.Refused[k] = v
	}
	for k, v := range h.overflows {
		s.Overflows[k] = v
	}
	return s
}

// Tenant is what tenant's watches hold now.
func (h *Hub) Tenant(tenant string) (watches, dirs int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.groups[tenant]; g != nil {
		return g.watches, g.dirs
	}
	return 0, 0
}

// group is one tenant's watches.
type group struct {
	tenant  string
	in      *instance
	watches int
	dirs    int
}

// instance is one inotify instance and its reader.
type instance struct {
	f      *os.File
	fd     int // f's descriptor (f.Fd() would make it blocking)
	groups int
	closed bool
	wds    map[int32]map[*watcher]bool // descriptor → its subscribers
	subs   map[*watcher]bool
}

// pending is one inotify event queued for a subscriber.
type pending struct {
	wd   int32
	mask uint32
	name string
}

func tenantName(t string) string {
	if t == "" {
		return "the local tenant"
	}
	return "tenant " + strconv.Quote(t)
}

// join counts a new watch of tenant and gives it its tenant's instance
// (made when the tenant has none and the server holds fewer than its cap;
// else the least shared one).
func (h *Hub) join(wt *watcher, tenant string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[tenant]
	if g != nil && g.watches >= h.lim.TenantWatches {
		h.refused[CapTenantWatches]++
		return fmt.Errorf("%w: %s has %d watches running, the most one tenant may (the server's cap per tenant): end one first (cancel a streaming watch_dir, stop() an E2B watch handle, RemoveWatcher)",
			ErrWatchLimit, tenantName(tenant), g.watches)
	}
	if h.watches >= h.lim.Watches {
		h.refused[CapWatches]++
		return fmt.Errorf("%w: the server runs %d watches, the most it may (its cap for all tenants); try again later", ErrWatchLimit, h.watches)
	}
	if g == nil {
		in, err := h.instanceFor()
		if err != nil {
			return err
		}
		g = &group{tenant: tenant, in: in}
		in.groups++
		h.groups[tenant] = g
	}
	g.watches++
	h.watches++
	g.in.subs[wt] = true
	wt.g, wt.in = g, g.in
	return nil
}

// instanceFor is a new instance, or past the cap the one fewest tenants
// share. h.mu is held.
func (h *Hub) instanceFor() (*instance, error) {
	if len(h.insts) >= h.lim.Instances {
		best := h.insts[0]
		for _, in := range h.insts[1:] {
			if in.groups < best.groups {
				best = in
			}
		}
		return best, nil
	}
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			h.refused[CapHost]++
			return nil, fmt.Errorf("%w: the host's inotify instances (fs.inotify.max_user_instances) or the server's open files are used up by other processes (%v); try again later", ErrWatchLimit, err)
		}
		return nil, err
	}
	in := &instance{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, wds: map[int32]map[*watcher]bool{}, subs: map[*watcher]bool{}}
	h.insts = append(h.insts, in)
	go h.read(in)
	return in, nil
}

// leave releases what wt holds: its directories (a descriptor no other
// subscriber has is removed), its count, and its tenant's instance when
// it was the tenant's last watch and the instance's last tenant.
func (h *Hub) leave(wt *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for wd := range wt.dirs {
		h.unref(wt, wd)
	}
	g, in := wt.g, wt.in
	delete(in.subs, wt)
	g.watches--
	h.watches--
	if g.watches > 0 {
		return
	}
	if h.groups[g.tenant] == g {
		delete(h.groups, g.tenant)
	}
	if in.groups--; in.groups > 0 {
		return
	}
	in.closed = true
	_ = in.f.Close() // ends its reader
	h.forgetInstance(in)
}

// forgetInstance takes in out of the instances new watches are given.
// h.mu is held.
func (h *Hub) forgetInstance(in *instance) {
	for i, x := range h.insts {
		if x == in {
			h.insts = append(h.insts[:i], h.insts[i+1:]...)
			return
		}
	}
}

// drop gives up instance in after reading it failed: its watches end
// with err, and the next watch of its tenants gets another. h.mu is held.
func (h *Hub) drop(in *instance, err error) {
	for wt := range in.subs {
		wt.fail(fmt.Errorf("reading the server's inotify instance: %w", err))
	}
	for t, g := range h.groups {
		if g.in == in {
			delete(h.groups, t)
		}
	}
	h.forgetInstance(in)
}

// unref drops wt's hold on descriptor wd (known to it); the last holder
// removes it from the kernel. h.mu is held.
func (h *Hub) unref(wt *watcher, wd int32) {
	dir := wt.dirs[wd]
	delete(wt.dirs, wd)
	if wt.wds[dir] == wd {
		delete(wt.wds, dir)
	}
	wt.g.dirs--
	h.dirs--
	subs := wt.in.wds[wd]
	if subs == nil { // the kernel removed it (IN_IGNORED)
		return
	}
	delete(subs, wt)
	if len(subs) == 0 {
		delete(wt.in.wds, wd)
		// An IN_IGNORED follows, found in no map: a descriptor is not
		// given again before the kernel's counter wraps.
		_, _ = syscall.InotifyRmWatch(wt.in.fd, uint32(wd))
	}
}

// addWatch watches the directory open as d for wt, under dir (relative to
// its watched directory), within the caps.
func (h *Hub) addWatch(wt *watcher, d *os.File, dir string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := wt.g
	if g.dirs >= h.lim.TenantDirs {
		h.refused[CapTenantDirs]++
		return fmt.Errorf("%w: %s watches %d directories, the most one tenant may (the server's cap per tenant): watch a smaller directory or not recursively, or end a watch",
			ErrWatchLimit, tenantName(g.tenant), g.dirs)
	}
	if h.dirs >= h.lim.Dirs {
		h.refused[CapDirs]++
		return fmt.Errorf("%w: the server watches %d directories, the most it may (its cap for all tenants); watch a smaller directory or not recursively, or try again later", ErrWatchLimit, h.dirs)
	}
	wd, err := syscall.InotifyAddWatch(wt.in.fd, fmt.Sprintf("/proc/self/fd/%d", d.Fd()), watchMask)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			h.refused[CapHost]++
			return fmt.Errorf("%w: the host's inotify watches (fs.inotify.max_user_watches) are used up by other processes; watch a smaller directory or not recursively, or try again later", ErrWatchLimit)
		}
		return err
	}
	w := int32(wd)
	if old, ok := wt.dirs[w]; ok { // the same directory under another name (a rename)
		delete(wt.wds, old)
	} else {
		g.dirs++
		h.dirs++
		subs := wt.in.wds[w]
		if subs == nil {
			subs = map[*watcher]bool{}
			wt.in.wds[w] = subs
		}
		subs[wt] = true
	}
	wt.dirs[w] = dir
	wt.wds[dir] = w
	return nil
}

// forget drops descriptor wd from wt after the kernel removed it
// (IN_IGNORED).
func (h *Hub) forget(wt *watcher, wd int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := wt.dirs[wd]; ok {
		h.unref(wt, wd)
	}
}

// read hands in's events to their subscribers' queues until in is closed.
func (h *Hub) read(in *instance) {
	buf := make([]byte, 256<<10)
	for {
		n, err := in.f.Read(buf)
		h.mu.Lock()
		if in.closed {
			h.mu.Unlock()
			return
		}
		if err != nil { // not expected of an open instance: its watches end with it
			h.drop(in, err)
			h.mu.Unlock()
			return
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			off += syscall.SizeofInotifyEvent + int(ev.Len)
			p := pending{wd: ev.Wd, mask: ev.Mask, name: name}
			if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
				// Whose events were lost is not known: every
				// subscriber of the instance is told.
				for wt := range in.subs {
					wt.push(p, h)
				}
				continue
			}
			for wt := range in.wds[ev.Wd] {
				wt.push(p, h)
			}
			if ev.Mask&syscall.IN_IGNORED != 0 {
				delete(in.wds, ev.Wd) // the kernel removed it
			}
		}
		h.mu.Unlock()
	}
}

// push queues p for wt without waiting; past the queue's bound wt is
// marked overflowed. h.mu is held.
func (wt *watcher) push(p pending, h *Hub) {
	wt.qmu.Lock()
	switch {
	case wt.over || wt.err != nil:
	case p.mask&syscall.IN_Q_OVERFLOW != 0:
		wt.over = true
		h.overflows["kernel"]++
	case len(wt.q) >= h.lim.Queue:
		wt.over = true
		h.overflows["watch"]++
	default:
		wt.q = append(wt.q, p)
	}
	wt.qmu.Unlock()
	select {
	case wt.wake <- struct{}{}:
	default:
	}
}

// fail ends wt with err.
func (wt *watcher) fail(err error) {
	wt.qmu.Lock()
	if wt.err == nil {
		wt.err = err
	}
	wt.qmu.Unlock()
	select {
	case wt.wake <- struct{}{}:
	default:
	}
}

// take is what was queued for wt, and whether events were lost or
// reading failed after them.
func (wt *watcher) take() (q []pending, over bool, err error) {
	wt.qmu.Lock()
	defer wt.qmu.Unlock()
	q, wt.q = wt.q, nil
	return q, wt.over, wt.err
}
