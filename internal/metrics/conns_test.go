package metrics_test

import (
	"testing"

	"github.com/quro-dev/quro/internal/metrics"
	"github.com/quro-dev/quro/internal/metrics/metricstest"
)

// Two listeners' counts, read at each scrape, under one set of names.
func TestWatchConnections(t *testing.T) {
	m := metrics.New()
	open := 3
	m.WatchConnections("http", func() metrics.ConnStats {
		return metrics.ConnStats{Open: open, Pending: 1, Max: 48, RefusedTotal: 2, RefusedPeer: 5, RefusedShare: 3, Evicted: 7}
	})
	m.WatchConnections("insession", func() metrics.ConnStats { return metrics.ConnStats{Open: 4, Max: 1024} })
	open = 9
	f := metricstest.Scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"quro_connections", []string{"listener", "http", "state", "trusted"}, 8},
		{"quro_connections", []string{"listener", "http", "state", "pending"}, 1},
		{"quro_connections", []string{"listener", "insession", "state", "trusted"}, 4},
		{"quro_connections_max", []string{"listener", "http"}, 48},
		{"quro_connections_refused_total", []string{"listener", "http", "reason", "peer"}, 5},
		{"quro_connections_refused_total", []string{"listener", "http", "reason", "share"}, 3},
		{"quro_connections_refused_total", []string{"listener", "http", "reason", "total"}, 2},
		{"quro_connections_evicted_total", []string{"listener", "http"}, 7},
	} {
		if v, ok := f.Value(c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v %v, want %v", c.name, c.labels, v, ok, c.want)
		}
	}
}
