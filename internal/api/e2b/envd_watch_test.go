package e2b_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
)

// watchEnds is an App observer that reports every watch_dir call that
// ended, and the channel it reports on.
func watchEnds() (controller.Observer, chan *controller.Record) {
	ch := make(chan *controller.Record, 1000)
	return func(_ context.Context, r *controller.Record) {
		if r.Capability == "watch_dir" {
			ch <- r
		}
	}, ch
}

// statusOf is get_service_status as tenant.
func (e *env) statusOf(t *testing.T, tenant string) *app.Status {
	t.Helper()
	reply, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Tenant: tenant, Scope: capability.ScopeRead}, "get_service_status", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return reply.Output.(*app.Status)
}

// sessionOf makes a session of tenant and returns its id.
func (e *env) sessionOf(t *testing.T, tenant string) string {
	t.Helper()
	reply, err := e.App.Controller.Call(context.Background(),
		controller.Caller{Path: "cli", Tenant: tenant, Scope: capability.ScopeExec}, "create_session", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(reply.Output)
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		t.Fatalf("create_session: %s (%v)", b, err)
	}
	return out.ID
}

// One tenant (a read token is enough for a watch) with 20 sandboxes asks
// for 8 polling watchers in each: it gets its cap of watches and no
// more, all on one inotify instance, refused with an error that names
// the cap. Meanwhile another tenant's watch works, and another process
// of the server's user (this test's) gets an inotify instance of its
// own: the host's 128 are not used up. Status and metrics say so, and
// killing the sandboxes gives everything back.
func TestEnvdWatchesHeldToTheTenantsCaps(t *testing.T) {
	observe, ended := watchEnds()
	e := newEnv(t, &app.Options{Observers: []controller.Observer{observe}})
	ctx := context.Background()
	var ids []string
	for range 20 {
		ids = append(ids, e.newSession(t))
	}
	made, refused := 0, 0
	for _, id := range ids {
		c := e.fsClient(id)
		for range 8 {
			_, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
			if err == nil {
				made++
				continue
			}
			wantConnect(t, err, connect.CodeResourceExhausted, `tenant "t1" has 64 watches running, the most one tenant may`)
			refused++
		}
	}
	st := e.statusOf(t, e.Tenant)
	lim, host := st.Watches.Limits, st.Watches.Host
	t.Logf("caps: %+v; the host's: %+v", lim, host)
	if made != lim.TenantWatches || made+refused != 160 {
		t.Fatalf("%d watchers made, %d refused; want the tenant's cap, %d", made, refused, lim.TenantWatches)
	}
	if lim.Instances > host.MaxUserInstances/8 && lim.Instances > 1 || lim.Dirs > host.MaxUserWatches/4 || lim.TenantDirs > lim.Dirs/8 {
		t.Fatalf("caps %+v are not well under the host's %+v", lim, host)
	}
	if st.Watches.Instances != 1 || st.Watches.Watches != made || st.Tenant.Watches != made || st.Tenant.WatchesMax != lim.TenantWatches ||
		st.Tenant.WatchedDirs != made || st.Tenant.WatchedDirsMax != lim.TenantDirs {
		t.Fatalf("status: %+v, tenant %+v", st.Watches, st.Tenant)
	}
	if !strings.Contains(st.Text(), "watches: 64 of ") {
		t.Errorf("status text: %s", st.Text())
	}

	// Another process of the server's user gets an inotify instance.
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify_init1 of another process: %v", err)
	}
	syscall.Close(fd)

	// Another tenant watches, and sees its change.
	other := e.sessionOf(t, "t2")
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := e.fsClient(other).WatchDir(sctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user"}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("another tenant's watch: %v %v", stream.Msg(), stream.Err())
	}
	if res, body := e.filesReq(t, other, "POST", "path=/home/user/seen.txt", "application/octet-stream", strings.NewReader("x"), nil); res.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", res.StatusCode, body)
	}
	for {
		if !stream.Receive() {
			t.Fatalf("another tenant's watch ended: %v", stream.Err())
		}
		if ev := stream.Msg().GetFilesystem(); ev != nil && ev.GetName() == "seen.txt" {
			break
		}
	}

	f := metricstest.Scrape(t, e.App.Metrics.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"quro_watches", nil, float64(made + 1)},
		{"quro_watches_max", []string{"scope", "tenant"}, float64(lim.TenantWatches)},
		{"quro_watches_max", []string{"scope", "server"}, float64(lim.Watches)},
		{"quro_inotify_instances", nil, 2},
		{"quro_inotify_instances_max", nil, float64(lim.Instances)},
		{"quro_watched_dirs", nil, float64(made + 1)},
		{"quro_watched_dirs_max", []string{"scope", "tenant"}, float64(lim.TenantDirs)},
		{"quro_watch_refusals_total", []string{"cap", "watches_per_tenant"}, float64(refused)},
	} {
		if v, ok := f.Value(c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (%v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}

	// Killing the sandboxes ends their watchers (every watch_dir call of
	// theirs, the refused ones too, has then ended).
	for _, id := range ids {
		args, _ := json.Marshal(map[string]any{"session": id})
		if _, err := e.App.Controller.Call(ctx, controller.Caller{Path: "cli", Tenant: e.Tenant, Scope: capability.ScopeExec}, "destroy_session", args); err != nil {
			t.Fatal(err)
		}
	}
	for range made + refused {
		<-ended
	}
	stop()
	for stream.Receive() {
	}
	stream.Close()
	<-ended
	if st := e.statusOf(t, e.Tenant); st.Watches.Watches != 0 || st.Watches.Dirs != 0 || st.Watches.Instances != 0 || st.Tenant.Watches != 0 {
		t.Fatalf("after the kill: %+v, tenant %+v", st.Watches, st.Tenant)
	}
}

// A polling watcher nobody polls expires (Options.WatcherIdle): its
// watch ends and the next poll says why. One that is polled lives on.
func TestEnvdUnpolledWatcherExpires(t *testing.T) {
	observe, ended := watchEnds()
	const idle = time.Second
	e := newEnvWith(t, &app.Options{Observers: []controller.Observer{observe}}, func(o *e2b.Options) { o.WatcherIdle = idle })
	id := e.newSession(t)
	c := e.fsClient(id)
	ctx := context.Background()
	polled, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
	if err != nil {
		t.Fatal(err)
	}
	forgotten, err := c.CreateWatcher(ctx, rpc(&filesystem.CreateWatcherRequest{Path: "/home/user"}))
	if err != nil {
		t.Fatal(err)
	}
	poll := func(w *connect.Response[filesystem.CreateWatcherResponse]) ([]*filesystem.FilesystemEvent, error) {
		res, err := c.GetWatcherEvents(ctx, rpc(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetEvents(), nil
	}
	// Poll the one until the other's watch has ended.
	start := time.Now()
	for waiting := true; waiting; {
		select {
		case <-ended:
			waiting = false
		default:
			if _, err := poll(polled); err != nil {
				t.Fatal(err)
			}
		}
	}
	if waited := time.Since(start); waited < idle/2 {
		t.Fatalf("the unpolled watcher ended after %s, before its idle time %s", waited, idle)
	}
	_, err = poll(forgotten)
	wantConnect(t, err, connect.CodeNotFound, "the watcher expired: it was not polled")
	// The polled one still reports.
	if res, body := e.filesReq(t, id, "POST", "path=/home/user/later.txt", "application/octet-stream", strings.NewReader("x"), nil); res.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", res.StatusCode, body)
	}
	for seen := false; !seen; {
		evs, err := poll(polled)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			seen = seen || ev.GetName() == "later.txt"
		}
	}
	if st := e.statusOf(t, e.Tenant); st.Watches.Watches != 1 {
		t.Fatalf("status %+v, want the polled watcher's watch alone", st.Watches)
	}
	// Removed, its watch ends (before the App closes and unmounts the
	// session's disk).
	if _, err := c.RemoveWatcher(ctx, rpc(&filesystem.RemoveWatcherRequest{WatcherId: polled.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	<-ended
}

// Two sandboxes of one tenant share its inotify instance, yet each
// watch sees its own sandbox's changes alone, named as the sandbox sees
// them (relative to the watched directory, entries under /home/user),
// never a host path.
func TestEnvdWatchEventsStayInTheirSandbox(t *testing.T) {
	observe, ended := watchEnds()
	e := newEnv(t, &app.Options{Observers: []controller.Observer{observe}})
	ids := []string{e.newSession(t), e.newSession(t)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*connect.ServerStreamForClient[filesystem.WatchDirResponse]
	for _, id := range ids {
		s, err := e.fsClient(id).WatchDir(ctx, rpc(&filesystem.WatchDirRequest{Path: "/home/user", IncludeEntry: true}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if !s.Receive() || s.Msg().GetStart() == nil {
			t.Fatalf("%v %v", s.Msg(), s.Err())
		}
		streams = append(streams, s)
	}
	if st := e.statusOf(t, e.Tenant); st.Watches.Instances != 1 || st.Watches.Watches != 2 {
		t.Fatalf("status %+v", st.Watches)
	}
	for i, name := range []string{"first.txt", "second.txt"} {
		if res, body := e.filesReq(t, ids[i], "POST", "path=/home/user/"+name, "application/octet-stream", strings.NewReader("x"), nil); res.StatusCode != http.StatusOK {
			t.Fatalf("upload: %d %s", res.StatusCode, body)
		}
	}
	// Each stream sees its own sandbox's file arrive (written beside it,
	// then renamed), and nothing of the other's.
	for i, name := range []string{"first.txt", "second.txt"} {
		s := streams[i]
		for {
			if !s.Receive() {
				t.Fatalf("sandbox %d's watch ended: %v", i+1, s.Err())
			}
			ev := s.Msg().GetFilesystem()
			if ev == nil {
				continue
			}
			if !strings.Contains(ev.GetName(), name) || ev.GetEntry() != nil && ev.GetEntry().GetPath() != "/home/user/"+ev.GetName() {
				t.Fatalf("sandbox %d's watch: %v, want only its own %s under /home/user", i+1, ev, name)
			}
			if ev.GetName() == name && ev.GetType() == filesystem.EventType_EVENT_TYPE_CREATE {
				break
			}
		}
	}
	// The watches end with their streams (before the App closes and
	// unmounts the sessions' disks).
	cancel()
	<-ended
	<-ended
}
