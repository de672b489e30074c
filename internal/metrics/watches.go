package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quro-dev/quro/internal/workspace"
)

var (
	inotifyDesc    = prometheus.NewDesc("quro_inotify_instances", "inotify instances the server holds for the watches (watch_dir, E2B's watchers), shared by them.", nil, nil)
	inotifyMaxDesc = prometheus.NewDesc("quro_inotify_instances_max", "The cap on the server's inotify instances (a fraction of the host's fs.inotify.max_user_instances).", nil, nil)
	watchesDesc    = prometheus.NewDesc("quro_watches", "Watches running (watch_dir calls, E2B watch streams and polling watchers).", nil, nil)
	watchesMaxDesc = prometheus.NewDesc("quro_watches_max", "The cap on running watches, by scope (server: all tenants; tenant: each one).", []string{"scope"}, nil)
	dirsDesc       = prometheus.NewDesc("quro_watched_dirs", "Directories watched, counted per watch.", nil, nil)
	dirsMaxDesc    = prometheus.NewDesc("quro_watched_dirs_max", "The cap on watched directories, by scope (server: all tenants, a fraction of the host's fs.inotify.max_user_watches; tenant: each one).", []string{"scope"}, nil)
	watchRefDesc   = prometheus.NewDesc("quro_watch_refusals_total", "Watches (or directories of a recursive watch) refused at a cap, by cap (watches_per_tenant, watches, watched_dirs_per_tenant, watched_dirs, host).", []string{"cap"}, nil)
	watchOverDesc  = prometheus.NewDesc("quro_watch_overflows_total", "Watches ended because events were lost, by queue (kernel: an inotify instance's; watch: the watch's own, read too slowly).", []string{"queue"}, nil)
)

// The label values of quro_watch_refusals_total and
// quro_watch_overflows_total.
var (
	watchCaps   = []string{workspace.CapTenantWatches, workspace.CapWatches, workspace.CapTenantDirs, workspace.CapDirs, workspace.CapHost}
	watchQueues = []string{"kernel", "watch"}
)

type watchGauges struct{ src func() workspace.WatchStats }

func (g *watchGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{inotifyDesc, inotifyMaxDesc, watchesDesc, watchesMaxDesc, dirsDesc, dirsMaxDesc, watchRefDesc, watchOverDesc} {
		ch <- d
	}
}

func (g *watchGauges) Collect(ch chan<- prometheus.Metric) {
	s := g.src()
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	gauge(inotifyDesc, s.Instances)
	gauge(inotifyMaxDesc, s.Limits.Instances)
	gauge(watchesDesc, s.Watches)
	gauge(watchesMaxDesc, s.Limits.Watches, "server")
	gauge(watchesMaxDesc, s.Limits.TenantWatches, "tenant")
	gauge(dirsDesc, s.Dirs)
	gauge(dirsMaxDesc, s.Limits.Dirs, "server")
	gauge(dirsMaxDesc, s.Limits.TenantDirs, "tenant")
	for _, c := range watchCaps {
		ch <- prometheus.MustNewConstMetric(watchRefDesc, prometheus.CounterValue, float64(s.Refused[c]), c)
	}
	for _, q := range watchQueues {
		ch <- prometheus.MustNewConstMetric(watchOverDesc, prometheus.CounterValue, float64(s.Overflows[q]), q)
	}
}

// WatchWatches registers the gauges of the watches and their inotify
// instances, read from src at every scrape. Call it once.
func (m *Metrics) WatchWatches(src func() workspace.WatchStats) {
	m.reg.MustRegister(&watchGauges{src: src})
}
