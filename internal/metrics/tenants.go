package metrics

import "github.com/prometheus/client_golang/prometheus"

// TenantGauges are counts over every tenant and session; no tenant is
// named (tenant names are not labels: get_service_status shows a tenant
// its own ceilings and usage).
type TenantGauges struct {
	AtMemoryCeiling int // tenants whose processes hold their memory ceiling now
	AtTaskCeiling   int // tenants at their process ceiling now
	DisksFull       int // sessions whose disk quota is full
	DisksOK         int // sessions with a disk quota, not full
	DisksNone       int // sessions without a kernel-enforced disk quota
}

var (
	tenantsAtDesc = prometheus.NewDesc("quro_tenants_at_ceiling", "Tenants at one of their kernel-enforced ceilings now, by ceiling (memory, tasks).", []string{"ceiling"}, nil)
	disksDesc     = prometheus.NewDesc("quro_session_disks", "Sessions by the state of their disk quota (ok, full, none: no kernel-enforced quota).", []string{"state"}, nil)
)

type tenantGauges struct{ src func() TenantGauges }

func (g *tenantGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- tenantsAtDesc
	ch <- disksDesc
}

func (g *tenantGauges) Collect(ch chan<- prometheus.Metric) {
	v := g.src()
	ch <- prometheus.MustNewConstMetric(tenantsAtDesc, prometheus.GaugeValue, float64(v.AtMemoryCeiling), "memory")
	ch <- prometheus.MustNewConstMetric(tenantsAtDesc, prometheus.GaugeValue, float64(v.AtTaskCeiling), "tasks")
	ch <- prometheus.MustNewConstMetric(disksDesc, prometheus.GaugeValue, float64(v.DisksOK), "ok")
	ch <- prometheus.MustNewConstMetric(disksDesc, prometheus.GaugeValue, float64(v.DisksFull), "full")
	ch <- prometheus.MustNewConstMetric(disksDesc, prometheus.GaugeValue, float64(v.DisksNone), "none")
}

// WatchTenants registers the tenant and disk gauges, read from src at
// every scrape, and the counter of calls refused at a tenant ceiling.
// Call it once.
func (m *Metrics) WatchTenants(src func() TenantGauges) {
	m.reg.MustRegister(&tenantGauges{src: src})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quro_tenant_ceiling_refusals_total",
		Help: "Exec calls refused because their tenant was at a ceiling (HTTP 429), by ceiling.",
	}, []string{"ceiling"})
	for _, c := range []string{"memory", "tasks"} {
		m.refusals.WithLabelValues(c)
	}
	m.reg.MustRegister(m.refusals)
}

// TenantRefusal counts a call refused at a tenant ceiling ("memory" or
// "tasks").
func (m *Metrics) TenantRefusal(ceiling string) {
	if m.refusals != nil && (ceiling == "memory" || ceiling == "tasks") {
		m.refusals.WithLabelValues(ceiling).Inc()
	}
}
