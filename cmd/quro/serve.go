package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/quro-dev/quro/internal/api/e2b"
	"github.com/quro-dev/quro/internal/api/httpauth"
	"github.com/quro-dev/quro/internal/api/insession"
	quromcp "github.com/quro-dev/quro/internal/api/mcp"
	"github.com/quro-dev/quro/internal/api/rest"
	"github.com/quro-dev/quro/internal/api/streamcap"
	"github.com/quro-dev/quro/internal/api/ws"
	"github.com/quro-dev/quro/internal/app"
	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/connlimit"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/engine/python"
	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/rootfs"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/session"
	"github.com/quro-dev/quro/internal/version"
	"github.com/quro-dev/quro/internal/web"
)

// AdminTokenFile is where the first admin token is kept, in the data
// directory, readable by its owner only.
const AdminTokenFile = "admin.token"

// serveFlags are quro serve's flags.
type serveFlags struct {
	addr           string
	patrol         time.Duration
	noAuth         bool
	origins, hosts []string
	tenantLimits   app.TenantLimits
	maxConns       int
	maxConnsPerIP  int
	maxStreams     int
	streamIdle     time.Duration
	autoPause      time.Duration
	pythonIdle     time.Duration
	prestart       bool
	logs           logFlags
	pprofAddr      string
	spares         int
	maxSpares      int
	sparesTenant   int
	maxDisks       int
	maxSessions    int
	maxPerTenant   int
	pipIndex       string
	pipExtra       []string
	network        app.NetworkOptions
	e2bOn          bool
	e2bDomain      string
	cluster        clusterFlags
	tokensFile     string
	boxCPUWeight   int          // --box-cpu-weight, on cpu.weight's scale; 0: off
	node           *clusterNode // in cluster mode: set by runServe before server
}

func newServeCmd(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve every capability over HTTP: REST, WebSocket, MCP and metrics",
		Long: `Serve the capabilities over HTTP:
  /v1/...        REST (POST /v1/{capability}, /v1/sessions/..., /v1/openapi.json)
                 and WebSocket (/v1/sessions/{id}/pty, /v1/stream/{capability})
  /mcp           MCP over streamable HTTP
  /metrics       Prometheus metrics
  /e2b/...       E2B's API, for the e2b SDKs (docs/e2b.md; requests with an
                 E2b-Sandbox-Id header go to that sandbox's envd or code
                 interpreter)
  /              the web UI (sign in with a token)
Every request needs "Authorization: Bearer <token>". On the first start an
admin token for the local tenant is created, printed once and kept in
<data>/admin.token (mode 0600); quro token create makes more.
--no-auth trusts every caller and is refused unless the address is loopback.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd, g, f) },
	}
	f.register(cmd)
	return local(cmd, "an access path: serves the controller over REST, MCP and WebSocket; every call through it is audited with its path")
}

// register declares serve's flags on cmd.
func (f *serveFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "addr", "127.0.0.1:7070", "listen address")
	cmd.Flags().BoolVar(&f.noAuth, "no-auth", false, "trust every caller (admin, local tenant); only on a loopback address")
	cmd.Flags().StringSliceVar(&f.origins, "allow-origin", nil, "browser origins allowed besides the server's own (https://ui.example:8443; * for any)")
	cmd.Flags().StringSliceVar(&f.hosts, "allow-host", nil, "Host names the server answers to besides loopback names and its address (* for any)")
	cmd.Flags().IntVar(&f.maxConns, "max-conns", 4096, "most HTTP connections held at once (lowered to fit the open-file limit); over it, the oldest connection that sent no authenticated request is closed")
	cmd.Flags().IntVar(&f.maxConnsPerIP, "max-conns-per-ip", 256, "most HTTP connections of one client address (an IPv6 /64)")
	cmd.Flags().IntVar(&f.maxStreams, "max-streams-per-token", streamcap.DefaultMax, "most streams one token holds at once: WebSocket connections (terminals, streamed runs), MCP event streams and, with --e2b, E2B's long requests (envd's process and watch streams, /files, /execute); past it a new one is refused with 429; 0: no cap")
	cmd.Flags().DurationVar(&f.streamIdle, "stream-idle-timeout", ws.DefaultIdleTimeout, "close a WebSocket, or end an MCP event stream, whose client has not answered a ping for this long (pinged every quarter of it); with --e2b, end a long E2B request whose client sends nothing or takes no write for this long")
	cmd.Flags().DurationVar(&f.patrol, "patrol", 15*time.Second, "supervisor interval: restart the default shell, stop idle shells, kill orphans")
	cmd.Flags().DurationVar(&f.autoPause, "auto-pause", app.DefaultAutoPause, "pause a session's box (freeze its processes, keep their state) after it is unused this long; 0 or negative: never")
	cmd.Flags().DurationVar(&f.pythonIdle, "python-idle", python.DefaultIdleTimeout, "release a session's Python worker (about 7 MiB) after it ran nothing for this long; its next run starts a fresh interpreter and says that the variables of earlier runs are gone (a paused session keeps its worker)")
	cmd.Flags().IntVar(&f.spares, "spare-sessions", 1, "spare sessions (a box and a started Python worker each, about 12 MiB) kept ready per tenant and network policy when idle, so that a new session's first Python run finds them; the pool grows past it under a burst of creates and shrinks back when idle; 0: none")
	cmd.Flags().IntVar(&f.maxSpares, "max-spare-sessions", app.MachineMaxSpareSessions(), "most spare sessions of all tenants together, ready and being made, however the pool grows under bursts (default: one per 384 MiB of the machine's memory, 4 to 256); 0: no spare sessions")
	cmd.Flags().IntVar(&f.sparesTenant, "max-spare-sessions-per-tenant", 0, "most spare sessions of one tenant, so that one tenant's burst cannot take every spare (0: a quarter of --max-spare-sessions)")
	cmd.Flags().IntVar(&f.maxDisks, "max-session-disks", 0, "most sessions' disk images (ext4, loop-mounted: one of the host's loop devices each; the fallback: subvolumes of the shared btrfs filesystem need no cap) of all tenants together, a tenant's share a quarter of them; past it a new session is refused with 429; 0: one per session of --max-sessions, a tenant's share its session ceiling; negative: no cap")
	cmd.Flags().IntVar(&f.maxSessions, "max-sessions", 0, "most sessions of all tenants together; past it a new session is refused with 429; 0: derived from the machine (the lowest of what its memory, open-file limit and kernel tasks hold: quro doctor shows it); negative: no cap")
	cmd.Flags().IntVar(&f.maxPerTenant, "max-sessions-per-tenant", 0, "most sessions of one tenant (quro tenant limits set --sessions overrides it for one); past it a new session is refused with 429; 0: as --max-sessions; negative: no cap")
	cmd.Flags().BoolVar(&f.prestart, "prestart-python", true, "start a new session's Python worker as the session is created, so that its first Python run finds it ready")
	cmd.Flags().StringVar(&f.pipIndex, "pip-index-url", "", "the Python package index (PEP 503 simple API) pip uses in sessions with network, and the one the server fetches wheels from for install_packages {manager: pip}; default pip's (https://pypi.org/simple). A session may set PIP_INDEX_URL for its own pip; the server never fetches from it")
	cmd.Flags().StringArrayVar(&f.pipExtra, "pip-extra-index-url", nil, "another index for pip, as --pip-index-url (repeatable)")
	f.logs.register(cmd)
	cmd.Flags().StringVar(&f.network.Default, "network-default", "none", "network policy of a session that names none: none (its box's loopback only), internet (public addresses through the server's egress) or host")
	cmd.Flags().StringVar(&f.network.Max, "network-max", "internet", "the most network any session may ask for: none, internet or host (the host's own network namespace: its loopback, this server's port, private networks; only for trusted tenants)")
	cmd.Flags().StringArrayVar(&f.network.Trusted, "network-allow-private", nil, "an exception to the egress's refusal of private, loopback and this host's addresses for sessions with network internet: HOST:PORT (connected to whatever it resolves to) or a CIDR (repeatable)")
	cmd.Flags().BoolVar(&f.e2bOn, "e2b", true, "serve E2B's APIs, so that code using the e2b and @e2b/code-interpreter SDKs runs here (docs/e2b.md): the control plane at /e2b, sandboxes by the E2b-Sandbox-Id header")
	cmd.Flags().StringVar(&f.network.PreviewDomain, "preview-domain", "", "give each preview URL a host name of its own, PORT-ID.DOMAIN (its own browser origin; needs wildcard DNS for *.DOMAIN to this server): DOMAIN, DOMAIN:PORT, or with the scheme of the URLs get_preview_url gives, http://DOMAIN:PORT (default https, TLS in front)")
	cmd.Flags().BoolVar(&f.network.PreviewPublic, "preview-public", false, "let a session's creator make its ports public (get_preview_url {public: true}, E2B's network.allowPublicTraffic): anyone reaches them on their host name, PORT-ID.DOMAIN, with no token; needs --preview-domain or --e2b-domain (a public page never runs on this server's own origin); off: every preview needs a token or a signed URL")
	cmd.Flags().StringVar(&f.e2bDomain, "e2b-domain", "", "also route E2B requests by host, as E2B's cloud: api.DOMAIN and PORT-ID.DOMAIN (needs wildcard DNS and, for the SDKs' https URLs, TLS in front)")
	cmd.Flags().StringVar(&f.pprofAddr, "pprof", "", "serve Go's profiler (/debug/pprof/) on this loopback address (127.0.0.1:6060), to the operator's token only; off by default")
	f.cluster.register(cmd)
	cmd.Flags().StringVar(&f.tokensFile, "tokens-file", "", "add the tokens listed in this file at start, one a line: TOKEN TENANT SCOPES [LABEL] (TENANT - for the local tenant); every node of a cluster reads the same file, a mounted Secret, so that a token works on any node")
	tenantLimitFlags(cmd, "tenant-", &f.tenantLimits) // defaults of every tenant; quro tenant limits set overrides one
	f.boxCPUWeight = sandbox.MachineBoxCPUWeight()
	cmd.Flags().Var(cpuWeightFlag{&f.boxCPUWeight}, "box-cpu-weight", boxCPUWeightUsage())
}

// runServe is quro serve: it opens the App, listens, serves until the
// command's context ends, then shuts the server down. Its defers close
// what it opened in the reverse order: the serve marker, the profiler,
// the App, the loggers.
func runServe(cmd *cobra.Command, g *globals, f *serveFlags) error {
	if err := f.check(); err != nil {
		return err
	}
	loggers, err := f.logs.loggers(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	defer loggers.close()
	log := loggers.log
	opts := f.appOptions(g, log)
	fdLimit := raiseFileLimit(log)
	caps := connCaps(fdLimit, f.maxConns, f.maxConnsPerIP)
	// Each session's boxes get a socket of that session's, so its
	// code can call back (quro call) as its own session: wired by
	// app.New, before the first box is made.
	opts.InSession = inSessionOptions(caps.insession, log)
	a, err := app.New(cmd.Context(), g.dataDir, opts)
	if err != nil {
		return err
	}
	defer a.Close()
	go a.PreparePython(cmd.Context()) // in the background from the start, logged
	watchInSession(a, caps.insession)
	authFn, err := f.auth(cmd, a, log)
	if err != nil {
		return err
	}
	if f.pprofAddr != "" {
		stop, err := servePprof(f.pprofAddr, authFn, log, cmd.OutOrStdout())
		if err != nil {
			return err
		}
		defer stop()
	}
	if f.tokensFile != "" {
		n, err := a.ImportTokens(cmd.Context(), f.tokensFile)
		if err != nil {
			return fmt.Errorf("--tokens-file: %w", err)
		}
		log.Info("tokens imported", "file", f.tokensFile, "tokens", n)
	}
	authFn = notingTenant(authFn) // for the access log
	ln, err := listen(f.addr, caps, log)
	if err != nil {
		return err
	}
	var nodeLn net.Listener
	if f.cluster.on {
		if nodeLn, err = f.cluster.listenNode(); err != nil {
			return err
		}
		// Any pod may reach the node port: its connections, handshakes
		// unfinished included, are held to the public port's caps (a
		// forwarding node counts against its address's, as it did on
		// the public port).
		nodeLn = connlimit.New(nodeLn, &connlimit.Options{Name: "node", Max: caps.max, PerPeer: caps.perIP, Logger: log})
		defer nodeLn.Close()
		cfg, err := f.cluster.resolve(nodeLn.Addr())
		if err != nil {
			return err
		}
		if f.node, err = joinCluster(cmd.Context(), cfg, &f.cluster, a, f.maxSessions, f.maxPerTenant, f.e2bOn, log); err != nil {
			return err
		}
	} else if err := a.UseStoreTenantLimits(cmd.Context()); err != nil { // a former node's data directory: its own ceilings again
		return err
	}
	watchConns(a.Metrics, ln)
	go watchFDs(cmd.Context(), log, fdLimit, f.patrol)
	// Probe engines and isolation now, not on the first request.
	go func() { _, _ = a.Status(context.WithoutCancel(cmd.Context())) }() // a warm-up: nobody waits for its answer
	go a.Supervise(cmd.Context(), f.patrol)

	srv, wsrv, err := f.server(a, authFn, caps.max, log)
	if err != nil {
		return err
	}
	loggers.serve(srv)
	if f.node != nil {
		defer f.node.serveNode(cmd.Context(), srv, nodeLn, log)()
	}
	log.Info("quro serving", "url", "http://"+ln.Addr().String(), "data", a.DataDir, "version", version.String(),
		"isolation", a.Sandbox.Isolation(), "auth", !f.noAuth)
	// <data>/run/serve.json: the CLI on this data directory goes
	// through this server (written before the address is printed).
	defer writeServeMarker(a.DataDir, ln.Addr(), log)()
	fmt.Fprintf(cmd.OutOrStdout(), "quro listening on http://%s\n", ln.Addr())
	if !rootfs.New(rootfs.DirIn(a.DataDir)).Ready(rootfs.CodeInterpreter) {
		fmt.Fprintf(cmd.OutOrStdout(), "for numpy, pandas, matplotlib, scipy and scikit-learn in sessions (and E2B's code-interpreter template): quro rootfs install %s\n", rootfs.CodeInterpreter)
	}
	return serveUntilDone(cmd.Context(), srv, ln, wsrv, log)
}

// check refuses flags that may not go together: --no-auth off loopback,
// --pprof on a non-loopback address.
func (f *serveFlags) check() error {
	if f.noAuth {
		if err := checkLoopback(f.addr); err != nil {
			return err
		}
	}
	if f.pprofAddr != "" {
		if err := checkPprofAddr(f.pprofAddr); err != nil {
			return err
		}
	}
	if f.network.PreviewPublic && f.network.PreviewDomain == "" && (!f.e2bOn || f.e2bDomain == "") {
		return errors.New("--preview-public needs --preview-domain (or --e2b-domain): a public preview is served on a host name of its own, never on this server's own origin, whose API its page could script")
	}
	return nil
}

// appOptions are the App's options from the global flags and serve's own
// (all but InSession, which needs the connection budget).
func (f *serveFlags) appOptions(g *globals, log *slog.Logger) *app.Options {
	opts := g.options(log)
	opts.Limits.Tenant = f.tenantLimits
	opts.AutoPause = f.autoPause
	opts.PrestartPython = f.prestart
	opts.Python.IdleTimeout = f.pythonIdle
	opts.SpareSessions = f.spares
	opts.MaxSpareSessions, opts.SparesPerTenant = f.maxSpares, f.sparesTenant
	if f.maxSpares <= 0 {
		opts.SpareSessions = 0 // off
	}
	opts.Limits.SessionDisks = f.maxDisks
	opts.Limits.Sessions, opts.Limits.SessionsPerTenant = f.maxSessions, f.maxPerTenant
	opts.Pip = app.PipOptions{IndexURL: f.pipIndex, ExtraIndexURLs: f.pipExtra}
	opts.Network = f.network
	opts.Sandbox.BoxCPUWeight = f.boxCPUWeight
	return opts
}

// inSessionOptions serve the REST API on each session's own socket, at
// most maxConns connections, every call authenticated as that session.
func inSessionOptions(maxConns int, log *slog.Logger) *app.InSessionOptions {
	return &app.InSessionOptions{MaxConns: maxConns,
		Handler: func(ctrl *controller.Controller, sessions *session.Manager) http.Handler {
			resolver := &insession.Resolver{Sessions: sessions}
			return rest.New(ctrl, &rest.Options{Logger: log, Access: rest.Access{Auth: resolver.Auth}})
		}}
}

// watchInSession reports the in-session sockets' connections as the
// "insession" metrics, against their cap maxConns.
func watchInSession(a *app.App, maxConns int) {
	inSession := a.InSession
	a.Metrics.WatchConnections("insession", func() metrics.ConnStats {
		st := inSession.Stats()
		return metrics.ConnStats{Open: st.Open, Pending: st.Pending, Max: maxConns,
			RefusedTotal: st.RefusedTotal, RefusedPeer: st.RefusedPeer, RefusedShare: st.RefusedShare, Evicted: st.Evicted}
	})
}

// auth is how serve authenticates a request: by token, the first admin
// token created (and printed once) if there is none; with --no-auth,
// everyone is the admin.
func (f *serveFlags) auth(cmd *cobra.Command, a *app.App, log *slog.Logger) (httpauth.Func, error) {
	authFn := httpauth.Func(httpauth.Open)
	if f.noAuth {
		log.Warn("authentication is off (--no-auth): every local caller is the admin of the local tenant")
		return authFn, nil
	}
	authFn = a.Authenticate()
	file := filepath.Join(a.DataDir, AdminTokenFile)
	tok, err := a.EnsureAdminToken(cmd.Context(), file)
	if err != nil {
		return nil, fmt.Errorf("creating the first admin token: %w", err)
	}
	if tok != "" {
		fmt.Fprintf(cmd.OutOrStdout(), "quro: the first admin token (shown once; kept in %s):\n%s\n", file, tok)
	}
	return authFn, nil
}

// listen listens on addr, holding at most the connections c allows.
func listen(addr string, c caps, log *slog.Logger) (*connlimit.Listener, error) {
	rawLn, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return connlimit.New(rawLn, &connlimit.Options{
		Name: "http", Max: c.max, PerPeer: c.perIP, Evict: true, EvictIdle: true,
		Refusal: connlimit.HTTPRefusal("HTTP"), Logger: log,
	}), nil
}

// server is the HTTP server of every route: REST and WebSocket under
// /v1/, MCP, metrics, the web UI and, with --e2b, E2B's APIs; and the
// WebSocket server, whose hijacked connections the shutdown waits for.
func (f *serveFlags) server(a *app.App, authFn httpauth.Func, maxConns int, log *slog.Logger) (*http.Server, *ws.Server, error) {
	access := rest.Access{Auth: authFn, Origins: f.origins, Hosts: f.hosts}
	// One count of streams per token, over the WebSocket routes, MCP's
	// event streams and E2B's long requests; each holds one of the
	// listener's maxConns connections, of which a tenant's tokens
	// together hold a quarter.
	streams := streamcap.New(f.maxStreams, "--max-streams-per-token")
	streams.Tenants(maxConns, "--max-conns")
	wopts := &ws.Options{Access: access, PTY: a.OpenPTY, Logger: log,
		Events: a.Events, Take: a.TakeShell, HandBack: a.HandBackShell,
		Streams: streams, IdleTimeout: f.streamIdle}
	if f.node != nil {
		// GET /v1/events merges every node's live events.
		wopts.Peers, wopts.Node = f.node.peerEvents, f.node.c.Self()
	}
	wsrv := ws.New(a.Controller, wopts)
	mux := http.NewServeMux()
	mux.Handle("/v1/", rest.New(a.Controller, &rest.Options{Logger: log, Access: access, WebSocket: wsrv.Handlers()}))
	// Preview URLs: a session's port, through the origin and Host checks
	// and the session's tenant's token or a signed URL (docs/security.md).
	mux.Handle(rest.PreviewPattern, rest.Preview(access, a, log))
	mux.Handle("/mcp", guard(access, quromcp.Handler(a.Controller, authFn, &quromcp.Options{Logger: log,
		Streams: streams, StreamIdleTimeout: f.streamIdle})))
	// Metrics count every tenant's calls: the admin's alone.
	// A cluster node's metrics carry its name (node="quro-0").
	metricsH := a.Metrics.Handler()
	if f.node != nil {
		metricsH = a.Metrics.NodeHandler(f.node.c.Self())
	}
	mux.Handle("GET /metrics", guard(access, requireOperator(authFn, "/metrics shows every tenant's counts", metricsH)))
	if f.node != nil {
		f.node.routes(mux, access, authFn)
	}
	// The web UI: public static files, no token needed to load them
	// (it calls /v1/ like any other client, with the user's token).
	// Only the Host is checked: the sandboxed artifact frame loads
	// its script with "Origin: null".
	mux.Handle("/", hostGuard(access, web.Handler()))
	var handler http.Handler = mux
	// refs find the session of a request by its Host: the cluster's
	// router forwards it to the session's node.
	var refs []func(*http.Request) string
	// The host form of preview URLs: PORT-ID.DOMAIN, whatever the path,
	// goes to the port (its own origin); any other name below DOMAIN
	// reaches Quro's routes, whose Host check refuses it.
	if scheme, host, err := app.ParsePreviewDomain(f.network.PreviewDomain); err != nil {
		return nil, nil, err
	} else if host != "" {
		ph := rest.NewPreviewHost(access, host, a, log)
		ph.Secure = scheme == "https"
		refs = append(refs, func(r *http.Request) string {
			if id, _, ok := ph.Match(r); ok {
				return id
			}
			return ""
		})
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, _, ok := ph.Match(r); ok {
				ph.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		})
	}
	long, authed := longRequest, authenticated(authFn, f.noAuth)
	if f.e2bOn {
		var err error
		handler, long, authed, err = f.withE2B(a, log, access, handler, authed, streams, &refs)
		if err != nil {
			return nil, nil, err
		}
	}
	if f.node != nil {
		// Every call for a session another node owns goes there.
		long = f.node.long(long)
		handler = f.node.router(a.Controller, handler, authFn, refs, log)
	}
	srv := connlimit.NewServer(handler, &connlimit.HTTPOptions{
		Authenticated: authed,
		Long:          long,
	})
	return srv, wsrv, nil
}

// withE2B puts E2B's SDKs' routes (docs/e2b.md) ahead of Quro's own
// (mux): the control plane under /e2b (or api.DOMAIN), a sandbox's envd
// and code interpreter by their headers (or PORT-ID.DOMAIN). It returns
// the handler of both, and which requests are long and authenticated.
func (f *serveFlags) withE2B(a *app.App, log *slog.Logger, access rest.Access, mux http.Handler,
	authed func(*http.Request) bool, streams *streamcap.Limiter, refs *[]func(*http.Request) string) (http.Handler, func(*http.Request) bool, func(*http.Request) bool, error) {
	// E2B's hosts (api.DOMAIN, PORT-ID.DOMAIN) name the E2B
	// routes only, not Quro's own. Origin and Host are checked as on
	// every other route (the E2B server runs e2bAccess.Check first), with
	// or without --no-auth.
	e2bAccess := access
	if f.e2bDomain != "" {
		e2bAccess.Hosts = append(slices.Clone(f.hosts), e2b.Hosts(f.e2bDomain)...)
	}
	es, err := e2bServer(a, log, f.e2bDomain, f.noAuth, e2bAccess.Check, func(o *e2b.Options) {
		o.Streams, o.StreamIdle = streams, f.streamIdle
		if f.node != nil {
			o.Secret = f.node.e2bKey // the cluster's, not the node's own e2b.key
		}
	})
	if err != nil {
		return nil, nil, nil, err
	}
	*refs = append(*refs, es.HostSandbox)
	if f.node != nil {
		// A signed /files URL names its sandbox only by its signature,
		// which the node holding the sandbox checks: the router finds it.
		f.node.signedFiles, f.node.signedLocal = es.SignedFiles, es.SignedSandbox
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if es.Match(r) {
			es.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	long := func(r *http.Request) bool { return es.Long(r) || longRequest(r) }
	quroAuthed := authed
	authed = func(r *http.Request) bool {
		if es.Match(r) {
			return es.Authenticated(r)
		}
		return quroAuthed(r)
	}
	return handler, long, authed, nil
}

// serveUntilDone serves on ln until srv fails or ctx ends; then it shuts
// srv down, giving its requests 10 s, and waits for the WebSocket
// connections. A shutdown that runs out of time is not an error.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener, wsrv *ws.Server, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	wsrv.Wait() // hijacked WebSocket connections are not Shutdown's
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// guard refuses foreign browser origins and unknown Host names before h.
func guard(access rest.Access, h http.Handler) http.Handler { return refuse(access.Check, h) }

// hostGuard refuses unknown Host names (DNS rebinding) before h.
func hostGuard(access rest.Access, h http.Handler) http.Handler { return refuse(access.CheckHost, h) }

// refuse answers 403 when check finds fault with a request, else runs h.
func refuse(check func(*http.Request) *capability.Error, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := check(r); e != nil {
			rest.WriteError(w, http.StatusForbidden, e)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// requireScope lets through callers that authenticate with a scope that
// covers need; others get 401 (no or bad credentials) or 403.
// requireOperator serves h to the operator alone: an admin token of the
// local tenant (what `quro serve` writes to admin.token), never a session
// calling back. What h shows is the whole server's (why), so another
// tenant's admin is refused too.
func requireOperator(auth httpauth.Func, why string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, err := auth(r)
		if err != nil {
			ce := controller.Classify(err)
			w.Header().Set("WWW-Authenticate", "Bearer")
			rest.WriteError(w, rest.Status(ce.Code), ce)
			return
		}
		if !caller.Scope.Covers(capability.ScopeAdmin) || caller.Tenant != "" || caller.Session != "" {
			rest.WriteError(w, http.StatusForbidden, capability.Errorf(capability.PermissionDenied,
				"%s needs the operator's token (scope \"admin\" of the local tenant: %s); this token has scope %q of tenant %q",
				r.URL.Path, why, caller.Scope, caller.Tenant))
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), operatorKey{}, caller)))
	})
}

// operatorKey holds, in a request's context, the caller requireOperator
// let through.
type operatorKey struct{}

// operatorFrom is the caller requireOperator let through ctx's request.
func operatorFrom(ctx context.Context) controller.Caller {
	c, _ := ctx.Value(operatorKey{}).(controller.Caller)
	return c
}

// checkLoopback refuses a non-loopback address for a server without
// authentication: anyone who could reach the port could run code.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--addr %q is not a loopback address: --no-auth would let anyone who reaches it run code; use 127.0.0.1 or ::1, or drop --no-auth and use tokens", addr)
	}
	return nil
}
