package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/cluster"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/events"
	"github.com/quro-dev/quro/internal/session"
)

// clusterFlags are serve's flags of cluster mode (docs/kubernetes.md).
type clusterFlags struct {
	on         bool
	namespace  string
	node       string
	address    string
	listen     string // the node port's address (node traffic, mutual TLS)
	kubeconfig string
	leaseTTL   time.Duration
	reserve    int64
}

func (c *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&c.on, "cluster", false, "run as one node of a Quro cluster on Kubernetes: sessions recorded as sessions.quro.dev objects, new ones placed on the node with the most headroom, every call forwarded to its session's node (docs/kubernetes.md)")
	cmd.Flags().StringVar(&c.namespace, "cluster-namespace", "", "the namespace of the cluster's records (default: $POD_NAMESPACE, else the service account's)")
	cmd.Flags().StringVar(&c.node, "node-name", "", "this node's name in the cluster (default: $POD_NAME)")
	cmd.Flags().StringVar(&c.listen, "node-listen", "0.0.0.0:7071", "the node port: where this node takes the other nodes' traffic (forwarded calls, drains' moves), over mutual TLS with the certificates the nodes' Leases pin; keep it out of the Service")
	cmd.Flags().StringVar(&c.address, "node-address", "", "host:port where the other nodes reach this one's node port (default: $POD_IP and --node-listen's port; a port 0 is the port --node-listen got)")
	cmd.Flags().StringVar(&c.kubeconfig, "kubeconfig", "", "a kubeconfig file for the API server (default: the pod's service account)")
	cmd.Flags().Int64Var(&c.reserve, "node-session-memory", cluster.DefaultSessionReserve, "bytes of memory this node reserves per session when the cluster places new ones (as a Kubernetes request): its headroom is its memory less this much per session it holds; its live available memory only stops new sessions under 5% of its memory")
	cmd.Flags().DurationVar(&c.leaseTTL, "node-lease", cluster.DefaultLeaseTTL, "how long this node's Lease holds without renewal; a node silent this long gets no new sessions and calls for its sessions are answered 503 with Retry-After")
}

// resolve fills the defaults from the pod's environment.
// A --node-address whose port is 0 takes the port the node port listens on.
func (c *clusterFlags) resolve(listening net.Addr) (*rest.Config, error) {
	if c.namespace == "" {
		c.namespace = os.Getenv("POD_NAMESPACE")
	}
	if c.namespace == "" {
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
			c.namespace = strings.TrimSpace(string(b))
		}
	}
	if c.node == "" {
		c.node = os.Getenv("POD_NAME")
	}
	if c.address == "" {
		if ip := os.Getenv("POD_IP"); ip != "" {
			_, port, err := net.SplitHostPort(c.listen)
			if err != nil {
				return nil, fmt.Errorf("--node-listen %q: %v", c.listen, err)
			}
			c.address = net.JoinHostPort(ip, port)
		}
	}
	if host, port, err := net.SplitHostPort(c.address); err == nil && port == "0" {
		if _, lport, err := net.SplitHostPort(listening.String()); err == nil {
			c.address = net.JoinHostPort(host, lport)
		}
	}
	switch {
	case c.namespace == "":
		return nil, errors.New("--cluster needs --cluster-namespace or $POD_NAMESPACE")
	case c.node == "":
		return nil, errors.New("--cluster needs --node-name or $POD_NAME")
	case c.address == "":
		return nil, errors.New("--cluster needs --node-address or $POD_IP")
	case c.reserve <= 0:
		return nil, fmt.Errorf("--node-session-memory %d: a session's reservation must be more than 0 bytes", c.reserve)
	}
	if c.kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	}
	return rest.InClusterConfig()
}

// clusterNode is a running node: its view of the cluster and the sync of
// its own records.
type clusterNode struct {
	c      *cluster.Cluster
	member *cluster.Member
	limit  int // a tenant's sessions across the cluster (0: none), unless its own ceilings say (tenantLimit)
	// own are a tenant's own ceilings, the cluster's (app.TenantOwnLimits).
	own func(ctx context.Context, tenant string) (app.TenantLimits, error)
	key []byte // the cluster's forwarding key (Router.Key)
	tls *cluster.NodeTLS
	// e2bKey is the cluster's E2B key (Cluster.E2BKey), the secret of
	// every node's E2B access tokens; nil when the E2B routes are off.
	e2bKey  []byte
	drainer *cluster.Drainer
	// audit records a drain and each of its moves (App.AuditAction).
	audit func(context.Context, *controller.Record)
	// E2B's signed /files URLs that name no sandbox (Router.SignedFiles,
	// Router.SignedLocal), set when the E2B routes are on.
	signedFiles func(*http.Request) bool
	signedLocal func(*http.Request) string
	rt          *cluster.Router // set by router
}

// peerEvents is ws.Options.Peers: the other nodes' live events, through
// the router (set before the server serves).
func (n *clusterNode) peerEvents(ctx context.Context, cred string, ready func(joined, unanswered []string), send func(events.Event) bool) {
	n.rt.PeerEvents(ctx, cred, ready, send)
}

// joinCluster connects a to the cluster, syncs its records once and keeps
// them synced until ctx ends.
// With withE2B it reads the cluster's E2B key too.
func joinCluster(ctx context.Context, cfg *rest.Config, cf *clusterFlags, a *app.App, maxSessions, perTenant int, withE2B bool, log *slog.Logger) (*clusterNode, error) {
	// A key pair of this start's own: its pin goes into the Lease.
	ntls, err := cluster.NewNodeTLS(cf.node)
	if err != nil {
		return nil, err
	}
	c, err := cluster.New(cluster.Options{Config: cfg, Namespace: cf.namespace, Node: cf.node, Address: cf.address,
		LeaseTTL: cf.leaseTTL, Logger: log, TLS: ntls})
	if err != nil {
		return nil, err
	}
	// The informers run for the node's life (ctx), the first list
	// bounded on its own.
	if err := c.Start(ctx, time.Minute); err != nil {
		return nil, err
	}
	// A tenant's ceilings are the cluster's (tenants.quro.dev), read
	// through the informer by the app's one tenant-limit layer; a change
	// another node wrote is applied here at once (a larger disk quota
	// grows the tenant's sessions here).
	if err := a.UseTenantLimitsSource(ctx, c, "the cluster's tenants.quro.dev objects (namespace "+cf.namespace+")"); err != nil {
		return nil, err
	}
	if err := c.OnTenantChange(func(tenant string) { go a.TenantLimitsChanged(ctx, tenant) }); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	key, err := c.ForwardKey(sctx)
	if err != nil {
		return nil, err
	}
	// One E2B key for the cluster, not a node's own (e2b.key in its data
	// directory): a sandbox a drain moves keeps the access token it was
	// given, and any node checks it.
	var e2bKey []byte
	if withE2B {
		if e2bKey, err = c.E2BKey(sctx); err != nil {
			return nil, err
		}
	}
	mover := a.Mover()
	m := &cluster.Member{C: c, MaxSessions: max(maxSessions, 0), SessionReserve: cf.reserve, List: localSessions(a),
		MovedAway: mover.Release}
	if err := m.Sync(sctx); err != nil {
		return nil, fmt.Errorf("cluster: the first sync with the API server: %w", err)
	}
	// The first sync wrote this node's Lease; until the informer brings
	// it back, a create here would find no live node (503). The node
	// serves once it can place.
	if err := c.WaitNode(sctx, cf.node); err != nil {
		return nil, err
	}
	go m.Run(ctx, 0)
	log.Info("quro cluster node", "node", cf.node, "namespace", cf.namespace, "address", cf.address)
	n := &clusterNode{c: c, member: m, limit: max(perTenant, 0), own: a.TenantOwnLimits, key: key, e2bKey: e2bKey, tls: ntls,
		drainer: &cluster.Drainer{C: c, Member: m, Local: mover, Key: key, TLS: ntls}, audit: a.AuditAction}
	n.drainer.Adopted = n.auditAdopted
	return n, nil
}

// localSessions lists a's sessions of every tenant, spares left out.
func localSessions(a *app.App) func(ctx context.Context) ([]cluster.LocalSession, error) {
	return func(ctx context.Context) ([]cluster.LocalSession, error) {
		all, err := a.Sessions.AllTenants(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]cluster.LocalSession, 0, len(all))
		for _, s := range all {
			if s.Tenant == session.SpareTenant {
				continue
			}
			out = append(out, cluster.LocalSession{ID: s.ID, Tenant: s.Tenant, Name: s.Name, Network: s.Network,
				Rootfs: s.Rootfs, Created: s.CreatedAt})
		}
		return out, nil
	}
}

// tenantLimit is Router.TenantLimit: tenant's sessions across the
// cluster, its own session ceiling when the operator set one (negative:
// none), else the node's --max-sessions-per-tenant. Ceilings that cannot
// be read leave the node's: the owner refuses the create (unavailable).
func (n *clusterNode) tenantLimit(tenant string) int {
	own, err := n.own(context.Background(), tenant)
	switch {
	case err != nil || own.Sessions == 0:
		return n.limit
	case own.Sessions < 0:
		return 0
	}
	return int(min(own.Sessions, math.MaxInt32))
}

// router puts the cluster's routing in front of h.
// refs find the sessions that requests name by their Host.
// The controller forwards every call for a session another node owns
// (MCP's, the stream's) through the same router (Router.Forward).
func (n *clusterNode) router(ctl *controller.Controller, h http.Handler, authFn httpauth.Func, refs []func(*http.Request) string, log *slog.Logger) http.Handler {
	rt := &cluster.Router{Table: n.c, Next: h, Auth: authFn, Logger: log, Refs: refs, Key: n.key, TLS: n.tls, Registry: ctl.Registry(),
		TenantLimit: n.tenantLimit,
		Changed: func(ctx context.Context) {
			if err := n.member.SyncRecords(context.WithoutCancel(ctx)); err != nil {
				log.Warn("cluster: recording a session change failed", "err", err)
			}
		},
		Used:        n.member.Used,
		Quiesced:    n.drainer.Quiesced,
		SignedFiles: n.signedFiles,
		SignedLocal: n.signedLocal,
	}
	ctl.SetForward(rt.Forward, rt.Served)
	n.rt = rt
	return rt
}

// listenNode opens the node port (--node-listen), before the cluster is
// joined: its port goes into the Lease's address.
func (c *clusterFlags) listenNode() (net.Listener, error) {
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("--node-listen: %w", err)
	}
	return ln, nil
}

// serveNode serves the node port on ln until ctx ends: the same routes
// as srv's (the router takes a forwarded call as from the public port),
// over TLS that takes a node's client certificate alone (NodeTLS).
func (n *clusterNode) serveNode(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) (stop func()) {
	nsrv := &http.Server{
		Handler:           srv.Handler,
		ReadHeaderTimeout: srv.ReadHeaderTimeout,
		IdleTimeout:       srv.IdleTimeout,
		ConnContext: func(cctx context.Context, c net.Conn) context.Context {
			if srv.ConnContext != nil {
				cctx = srv.ConnContext(cctx, c)
			}
			return cluster.NodePortContext(cctx, c)
		},
		// A peer whose certificate its Lease does not pin fails the
		// handshake: logged by the server at Debug, not per attempt at Warn.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := nsrv.Serve(tls.NewListener(ln, n.tls.ServerConfig())); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("cluster: the node port stopped", "err", err)
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := nsrv.Shutdown(sctx); err != nil {
			nsrv.Close()
		}
		<-done
	}
}
