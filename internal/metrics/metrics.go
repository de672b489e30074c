// Package metrics exposes Quro's Prometheus metrics: every controller call
// (by capability, access path and outcome, with its duration), every run of
// user code (by engine and outcome), the live sessions, terminals and Python
// workers, the watches and their inotify instances, and the sandbox's start
// failures.
//
// Each Metrics has its own registry (never the global default), so several
// Apps in one process — tests — do not collide. Label values come only from
// closed sets the code defines: capability names of the registry, access
// paths, error codes, engine names, outcome and failure reasons. Tenants,
// session ids and arguments are never labels.
package metrics

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/quro-dev/quro/internal/capability"
	"github.com/quro-dev/quro/internal/controller"
	"github.com/quro-dev/quro/internal/runcode"
	"github.com/quro-dev/quro/internal/sandbox"
	"github.com/quro-dev/quro/internal/terminal"
)

// Run outcomes (the outcome label of quro_runs_total).
const (
	RunOK          = "ok"           // the code ran and exited 0
	RunExitNonzero = "exit_nonzero" // the code ran and failed
	RunTimeout     = "timeout"      // the run hit its time budget
	RunInterrupted = "interrupted"  // the run was stopped (cancel, interrupt) before it finished
	RunError       = "error"        // an engine-level failure: no engine, a crash, a start failure
	RunRunning     = "running"      // a terminal command still runs (waits for input, or detached)
)

// Label values that stand for anything outside a closed set.
const (
	Unknown = "unknown" // a capability the registry does not have
	Other   = "other"   // an access path this package does not know
)

// Paths are the access paths kept as label values; others count as Other.
var Paths = []string{"cli", "rest", "mcp", "ws", "web", "e2b"}

// RunReporter is implemented by the structured outputs of runs that this
// package cannot import (they live above it): it returns the engine name
// and one of the Run* outcomes.
type RunReporter interface {
	RunReport() (engine, outcome string)
}

// Sources are read at every scrape for the gauges. A nil source leaves its
// gauge out.
type Sources struct {
	Sessions      func(ctx context.Context) (int, error) // sessions in the store
	Terminals     func() (shells, ptys int)              // running pipe shells and PTYs
	PythonWorkers func() int                             // resident Python workers
	Boxes         func() BoxStats                        // session boxes
	Processes     func() int                             // background processes of all sessions
	RunsInFlight  func() int                             // calls running code in flight, all tenants
	// Spares: the spare sessions ready to be claimed by a create, and
	// those being made.
	Spares func() (ready, filling int)
}

// BoxStats are the session boxes' gauges.
type BoxStats struct {
	Open, Paused int
	MemoryBytes  uint64 // charged to all boxes
	Tasks        uint64 // processes and threads in all boxes
	Outside      uint64 // runs of a session that got a box of their own (counter)
}

// Metrics holds Quro's collectors and their registry. Safe for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	runs     *prometheus.CounterVec
	sandbox  *prometheus.CounterVec
	// egress and egressBytes count the egress's decisions and bytes.
	egress, egressBytes *prometheus.CounterVec
	egressLogLost       prometheus.Counter // decisions the egress log could not write
	known               func(name string) bool
	refusals            *prometheus.CounterVec // see WatchTenants
	conns               connGauges
}

// DurationBuckets are the call duration histogram's buckets, in seconds:
// 100µs to 60s.
var DurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// New returns Metrics on a fresh registry with the Go and process
// collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quro_calls_total",
			Help: "Capability calls by capability, access path and outcome (ok or the error code).",
		}, []string{"capability", "path", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quro_call_duration_seconds",
			Help:    "Duration of capability calls by capability and access path.",
			Buckets: DurationBuckets,
		}, []string{"capability", "path"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quro_runs_total",
			Help: "Runs of user code by capability, engine and outcome (ok, exit_nonzero, timeout, interrupted, error, running).",
		}, []string{"capability", "engine", "outcome"}),
		sandbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quro_sandbox_start_failures_total",
			Help: "Sandbox starts that failed, by reason.",
		}, []string{"reason"}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quro_egress_connections_total",
			Help: "Connections of boxes under network internet (and JS fetches) by the egress's decision: allowed or denied.",
		}, []string{"decision"}),
		egressBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quro_egress_bytes_total",
			Help: "Bytes the egress relayed for boxes, by direction: out (box to destination) or in.",
		}, []string{"direction"}),
		egressLogLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quro_egress_log_lost_total",
			Help: "Egress decisions not written to the egress log: its queue was full, or the store failed a batch three times.",
		}),
		known: func(string) bool { return true },
	}
	for _, d := range []string{"allowed", "denied"} {
		m.egress.WithLabelValues(d) // present at 0 from the start
	}
	for _, d := range []string{"out", "in"} {
		m.egressBytes.WithLabelValues(d)
	}
	for _, r := range sandbox.FailureReasons {
		m.sandbox.WithLabelValues(r) // present at 0 from the start
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.calls, m.duration, m.runs, m.sandbox, m.egress, m.egressBytes, m.egressLogLost,
	)
	return m
}

// Registry returns the registry, e.g. to gather in tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format (for
// /metrics).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// NodeLabel is the label NodeHandler puts on every metric.
const NodeLabel = "node"

// NodeHandler serves the metrics as Handler does, each labelled with the
// cluster node that counted it (node="quro-0"): every node of a cluster
// counts its own calls, and Prometheus scrapes each pod of the
// StatefulSet; the label keeps their series apart when the scrape's own
// target labels are dropped or relabelled.
func (m *Metrics) NodeHandler(node string) http.Handler {
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := m.reg.Gather()
		for _, mf := range mfs {
			for _, mt := range mf.Metric {
				mt.Label = append(mt.Label, &dto.LabelPair{Name: proto.String(NodeLabel), Value: proto.String(node)})
				slices.SortFunc(mt.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
			}
		}
		return mfs, err
	})
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{Registry: m.reg})
}

// Observer returns m's observer of the calls of a controller over reg
// (controller.Options.Observers); capability names outside reg are counted
// as Unknown. Call it once.
func (m *Metrics) Observer(reg *capability.Registry) controller.Observer {
	m.known = func(name string) bool { _, ok := reg.Get(name); return ok }
	return m.Observe
}

// Observe counts one finished call (a controller.Observer).
func (m *Metrics) Observe(_ context.Context, r *controller.Record) {
	name := r.Capability
	if !m.known(name) {
		name = Unknown
	}
	path := r.Caller.Path
	if !slices.Contains(Paths, path) {
		path = Other
	}
	m.calls.WithLabelValues(name, path, outcome(r)).Inc()
	m.duration.WithLabelValues(name, path).Observe(r.Duration.Seconds())
	if r.Output != nil {
		if engine, out, ok := RunOf(r.Output); ok {
			m.runs.WithLabelValues(name, engine, out).Inc()
		}
	}
}

// outcome is "ok", controller.OutcomeTimeout or OutcomeCanceled, or the
// error code, which is one of capability's codes.
func outcome(r *controller.Record) string {
	if r.Err != nil {
		return string(r.Err.Code)
	}
	if r.Outcome != "" {
		return r.Outcome // "ok", or a run stopped by its timeout or a cancel
	}
	return "ok"
}

// RunOf returns the engine and outcome of a capability's structured output
// when it is a run of code: a *runcode.Result, a *terminal.Result, or a
// RunReporter.
func RunOf(out any) (engine, outcome string, ok bool) {
	switch r := out.(type) {
	case *runcode.Result:
		return r.Engine, Outcome(r.ExitCode, r.TimedOut, r.Interrupted, r.Error != ""), true
	case *terminal.Result:
		if r.Running && !r.TimedOut && !r.Interrupted && r.Error == "" {
			return "terminal", RunRunning, true
		}
		return "terminal", Outcome(r.ExitCode, r.TimedOut, r.Interrupted, r.Error != ""), true
	case RunReporter:
		engine, outcome = r.RunReport()
		return engine, outcome, true
	}
	return "", "", false
}

// Outcome sorts a finished run: a timeout first (it also interrupts), then
// an interruption, an engine error, a non-zero exit, else ok.
func Outcome(exitCode int, timedOut, interrupted, failed bool) string {
	switch {
	case timedOut:
		return RunTimeout
	case interrupted:
		return RunInterrupted
	case failed:
		return RunError
	case exitCode != 0:
		return RunExitNonzero
	}
	return RunOK
}

// Egress counts one connection the egress decided (allowed or denied)
// and the bytes it relayed each way.
func (m *Metrics) Egress(decision string, out, in int64) {
	if decision != "allowed" {
		decision = "denied"
	}
	m.egress.WithLabelValues(decision).Inc()
	m.egressBytes.WithLabelValues("out").Add(float64(out))
	m.egressBytes.WithLabelValues("in").Add(float64(in))
}

// EgressLogLost counts n egress decisions the egress log did not write.
func (m *Metrics) EgressLogLost(n int) { m.egressLogLost.Add(float64(n)) }

// SandboxFailure counts one failed sandbox start (a sandbox.Options.OnFailure).
func (m *Metrics) SandboxFailure(reason string) {
	if !slices.Contains(sandbox.FailureReasons, reason) {
		reason = Other
	}
	m.sandbox.WithLabelValues(reason).Inc()
}

// Watch registers the gauges read from src at every scrape. Call it once.
func (m *Metrics) Watch(src Sources) {
	m.reg.MustRegister(&gauges{src: src})
}

var (
	sessionsDesc  = prometheus.NewDesc("quro_sessions", "Sessions in the store.", nil, nil)
	terminalsDesc = prometheus.NewDesc("quro_terminals", "Running terminals by kind (shell: the pipe shell; pty: the interactive terminal).", []string{"kind"}, nil)
	pythonDesc    = prometheus.NewDesc("quro_python_workers", "Resident embedded-Python workers (one per session that ran Python recently).", nil, nil)
	boxesDesc     = prometheus.NewDesc("quro_session_boxes", "Session boxes by state (running, paused).", []string{"state"}, nil)
	boxMemDesc    = prometheus.NewDesc("quro_session_box_memory_bytes", "Memory charged to all session boxes.", nil, nil)
	boxTasksDesc  = prometheus.NewDesc("quro_session_box_tasks", "Processes and threads in all session boxes.", nil, nil)
	boxOutDesc    = prometheus.NewDesc("quro_session_box_outside_runs_total", "Runs of a session that did not fit its box and got a box of their own.", nil, nil)
	procsDesc     = prometheus.NewDesc("quro_background_processes", "Background processes (start_process, E2B's commands and PTYs) of all sessions.", nil, nil)
	runsDesc      = prometheus.NewDesc("quro_runs_in_flight", "Calls running code in flight, of all tenants (each tenant's are capped: runs_in_flight).", nil, nil)
	sparesDesc    = prometheus.NewDesc("quro_spare_sessions", "Spare sessions by state (ready: a create claims one, its box and Python worker started; filling: being made).", []string{"state"}, nil)
)

// gauges reads Sources when scraped.
type gauges struct{ src Sources }

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- sessionsDesc
	ch <- terminalsDesc
	ch <- pythonDesc
	ch <- boxesDesc
	ch <- boxMemDesc
	ch <- boxTasksDesc
	ch <- boxOutDesc
	ch <- procsDesc
	ch <- runsDesc
	ch <- sparesDesc
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	if g.src.Sessions != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := g.src.Sessions(ctx)
		cancel()
		if err == nil { // else the gauge is absent from this scrape
			ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(n))
		}
	}
	if g.src.Terminals != nil {
		shells, ptys := g.src.Terminals()
		ch <- prometheus.MustNewConstMetric(terminalsDesc, prometheus.GaugeValue, float64(shells), "shell")
		ch <- prometheus.MustNewConstMetric(terminalsDesc, prometheus.GaugeValue, float64(ptys), "pty")
	}
	if g.src.PythonWorkers != nil {
		ch <- prometheus.MustNewConstMetric(pythonDesc, prometheus.GaugeValue, float64(g.src.PythonWorkers()))
	}
	if g.src.Boxes != nil {
		b := g.src.Boxes()
		ch <- prometheus.MustNewConstMetric(boxesDesc, prometheus.GaugeValue, float64(b.Open-b.Paused), "running")
		ch <- prometheus.MustNewConstMetric(boxesDesc, prometheus.GaugeValue, float64(b.Paused), "paused")
		ch <- prometheus.MustNewConstMetric(boxMemDesc, prometheus.GaugeValue, float64(b.MemoryBytes))
		ch <- prometheus.MustNewConstMetric(boxTasksDesc, prometheus.GaugeValue, float64(b.Tasks))
		ch <- prometheus.MustNewConstMetric(boxOutDesc, prometheus.CounterValue, float64(b.Outside))
	}
	if g.src.Spares != nil {
		ready, filling := g.src.Spares()
		ch <- prometheus.MustNewConstMetric(sparesDesc, prometheus.GaugeValue, float64(ready), "ready")
		ch <- prometheus.MustNewConstMetric(sparesDesc, prometheus.GaugeValue, float64(filling), "filling")
	}
	if g.src.Processes != nil {
		ch <- prometheus.MustNewConstMetric(procsDesc, prometheus.GaugeValue, float64(g.src.Processes()))
	}
	if g.src.RunsInFlight != nil {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(g.src.RunsInFlight()))
	}
}

// ConnStats are a listener's connection counts, for WatchConnections.
type ConnStats struct {
	Open, Pending             int    // connections held; of them without an authenticated request yet
	Max                       int    // the listener's cap (0: none)
	RefusedTotal, RefusedPeer uint64 // refused since the start: listener full; peer over its share
	RefusedShare              uint64 // refused since the start: the peer's tenant over its share
	Evicted                   uint64 // pending connections closed to make room for newer ones
}

var (
	connsDesc   = prometheus.NewDesc("quro_connections", "Connections held by a listener (http: the TCP server; insession: the in-session socket), by state (trusted: a request authenticated on it; pending: none yet).", []string{"listener", "state"}, nil)
	connMaxDesc = prometheus.NewDesc("quro_connections_max", "The connection cap of a listener.", []string{"listener"}, nil)
	refusedDesc = prometheus.NewDesc("quro_connections_refused_total", "Connections refused at accept by a listener, by reason (total: the listener was full; peer: the peer had its share; share: the peer's tenant had its share).", []string{"listener", "reason"}, nil)
	evictedDesc = prometheus.NewDesc("quro_connections_evicted_total", "Connections without an authenticated request closed by a listener to make room for newer ones.", []string{"listener"}, nil)
)

// WatchConnections registers the gauges of a listener named name, read
// from stats at every scrape. Call it once per name. The process's open
// file descriptors and their limit are process_open_fds and
// process_max_fds.
func (m *Metrics) WatchConnections(name string, stats func() ConnStats) {
	m.conns.once.Do(func() { m.reg.MustRegister(&m.conns) })
	m.conns.mu.Lock()
	defer m.conns.mu.Unlock()
	m.conns.names = append(m.conns.names, name)
	m.conns.stats = append(m.conns.stats, stats)
}

// connGauges collects the listeners' counts (one collector: the
// descriptions can be registered once only).
type connGauges struct {
	once  sync.Once
	mu    sync.Mutex
	names []string
	stats []func() ConnStats
}

func (g *connGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- connsDesc
	ch <- connMaxDesc
	ch <- refusedDesc
	ch <- evictedDesc
}

func (g *connGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	names, stats := slices.Clone(g.names), slices.Clone(g.stats)
	g.mu.Unlock()
	for i, name := range names {
		s := stats[i]()
		ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(s.Open-s.Pending), name, "trusted")
		ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(s.Pending), name, "pending")
		ch <- prometheus.MustNewConstMetric(connMaxDesc, prometheus.GaugeValue, float64(s.Max), name)
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.RefusedTotal), name, "total")
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.RefusedPeer), name, "peer")
		ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(s.RefusedShare), name, "share")
		ch <- prometheus.MustNewConstMetric(evictedDesc, prometheus.CounterValue, float64(s.Evicted), name)
	}
}
