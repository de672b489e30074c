package e2b_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/e2b/gen/filesystem"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
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
}
