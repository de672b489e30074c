//go:build k8s

package cluster

// A drain that finds room, on a real API server (k8stest; skipped
// without its binaries): three nodes, the drained one and two receivers
// whose Leases order them; a receiver that refuses for room is passed
// over for the next, asked before the session is paused; a session no
// node admits stays, counted apart, never paused; a node of an earlier
// version, which has no probe, is taken at its import's word. Run:
//
//	go test -tags k8s -trimpath -count=1 -run TestClusterDrainFindsRoom ./internal/cluster/

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/k8stest"
)

// roomLocal is a node's Local for these tests: it logs what it is asked
// ("quiesce s1", "admit acme 5", "import s1"), refuses an admission
// while admitErr is set and an import while importErr is, and takes a
// move stream otherwise.
type roomLocal struct {
	name string
	log  *eventLog

	mu                  sync.Mutex
	admitErr, importErr error
	// onQuiesce, when set, runs at the next quiesce (then is cleared):
	// what the node does meanwhile.
	onQuiesce func()
}

// eventLog is what the nodes of a test were asked, in order.
type eventLog struct {
	mu sync.Mutex
	ev []string
}

func (l *eventLog) add(format string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ev = append(l.ev, fmt.Sprintf(format, a...))
}

// take returns the events so far and forgets them.
func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.ev
	l.ev = nil
	return ev
}

func (r *roomLocal) set(admitErr, importErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admitErr, r.importErr = admitErr, importErr
}

func (r *roomLocal) Quiesce(_ context.Context, id string) error {
	r.log.add("%s quiesce %s", r.name, id)
	r.mu.Lock()
	f := r.onQuiesce
	r.onQuiesce = nil
	r.mu.Unlock()
	if f != nil {
		f()
	}
	return nil
}
func (r *roomLocal) Unquiesce(id string) { r.log.add("%s unquiesce %s", r.name, id) }
func (r *roomLocal) Export(_ context.Context, _ string, w io.Writer) error {
	_, err := io.WriteString(w, "files")
	return err
}
func (r *roomLocal) Release(_ context.Context, id string) error {
	r.log.add("%s release %s", r.name, id)
	return nil
}
func (r *roomLocal) Size(context.Context, string) (int64, error) { return 5, nil }
func (r *roomLocal) Admit(_ context.Context, tenant string, size int64) error {
	r.log.add("%s admit %s %d", r.name, tenant, size)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admitErr
}
func (r *roomLocal) Import(_ context.Context, id, _, name string, body io.Reader) (string, int, int64, error) {
	b, _ := io.ReadAll(body)
	r.log.add("%s import %s", r.name, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.importErr != nil {
		return "", 0, 0, r.importErr
	}
	return name, 1, int64(len(b)), nil
}

func TestClusterDrainFindsRoom(t *testing.T) {
	if k8stest.Bin() == "" {
		t.Skip("no etcd and kube-apiserver binaries: make test-k8s builds them (or set KUBEBUILDER_ASSETS)")
	}
	cfg, _ := k8stest.APIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	key := []byte("0123456789abcdef0123456789abcdef")
	log := &eventLog{}
	// A node: its Cluster, its Local and Drainer serving the move route
	// on a port of its own, and its Lease with sessions of MaxSessions
	// 100 (its headroom: placement's order).
	type node struct {
		c     *Cluster
		local *roomLocal
		d     *Drainer
		// older: the node answers a probe as a node of an earlier
		// version does, which has no probe (405: its route is PUT's).
		older atomic.Bool
	}
	start := func(name string, sessions int) *node {
		n := &node{local: &roomLocal{name: name, log: log}}
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		c, err := New(Options{Config: cfg, Namespace: "default", Node: name, Address: strings.TrimPrefix(srv.URL, "http://"),
			LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.Heartbeat(ctx, Node{Sessions: sessions, MaxSessions: 100}); err != nil {
			t.Fatal(err)
		}
		n.c = c
		n.d = &Drainer{C: c, Member: &Member{C: c}, Local: n.local, Key: key}
		mux.Handle(MovePath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && n.older.Load() {
				http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
				return
			}
			n.d.ServeHTTP(w, r)
		}))
		return n
	}
	a := start("node-a", 0)
	roomy := start("node-roomy", 0) // the most headroom: asked first
	next := start("node-next", 10)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	for _, name := range []string{"node-roomy", "node-next", "node-a"} {
		if err := a.c.WaitNode(wctx, name); err != nil {
			t.Fatal(err)
		}
	}
	// Node a's sessions: records naming it, and its Member's list.
	var held []LocalSession
	var hmu sync.Mutex
	a.d.Member.List = func(context.Context) ([]LocalSession, error) {
		hmu.Lock()
		defer hmu.Unlock()
		return slices.Clone(held), nil
	}
	a.d.Member.MovedAway = func(_ context.Context, id string) error { // its copy let go, as the App's
		hmu.Lock()
		defer hmu.Unlock()
		held = slices.DeleteFunc(held, func(ls LocalSession) bool { return ls.ID == id })
		return nil
	}
	session := func(t *testing.T, id string) {
		t.Helper()
		hmu.Lock()
		held = append(held, LocalSession{ID: id, Tenant: "acme", Name: id, Network: "none", Created: time.Now()})
		hmu.Unlock()
		rec := &Session{Spec: SessionSpec{Node: "node-a", Tenant: "acme", Name: id, Network: "none"}}
		rec.Name = id
		if err := a.c.Record(ctx, rec); err != nil {
			t.Fatal(err)
		}
		waitOwned(t, a.c, id, "node-a")
	}
	drain := func(t *testing.T) (Result, []Move) {
		t.Helper()
		var moves []Move
		res, err := a.d.Drain(ctx, NewDrainID(), func(m Move) { moves = append(moves, m) })
		if err != nil {
			t.Fatal(err)
		}
		return res, moves
	}
	full := capability.Errorf(capability.ResourceExhausted, "tenant acme is at its memory ceiling of 64 MiB")
	owner := func(t *testing.T, id string) string {
		t.Helper()
		s, err := a.c.Get(ctx, id)
		if err != nil || s == nil {
			t.Fatalf("session %s's record: %v", id, err)
		}
		return s.Spec.Node
	}

	t.Run("a receiver at a ceiling is passed over before the session is paused", func(t *testing.T) {
		session(t, "s1")
		roomy.local.set(full, nil)
		defer roomy.local.set(nil, nil)
		log.take()
		res, moves := drain(t)
		if res != (Result{Moved: 1}) || len(moves) != 1 || !moves[0].OK || moves[0].To != "node-next" {
			t.Fatalf("the drain: %+v %+v", res, moves)
		}
		if p := moves[0].PassedOver; len(p) != 1 || !strings.Contains(p[0], "node-roomy refused it (429)") || !strings.Contains(p[0], "memory ceiling") {
			t.Fatalf("the move says it passed over %q, want node roomy's refusal", p)
		}
		// Node roomy refused before node a paused the session, which
		// node next then took.
		want := []string{"node-roomy admit acme 5", "node-next admit acme 5", "node-a quiesce s1", "node-next import s1", "node-a release s1"}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("what the nodes were asked: %q, want %q", got, want)
		}
		if o := owner(t, "s1"); o != "node-next" {
			t.Fatalf("s1's record names %s", o)
		}
	})

	t.Run("an import refused for room after a yes goes to the next node", func(t *testing.T) {
		// Node roomy's room went between its answer and the stream: the
		// import is the boundary.
		session(t, "s2")
		roomy.local.set(nil, full)
		defer roomy.local.set(nil, nil)
		log.take()
		res, moves := drain(t)
		if res != (Result{Moved: 1}) || len(moves) != 1 || moves[0].To != "node-next" {
			t.Fatalf("the drain: %+v %+v", res, moves)
		}
		want := []string{"node-roomy admit acme 5", "node-a quiesce s2", "node-roomy import s2", "node-next admit acme 5",
			"node-next import s2", "node-a release s2"}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("what the nodes were asked: %q, want %q", got, want)
		}
		if o := owner(t, "s2"); o != "node-next" {
			t.Fatalf("s2's record names %s", o)
		}
	})

	t.Run("a session no node admits stays, unpaused, counted apart", func(t *testing.T) {
		session(t, "s3")
		roomy.local.set(full, nil)
		next.local.set(capability.Errorf(capability.ResourceExhausted, "the server (all tenants together) is at its session ceiling of 3"), nil)
		defer roomy.local.set(nil, nil)
		defer next.local.set(nil, nil)
		log.take()
		res, moves := drain(t)
		if res != (Result{NoRoom: 1}) || len(moves) != 1 || moves[0].OK || !moves[0].NoRoom || moves[0].Paused {
			t.Fatalf("the drain: %+v %+v (want no room, never paused)", res, moves)
		}
		for _, says := range []string{"node-roomy refused it (429)", "memory ceiling", "node-next refused it (429)", "session ceiling of 3"} {
			if !strings.Contains(moves[0].Error, says) {
				t.Errorf("the move's error %q does not say %q", moves[0].Error, says)
			}
		}
		if got := log.take(); !slices.Equal(got, []string{"node-roomy admit acme 5", "node-next admit acme 5"}) {
			t.Fatalf("what the nodes were asked: %q (a session no node takes is never paused)", got)
		}
		if o := owner(t, "s3"); o != "node-a" {
			t.Fatalf("s3's record names %s", o)
		}
		if a.d.Quiesced("s3") {
			t.Fatal("s3 is still quiesced on node a")
		}
	})

	t.Run("a refusal that is not for room is not passed on", func(t *testing.T) {
		// A refusal another node would give as well (the stream is not
		// acceptable): the session stays, reported as failed.
		roomy.local.set(nil, capability.Errorf(capability.InvalidArgument, "the moved workspace: too deep"))
		defer roomy.local.set(nil, nil)
		log.take()
		res, moves := drain(t)
		if res != (Result{Failed: 1}) || len(moves) != 1 || moves[0].NoRoom || !moves[0].Paused || !strings.Contains(moves[0].Error, "too deep") {
			t.Fatalf("the drain: %+v %+v (want failed after its pause)", res, moves)
		}
		want := []string{"node-roomy admit acme 5", "node-a quiesce s3", "node-roomy import s3", "node-a unquiesce s3"}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("what the nodes were asked: %q, want %q", got, want)
		}
	})

	t.Run("the probe is taken only signed, from the record's owner, once", func(t *testing.T) {
		probe := func(sig, id, body string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, "http://"+roomyAddr(t, a.c)+MovePath+id, strings.NewReader(body))
			req.Header.Set(MoveHeader, sig)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		sig := MoveSignature(key, "node-a", "node-roomy", "s3", time.Now())
		if code, body := probe(sig, "s3", `{"bytes":5}`); code != http.StatusNoContent {
			t.Fatalf("a good probe: %d %s", code, body)
		}
		if code, body := probe(sig, "s3", `{"bytes":5}`); code != http.StatusForbidden || !strings.Contains(body, "used already") {
			t.Fatalf("a probe's header used again: %d %s", code, body)
		}
		if code, body := probe(MoveSignature(key, "node-next", "node-roomy", "s3", time.Now()), "s3", `{"bytes":5}`); code != http.StatusForbidden || !strings.Contains(body, "not node-next's to move") {
			t.Fatalf("a probe from a node that does not own the session: %d %s", code, body)
		}
		if code, body := probe(MoveSignature([]byte("another key of thirty-two bytes!!"), "node-a", "node-roomy", "s3", time.Now()), "s3", `{"bytes":5}`); code != http.StatusForbidden {
			t.Fatalf("a probe signed with another key: %d %s", code, body)
		}
		if code, body := probe(MoveSignature(key, "node-a", "node-roomy", "s3", time.Now()), "s3", `{"bytes":-1}`); code != http.StatusBadRequest {
			t.Fatalf("a probe of a negative size: %d %s", code, body)
		}
		if got := log.take(); !slices.Equal(got, []string{"node-roomy admit acme 5"}) {
			t.Fatalf("the receiver was asked %q: only the good probe may reach its Local", got)
		}
	})

	// A node of an earlier version mid-upgrade has no probe: its 405 is
	// taken as a yes, and its import is the boundary. A refusal for room
	// there passes the session on; any other refusal (an earlier node
	// refuses this version's move signature, 403) leaves it here with
	// its record, paused and reported: never lost.
	t.Run("a node without the probe is taken at its import's word", func(t *testing.T) {
		roomy.older.Store(true)
		defer roomy.older.Store(false)
		roomy.local.set(nil, full)
		defer roomy.local.set(nil, nil)
		log.take()
		res, moves := drain(t) // s3, left by the subtests above
		if res != (Result{Moved: 1}) || len(moves) != 1 || moves[0].To != "node-next" ||
			len(moves[0].PassedOver) != 1 || !strings.Contains(moves[0].PassedOver[0], "node-roomy refused it (429)") {
			t.Fatalf("the drain: %+v %+v", res, moves)
		}
		want := []string{"node-a quiesce s3", "node-roomy import s3", "node-next admit acme 5", "node-next import s3", "node-a release s3"}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("what the nodes were asked: %q, want %q", got, want)
		}

		session(t, "s4")
		roomy.local.set(nil, capability.Errorf(capability.PermissionDenied, "moving session s4 here: Quro-Move is not FROM TIME SIGNATURE"))
		log.take()
		res, moves = drain(t)
		if res != (Result{Failed: 1}) || len(moves) != 1 || moves[0].NoRoom || !moves[0].Paused || !strings.Contains(moves[0].Error, "node-roomy refused it (403)") {
			t.Fatalf("the drain: %+v %+v (want failed after its pause, not passed on)", res, moves)
		}
		want = []string{"node-a quiesce s4", "node-roomy import s4", "node-a unquiesce s4"}
		if got := log.take(); !slices.Equal(got, want) {
			t.Fatalf("what the nodes were asked: %q, want %q", got, want)
		}
		if o := owner(t, "s4"); o != "node-a" {
			t.Fatalf("s4's record names %s", o)
		}
		if a.d.Quiesced("s4") {
			t.Fatal("s4 is still quiesced on node a")
		}
	})

	// A session made on the node while its drain runs (a tenant's
	// default, which a draining node still makes for a call that names
	// none; a create placed here before the node's Lease said draining)
	// is moved by the same drain: none is left on a node about to go.
	t.Run("a session made while the drain runs is moved too", func(t *testing.T) {
		log.take()
		// s4 stays from the subtest above (its move failed): this drain
		// moves it, and meanwhile the node makes s5, a default of the
		// local tenant, whose record the table shows only later.
		a.local.mu.Lock()
		a.local.onQuiesce = func() {
			hmu.Lock()
			held = append(held, LocalSession{ID: "s5", Name: "default", Network: "none", Created: time.Now()})
			hmu.Unlock()
			rec := &Session{Spec: SessionSpec{Node: "node-a", Name: "default", Network: "none"}}
			rec.Name = "s5"
			if err := a.c.Record(ctx, rec); err != nil {
				t.Error(err)
			}
		}
		a.local.mu.Unlock()
		res, moves := drain(t)
		if res != (Result{Moved: 2}) || len(moves) != 2 || moves[0].Session != "s4" || moves[1].Session != "s5" || !moves[1].OK {
			t.Fatalf("the drain: %+v %+v (want s4, then s5, made meanwhile, moved)", res, moves)
		}
		for _, id := range []string{"s4", "s5"} {
			if o := owner(t, id); o == "node-a" {
				t.Fatalf("%s's record names the drained node", id)
			}
		}
	})

	// Attack: a tenant keeps a drain going by making a session on the
	// node each time its last one moved (destroying its default and
	// calling without a session, again and again). The drain makes
	// DrainPasses passes and ends, the session made after the last left
	// and reported.
	t.Run("sessions made again and again end the drain after its passes", func(t *testing.T) {
		log.take()
		n := 0
		var again func()
		again = func() {
			n++
			id := fmt.Sprintf("r%d", n)
			hmu.Lock()
			held = append(held, LocalSession{ID: id, Name: id, Network: "none", Created: time.Now()})
			hmu.Unlock()
			rec := &Session{Spec: SessionSpec{Node: "node-a", Name: id, Network: "none"}}
			rec.Name = id
			if err := a.c.Record(ctx, rec); err != nil {
				t.Error(err)
			}
			a.local.mu.Lock()
			a.local.onQuiesce = again
			a.local.mu.Unlock()
		}
		again() // r1, held before the drain; each quiesce makes the next
		res, moves := drain(t)
		a.local.mu.Lock()
		a.local.onQuiesce = nil
		a.local.mu.Unlock()
		if res != (Result{Moved: DrainPasses, Failed: 1}) || len(moves) != DrainPasses+1 {
			t.Fatalf("the drain: %+v, %d moves %+v (want %d moved, then the one made after the last pass left)", res, len(moves), moves, DrainPasses)
		}
		last := moves[DrainPasses]
		if last.OK || last.Session != fmt.Sprintf("r%d", DrainPasses+1) || !strings.Contains(last.Error, "drain it again") {
			t.Fatalf("the session made after the last pass: %+v", last)
		}
		if n != DrainPasses+1 {
			t.Fatalf("%d sessions made: the drain quiesced one it did not move", n)
		}
	})
}

// roomyAddr is node roomy's address as c's table holds it.
func roomyAddr(t *testing.T, c *Cluster) string {
	t.Helper()
	n, ok := c.Node("node-roomy")
	if !ok {
		t.Fatal("node roomy is not in the table")
	}
	return n.Address
}

// waitOwned waits until c's table holds session id's record naming node.
func waitOwned(t *testing.T, c *Cluster, id, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		changed := c.changes() // before the look: an event after it closes this
		if s, ok := c.Cached(id); ok && s.Spec.Node == node {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(errors.New("the record of " + id + " did not reach the table"))
		case <-changed:
		}
	}
}
