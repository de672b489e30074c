package app

import (
	"strings"

	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/sandbox"
)

// sandboxOptions returns opts with m counting the sandbox's start failures
// (after any OnFailure the caller set).
func sandboxOptions(opts *sandbox.Options, m *metrics.Metrics) *sandbox.Options {
	var o sandbox.Options
	if opts != nil {
		o = *opts
	}
	prev := o.OnFailure
	o.OnFailure = func(reason string) {
		if prev != nil {
			prev(reason)
		}
		m.SandboxFailure(reason)
	}
	return &o
}

// instrument feeds a.Metrics the gauges of sessions, terminals and Python
// workers (every controller call reaches it as an observer).
func (a *App) instrument() {
	a.Metrics.Watch(metrics.Sources{
		Sessions:      a.Sessions.CountAll,
		Terminals:     a.Terminals.Live,
		PythonWorkers: func() int { return a.Python.Sessions() + a.PythonRootfs.Sessions() },
		Boxes:         a.boxGauges,
		Processes:     a.procs.Total,
		RunsInFlight:  a.Controller.RunsInFlightAll,
		Spares: func() (int, int) {
			st := a.SpareStats()
			return st.Ready, st.Filling
		},
	})
}

// RunReport implements metrics.RunReporter: python_run runs python3 in a
// rootfs; its failures to start are errors, not results.
func (r *PythonRunResult) RunReport() (engine, outcome string) {
	canceled := strings.HasPrefix(r.Note, "canceled")
	return "python3/rootfs", metrics.Outcome(r.ExitCode, r.TimedOut, canceled, false)
}
