package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// Options configure a node of the cluster.
type Options struct {
	Config    *rest.Config // how to reach the API server (rest.InClusterConfig in a pod)
	Namespace string       // where the node's Sessions and Lease live
	Node      string       // this node's name (its pod's, POD_NAME)
	Address   string       // host:port other nodes forward to (POD_IP and the port)
	LeaseTTL  time.Duration
	Logger    *slog.Logger
	// TLS, when set, is this node's identity on the node port: its pin
	// goes into its Lease, and the pins of the others' are checked
	// through this Cluster (NodeTLS).
	TLS *NodeTLS

	// Tests only: watchHook wraps each watch of the session informer (an
	// informer that lags) and leaseWatchHook each of the Lease informer,
	// onWait runs when Resolve starts to wait, lookRate replaces the
	// bound of LookupRate and LookupBurst, and lookupWait LookupWait.
	watchHook      func(watch.Interface) watch.Interface
	leaseWatchHook func(watch.Interface) watch.Interface
	onWait         func()
	lookRate       *rate.Limiter
	lookupWait     time.Duration
}

// LookupRate and LookupBurst bound the API server reads of Lookup and
// Resolve: a call's session missing from the informer's table is read
// from the API server (a session another node created a moment ago,
// which the informer brings a moment later), and a client that names
// made-up sessions must not turn each into a read, queued with the
// node's Lease renewals until the Lease lapsed. Lookup, which runs before
// anyone authenticated the call, reads only while the bound allows it at
// once; Resolve, for an authenticated caller, waits past it for the
// informer to bring the record or for the bound to allow a read, at most
// LookupWait. The reads go through a client of their own, so that they
// never wait in line with the node's Lease and records.
const (
	LookupRate  = 2 // per second
	LookupBurst = 10
	LookupWait  = 5 * time.Second
)

// WriteQPS and WriteBurst are the client-side rate limit of the node's
// own API calls (its records, Lease and informers), when the config sets
// none: client-go's default (5 a second, 10 at once) queued a create's
// four writes (the record, its status, the Lease read and renewed) behind
// the ones before, and a burst of creates answered in 500 ms each. A node
// writes only for the sessions its authenticated callers make and end;
// the API server's own fairness (APF) bounds the rest. kubelet's default.
const (
	WriteQPS   = 50
	WriteBurst = 100
)

// Cluster is one node's view of the cluster: the session → node table and
// the nodes' Leases, kept by informers, and the writes of its own records.
type Cluster struct {
	opts     Options
	dyn      dynamic.Interface
	lookups  dynamic.Interface // Lookup's and Resolve's reads: a client of their own
	lookRate *rate.Limiter     // LookupRate, LookupBurst
	// changed is closed, and replaced, at each event of the session
	// informer: what Resolve waits on.
	changedMu sync.Mutex
	changed   chan struct{}
	sessions  cache.SharedIndexInformer
	leases    cache.SharedIndexInformer
	tenants   cache.SharedIndexInformer // tenants.quro.dev: the tenants' ceilings (tenants.go)
	log       *slog.Logger
	// draining: this node is being drained (Member.SetDraining); its own
	// view of itself says so at once, before its Lease comes back
	// through the informer.
	draining atomic.Bool
	// acquired is when this start of the node came up: its Lease's
	// acquireTime (Node.Acquired), the same at every renewal.
	acquired time.Time
}

// Index names of the session informer.
const (
	byTenant     = "tenant"
	byTenantName = "tenant-name"
	byNode       = "node"
)

// New connects to the API server; Start runs the informers.
func New(o Options) (*Cluster, error) {
	if o.Config == nil || o.Namespace == "" || o.Node == "" || o.Address == "" {
		return nil, errors.New("cluster: a config, namespace, node name and address are all needed")
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := rest.CopyConfig(o.Config)
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = WriteQPS, WriteBurst
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lcfg := rest.CopyConfig(o.Config)
	lcfg.RateLimiter = nil // its own
	lookups, err := dynamic.NewForConfig(lcfg)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, dyn: dyn, lookups: lookups, log: o.Logger, acquired: time.Now(),
		lookRate: rate.NewLimiter(LookupRate, LookupBurst), changed: make(chan struct{})}
	if o.lookRate != nil {
		c.lookRate = o.lookRate
	}
	if o.TLS != nil {
		o.TLS.c = c
	}
	c.sessions = informer(dyn.Resource(SessionsGVR).Namespace(o.Namespace), "", "sessions", o.Logger, o.watchHook)
	// The table holds each record as a *Session, converted once as it
	// arrives: a create's diff (Member.SyncRecords) reads every record of
	// the node, and placement and routing read them on every call.
	if err := c.sessions.SetTransform(toSession); err != nil {
		return nil, err
	}
	c.leases = informer(dyn.Resource(LeasesGVR).Namespace(o.Namespace), LabelComponent+"="+ComponentNode, "leases", o.Logger, o.leaseWatchHook)
	c.tenants = informer(dyn.Resource(TenantsGVR).Namespace(o.Namespace), "", "tenants", o.Logger, nil)
	if _, err := c.sessions.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.notify() },
		UpdateFunc: func(any, any) { c.notify() },
		DeleteFunc: func(any) { c.notify() },
	}); err != nil {
		return nil, err
	}
	if err := c.sessions.AddIndexers(cache.Indexers{
		byTenant:     index(func(s *Session) string { return s.Spec.Tenant }),
		byTenantName: index(func(s *Session) string { return s.Spec.Tenant + "\x00" + s.Spec.Name }),
		byNode:       index(func(s *Session) string { return s.Spec.Node }),
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// index is an informer's index of Sessions by key (an object that is no
// Session is in no index).
func index(key func(*Session) string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		if s, err := asSession(obj); err == nil {
			return []string{key(s)}, nil
		}
		return nil, nil // an object that is no Session is in no index
	}
}

// informer lists and watches res (objects with the labels sel, "" for
// all), straight from the dynamic client: client-go's informer factories
// bring every built-in type's client along. Its table lags the API server
// while a watch is down (the reflector waits 0.8 s and more, doubling,
// before it lists again), so each list after the first, each watch that
// cannot start and each error that ends one are logged at Warn; a watch
// that ends and starts again (every 5 to 10 minutes) at Debug.
func informer(res dynamic.ResourceInterface, sel, what string, log *slog.Logger, hook func(watch.Interface) watch.Interface) cache.SharedIndexInformer {
	var lists, watches atomic.Int64
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			l, err := res.List(ctx, o)
			if n := lists.Add(1); n > 1 || err != nil {
				log.Warn("cluster: an informer lists its objects again; its table lagged the API server meanwhile",
					"of", what, "lists", n, "from", o.ResourceVersion, "err", err)
			}
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			w, err := res.Watch(ctx, o)
			switch n := watches.Add(1); {
			case err != nil:
				log.Warn("cluster: an informer's watch did not start", "of", what, "from", o.ResourceVersion, "err", err)
			default:
				log.Debug("cluster: an informer watches", "of", what, "from", o.ResourceVersion, "watches", n)
			}
			if err == nil && hook != nil {
				w = hook(w)
			}
			return w, err
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 10*time.Minute, cache.Indexers{})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		log.Warn("cluster: an informer's list or watch failed; it tries again after a backoff", "of", what, "err", err)
	})
	return inf
}

// Start runs the informers until ctx ends and waits at most wait for
// their first list. ctx is the node's life, not the wait's: informers
// run by a context that ends when Start returns would stop watching, and
// the node would place and route by the table of its start for ever.
func (c *Cluster) Start(ctx context.Context, wait time.Duration) error {
	// client-go's own account of the informers (a watch that ended with
	// an error) goes to the node's log, not to klog's stderr.
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(c.log.Handler()))
	go c.sessions.RunWithContext(ictx)
	go c.leases.RunWithContext(ictx)
	go c.tenants.RunWithContext(ictx)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	// The tenants' ceilings too: a node serves none of a tenant's calls
	// under its own defaults in place of the cluster's ceilings.
	if !cache.WaitForCacheSync(wctx.Done(), c.sessions.HasSynced, c.leases.HasSynced, c.tenants.HasSynced) {
		return fmt.Errorf("cluster: the informers of %s did not sync within %s: %w", c.opts.Namespace, wait, context.Cause(wctx))
	}
	return nil
}

// Self is this node's name.
func (c *Cluster) Self() string { return c.opts.Node }

// toSession is the sessions informer's transform: an object from the
// API server becomes the *Session the table holds (others, such as a
// deletion's last known state, pass as they are).
func toSession(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return sessionFrom(u)
	}
	return obj, nil
}

// asSession is an informer's object as a *Session of the caller's own: a
// copy, so that what the caller sets does not change the table (its
// labels map is the table's: read it only).
func asSession(obj any) (*Session, error) {
	switch o := obj.(type) {
	case *Session:
		cp := *o
		return &cp, nil
	case *unstructured.Unstructured:
		return sessionFrom(o)
	}
	return nil, fmt.Errorf("not an object: %T", obj)
}

// notify wakes every Resolve waiting for the informer.
func (c *Cluster) notify() {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	close(c.changed)
	c.changed = make(chan struct{})
}

// changes is closed at the informer's next event.
func (c *Cluster) changes() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.changed
}

// Cached finds a session's record by ID in the informer's table only.
func (c *Cluster) Cached(id string) (*Session, bool) { return c.cached(id) }

// Lookup finds a session's record by ID in the informer's table, then in
// the API server (a session another node created a moment ago) while the
// bound of LookupRate and LookupBurst allows a read at once: past it, not
// found. For a call no one authenticated (yet): Resolve is the
// authenticated caller's.
func (c *Cluster) Lookup(ctx context.Context, id string) (*Session, bool) {
	if s, ok := c.cached(id); ok {
		return s, true
	}
	if !validObjectName(id) || !c.lookRate.Allow() {
		return nil, false
	}
	s, _ := c.readID(ctx, id)
	return s, s != nil
}

// Resolve finds the record of the session ref names for an authenticated
// caller of tenant: by ID, else by the tenant's own name for it (another
// tenant's name never resolves). The informer's table answers first; a
// record it lacks is read from the API server, which holds every record
// the moment its create answered, while the informer's table may lag it
// by seconds (a watch that ended waits 0.8 s and more before it lists
// again). Past the bound of the reads, Resolve waits for the informer to
// bring the record or for the bound to allow a read, at most LookupWait:
// a session made through another node is found, never "not found"
// because the table had not caught up. A session no record names is not
// found (at once while the bound allows the read that says so).
func (c *Cluster) Resolve(ctx context.Context, tenant, ref string) (*Session, bool) {
	if ref == "" {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.opts.lookupWait, LookupWait))
	defer cancel()
	for {
		changed := c.changes() // before the look: an event after it wakes the wait
		if s, ok := c.cached(ref); ok {
			return s, true
		}
		if s, ok := c.byName(tenant, ref); ok {
			return s, true
		}
		r := c.lookRate.Reserve()
		delay := r.Delay()
		var timer *time.Timer
		var tick <-chan time.Time
		switch dl, _ := ctx.Deadline(); {
		case r.OK() && delay == 0:
			if s, err, done := c.readRef(ctx, tenant, ref); done {
				return s, s != nil
			} else if err != nil {
				c.log.Warn("cluster: reading a session's record from the API server failed", "session", ref, "err", err)
			}
			continue // the informer, or the next read
		case r.OK() && time.Until(dl) > delay:
			timer = time.NewTimer(delay)
			tick = timer.C
		default:
			r.Cancel() // not before the wait ends: the informer only
		}
		if c.opts.onWait != nil {
			c.opts.onWait()
		}
		select {
		case <-changed:
			r.Cancel() // the informer may have it now: the read's turn goes back
			if timer != nil {
				timer.Stop()
			}
		case <-tick: // the read reserved is due
			if s, ok := c.cached(ref); ok {
				return s, true
			}
			if s, err, done := c.readRef(ctx, tenant, ref); done {
				return s, s != nil
			} else if err != nil {
				c.log.Warn("cluster: reading a session's record from the API server failed", "session", ref, "err", err)
			}
		case <-ctx.Done():
			r.Cancel()
			if timer != nil {
				timer.Stop()
			}
			return nil, false
		}
	}
}

// readRef reads the record of the session ref names for tenant's caller
// from the API server: by ID, else by the tenant's name. done: the API
// server answered (s nil: no such session), or ctx ended.
func (c *Cluster) readRef(ctx context.Context, tenant, ref string) (s *Session, err error, done bool) {
	if s, err = c.readID(ctx, ref); s != nil || err != nil {
		return s, err, err == nil || ctx.Err() != nil
	}
	s, err = c.readName(ctx, tenant, ref)
	return s, err, err == nil || ctx.Err() != nil
}

// readID reads session id's record from the API server (nil, nil: none).
func (c *Cluster) readID(ctx context.Context, id string) (*Session, error) {
	if !validObjectName(id) {
		return nil, nil
	}
	u, err := c.lookups.Resource(SessionsGVR).Namespace(c.opts.Namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return sessionFrom(u)
}

// readName reads the record of tenant's session named name from the API
// server, found by the label of the hash of its tenant and name
// (LabelTenantName) and checked against both (nil, nil: none).
func (c *Cluster) readName(ctx context.Context, tenant, name string) (*Session, error) {
	if name == "" {
		return nil, nil
	}
	l, err := c.lookups.Resource(SessionsGVR).Namespace(c.opts.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: LabelTenantName + "=" + nameHash(tenant, name)})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		if s, err := sessionFrom(&l.Items[i]); err == nil && s.Spec.Tenant == tenant && s.Spec.Name == name {
			return s, nil
		}
	}
	return nil, nil
}

// byName finds a tenant's session by its name in the informer's table.
func (c *Cluster) byName(tenant, name string) (*Session, bool) {
	objs, err := c.sessions.GetIndexer().ByIndex(byTenantName, tenant+"\x00"+name)
	if err != nil || len(objs) != 1 {
		return nil, false
	}
	s, err := asSession(objs[0])
	return s, err == nil
}

// TenantSessions counts a tenant's sessions on every node.
func (c *Cluster) TenantSessions(tenant string) int {
	objs, _ := c.sessions.GetIndexer().ByIndex(byTenant, tenant)
	return len(objs)
}

// Owned lists the sessions recorded as node's.
func (c *Cluster) Owned(node string) []*Session {
	objs, _ := c.sessions.GetIndexer().ByIndex(byNode, node)
	out := make([]*Session, 0, len(objs))
	for _, o := range objs {
		if s, err := asSession(o); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// Nodes lists the nodes' Leases.
func (c *Cluster) Nodes() []Node {
	var out []Node
	for _, o := range c.leases.GetStore().List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			if n, ok := nodeFromLease(u); ok {
				// The records can be newer than the Lease's count.
				if objs, err := c.sessions.GetIndexer().ByIndex(byNode, n.Name); err == nil {
					n.Sessions = max(n.Sessions, len(objs))
				}
				if n.Name == c.opts.Node && c.draining.Load() {
					n.Draining = true
				}
				out = append(out, n)
			}
		}
	}
	return out
}

// Node finds a node's Lease.
func (c *Cluster) Node(name string) (Node, bool) {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// WaitNode waits until the informer's table holds name's live Lease,
// woken by the informer's events on Leases. A node's own Lease reaches
// its table a moment after its first heartbeat; until then it can place
// no session (ErrNoNode), so a node serves only once it is there.
func (c *Cluster) WaitNode(ctx context.Context, name string) error {
	seen := make(chan struct{}, 1)
	note := func() {
		select {
		case seen <- struct{}{}:
		default:
		}
	}
	reg, err := c.leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { note() },
		UpdateFunc: func(any, any) { note() },
	})
	if err != nil {
		return err
	}
	defer func() { _ = c.leases.RemoveEventHandler(reg) }()
	for {
		if n, ok := c.Node(name); ok && n.Live(time.Now()) {
			return nil
		}
		select {
		case <-seen:
		case <-ctx.Done():
			return fmt.Errorf("cluster: node %s's live Lease is not in this node's table: %w", name, context.Cause(ctx))
		}
	}
}

// validObjectName: an ID that may name an object (a DNS subdomain); any
// other is no session's, and is not sent to the API server.
func validObjectName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '.') {
			return false
		}
	}
	return true
}

// Record writes a session's record owned by this node: created when new,
// else its spec and status set, retried from a fresh read on a conflict
// (another node's write in between wins the race and is read again).
func (c *Cluster) Record(ctx context.Context, want *Session) error {
	_, err := c.record(ctx, want, false)
	return err
}

// record is Record; with specOnly, no status is written (a write of its
// own, the status subresource's): statusDue reports a record made, or
// found with another status, whose status the caller writes later
// (Member.SyncRecords).
func (c *Cluster) record(ctx context.Context, want *Session, specOnly bool) (statusDue bool, err error) {
	if !validObjectName(want.Name) {
		return false, fmt.Errorf("cluster: session ID %q cannot name an object", want.Name)
	}
	res := c.dyn.Resource(SessionsGVR).Namespace(c.opts.Namespace)
	// A record the informer has never seen is most likely new: created
	// at once, without a read first (a create's answer waits for it); if
	// it exists after all, the read and update below.
	_, seen := c.cached(want.Name)
	fresh := !seen
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		statusDue = false
		var cur *unstructured.Unstructured
		var err error = apierrors.NewNotFound(SessionsGVR.GroupResource(), want.Name)
		if !fresh {
			cur, err = res.Get(ctx, want.Name, metav1.GetOptions{})
		}
		fresh = false // a conflict's retry reads first
		if apierrors.IsNotFound(err) {
			s := *want
			s.Namespace = c.opts.Namespace
			s.Labels = recordLabels(want.Spec)
			u, err := s.toUnstructured()
			if err != nil {
				return err
			}
			made, err := res.Create(ctx, u, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(SessionsGVR.GroupResource(), want.Name, err)
			}
			if err != nil {
				return err
			}
			if specOnly {
				statusDue = true
				return nil
			}
			return c.writeStatus(ctx, made, want.Status)
		}
		if err != nil {
			return err
		}
		have, err := sessionFrom(cur)
		if err != nil {
			return err
		}
		if have.Spec != want.Spec || !labeled(have) {
			have.Spec = want.Spec
			have.Labels = recordLabels(want.Spec)
			u, err := have.toUnstructured()
			if err != nil {
				return err
			}
			if cur, err = res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				return err // a conflict: retried from a fresh read
			}
		}
		if have.Status != want.Status {
			if specOnly {
				statusDue = true
				return nil
			}
			return c.writeStatus(ctx, cur, want.Status)
		}
		return nil
	})
	return statusDue, err
}

// labeled reports whether s has the labels of its spec (recordLabels): a
// record an older node wrote lacks LabelTenantName.
func labeled(s *Session) bool {
	want := recordLabels(s.Spec)
	if len(s.Labels) != len(want) {
		return false
	}
	for k, v := range want {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

// writeStatus sets the status subresource of cur (its resourceVersion
// makes a concurrent write a conflict).
func (c *Cluster) writeStatus(ctx context.Context, cur *unstructured.Unstructured, st SessionStatus) error {
	s, err := sessionFrom(cur)
	if err != nil {
		return err
	}
	s.Status = st
	u, err := s.toUnstructured()
	if err != nil {
		return err
	}
	_, err = c.dyn.Resource(SessionsGVR).Namespace(c.opts.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// Forget deletes a session's record if node still owns it (a record
// another node took over is left to that node).
func (c *Cluster) Forget(ctx context.Context, id, node string) error {
	res := c.dyn.Resource(SessionsGVR).Namespace(c.opts.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := res.Get(ctx, id, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		s, err := sessionFrom(cur)
		if err != nil {
			return err
		}
		if s.Spec.Node != node {
			return nil
		}
		rv := cur.GetResourceVersion()
		err = res.Delete(ctx, id, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// Heartbeat creates or renews this node's Lease with its headroom. The
// first renewal of a start acquires the Lease anew (its acquireTime is
// this start's, and leaseTransitions counts the starts), as a new holder
// of any Lease does: the other nodes tell this start from the previous
// one by it (Node.Acquired).
func (c *Cluster) Heartbeat(ctx context.Context, h Node) error {
	res := c.dyn.Resource(LeasesGVR).Namespace(c.opts.Namespace)
	if c.opts.TLS != nil {
		h.Pin = c.opts.TLS.Pin()
	}
	h.Acquired = c.acquired
	want := leaseObject(c.opts.Namespace, c.opts.Node, c.opts.Address, c.opts.LeaseTTL, h, time.Now())
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := res.Get(ctx, want.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = res.Create(ctx, want, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		n, _, _ := unstructured.NestedInt64(cur.Object, "spec", "leaseTransitions")
		if !leaseTime(cur, "acquireTime").Equal(leaseTime(want, "acquireTime")) {
			n++ // this start acquires it
		}
		cur.SetLabels(want.GetLabels())
		cur.SetAnnotations(want.GetAnnotations())
		cur.Object["spec"] = want.Object["spec"]
		if n > 0 {
			_ = unstructured.SetNestedField(cur.Object, n, "spec", "leaseTransitions")
		}
		_, err = res.Update(ctx, cur, metav1.UpdateOptions{}) // cur's resourceVersion: a conflict retries
		return err
	})
}

// leaseObject is the Lease of node at address with headroom h, renewed at
// now.
func leaseObject(ns, node, address string, ttl time.Duration, h Node, now time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": LeasePrefix + node, "namespace": ns},
		"spec": map[string]any{
			"holderIdentity":       node,
			"leaseDurationSeconds": int64(ttl / time.Second),
			"renewTime":            metav1.NewMicroTime(now).Format(metav1.RFC3339Micro),
		},
	}}
	if !h.Acquired.IsZero() {
		u.Object["spec"].(map[string]any)["acquireTime"] = metav1.NewMicroTime(h.Acquired).Format(metav1.RFC3339Micro)
	}
	u.SetLabels(map[string]string{LabelComponent: ComponentNode, LabelNode: node})
	u.SetAnnotations(map[string]string{
		AnnotAddress:  address,
		AnnotSessions: strconv.Itoa(h.Sessions),
		AnnotMaxSess:  strconv.Itoa(h.MaxSessions),
		AnnotMemAvail: strconv.FormatInt(h.MemAvail, 10),
		AnnotMemTotal: strconv.FormatInt(h.MemTotal, 10),
		AnnotReserve:  strconv.FormatInt(h.SessionReserve, 10),
		AnnotDraining: strconv.FormatBool(h.Draining),
	})
	if h.Pin != "" {
		an := u.GetAnnotations()
		an[AnnotPin] = h.Pin
		u.SetAnnotations(an)
	}
	if h.Probe {
		an := u.GetAnnotations()
		an[AnnotProbe] = "true"
		u.SetAnnotations(an)
	}
	return u
}

// cached is a session's record as the informer holds it.
func (c *Cluster) cached(id string) (*Session, bool) {
	obj, ok, err := c.sessions.GetStore().GetByKey(c.opts.Namespace + "/" + id)
	if err != nil || !ok {
		return nil, false
	}
	s, err := asSession(obj)
	return s, err == nil
}

// SecretsGVR is the Secrets of the namespace.
var SecretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// ForwardKeySecret is the Secret that holds the cluster's forwarding key
// (in data.key).
const ForwardKeySecret = "quro-forwarding-key"

// E2BKeySecret is the Secret that holds the cluster's E2B key (in
// data.key): the secret every node derives the E2B sandboxes' access
// tokens from (e2b.Options.Secret), so that a token, and a signed URL
// made with it, opens its sandbox on whichever node holds it now.
const E2BKeySecret = "quro-e2b-key"

const sharedKeyField = "key"

// ForwardKey is the cluster's forwarding key (Router.Key), shared by
// every node through the Secret ForwardKeySecret (sharedKey).
func (c *Cluster) ForwardKey(ctx context.Context) ([]byte, error) {
	return c.sharedKey(ctx, ForwardKeySecret, "forwarding", "forwarding key")
}

// E2BKey is the cluster's E2B key, shared by every node through the
// Secret E2BKeySecret (sharedKey). Apart from the forwarding key: either
// is replaced alone (deleting the Secret and restarting the nodes), and
// replacing this one ends every E2B access token handed out.
func (c *Cluster) E2BKey(ctx context.Context) ([]byte, error) {
	return c.sharedKey(ctx, E2BKeySecret, "e2b", "E2B key")
}

// sharedKey is the key in the Secret name of the namespace: read when
// there, else made by this node (32 random bytes), labeled component.
// Two nodes that start at once both try to create it; the API server
// takes one, and the other reads it.
func (c *Cluster) sharedKey(ctx context.Context, name, component, what string) ([]byte, error) {
	res := c.dyn.Resource(SecretsGVR).Namespace(c.opts.Namespace)
	for range 3 {
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			enc, _, _ := unstructured.NestedString(u.Object, "data", sharedKeyField)
			key, err := base64.StdEncoding.DecodeString(enc)
			if err != nil || len(key) < 32 {
				return nil, fmt.Errorf("cluster: Secret %s/%s holds no key of 32 bytes or more in data.%s", c.opts.Namespace, name, sharedKeyField)
			}
			return key, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("cluster: reading the %s: %w", what, err)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		s := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
			"metadata": map[string]any{"name": name, "namespace": c.opts.Namespace,
				"labels": map[string]any{LabelComponent: component}},
			"data": map[string]any{sharedKeyField: base64.StdEncoding.EncodeToString(key)},
		}}
		_, err = res.Create(ctx, s, metav1.CreateOptions{})
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("cluster: making the %s: %w", what, err)
		}
		// Another node made it first: read it.
	}
	return nil, fmt.Errorf("cluster: the %s's Secret %s was made and removed again three times", what, name)
}

// listNodes reads every node's Lease from the API server (NodeTLS's
// reads, when the table lacks a pin), by name.
func (c *Cluster) listNodes(ctx context.Context) (map[string]Node, error) {
	l, err := c.lookups.Resource(LeasesGVR).Namespace(c.opts.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: LabelComponent + "=" + ComponentNode})
	if err != nil {
		return nil, err
	}
	out := make(map[string]Node, len(l.Items))
	for i := range l.Items {
		if n, ok := nodeFromLease(&l.Items[i]); ok {
			out[n.Name] = n
		}
	}
	return out, nil
}
