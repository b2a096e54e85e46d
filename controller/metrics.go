package controller

import (
	"context"
	"log/slog"
	"time"

	"github.com/onc-net/onc/controller/nodeipam"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMetricsAddr is where the controller serves /metrics unless
// --metrics-addr says otherwise (docs/metrics.md); the agent's port + 1,
// since both may run in one node's host network.
const DefaultMetricsAddr = ":9968"

var descCIDRs = prometheus.NewDesc("onc_controller_cidrs",
	"Node blocks (pod CIDRs) of each family's cluster CIDR by state: allocated (to any node) or free.", []string{"family", "state"}, nil)

// The datastore read of a scrape: its source in onc_scrape_errors_total,
// and how long it may take.
const (
	sourceCIDRs  = "cidrs"
	cidrsTimeout = 5 * time.Second
)

// Metrics are the controller's Prometheus metrics. Every replica serves
// them, leading or not: make them before the election, pass them in
// Config.Metrics, and Serve them.
type Metrics struct {
	reg          *prometheus.Registry
	store        datastore.Store
	allocs       []*nodeipam.Allocator
	leader       prometheus.Gauge
	storeErrors  prometheus.Counter
	scrapeErrors *prometheus.CounterVec
}

// NewMetrics makes the metrics of a controller of cluster on store.
func NewMetrics(cluster datastore.ClusterConfig, store datastore.Store) (*Metrics, error) {
	allocs, err := allocators(cluster, store)
	if err != nil {
		return nil, err
	}
	m := &Metrics{reg: metrics.NewRegistry(), store: store, allocs: allocs,
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "onc_controller_leader",
			Help: "1 while this replica reconciles (it holds the leader Lease, or runs on etcd without election), else 0."}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "onc_controller_datastore_errors_total",
			Help: "Failed datastore reads and writes of the reconcile loop: a failed pass (retried), a CIDR claim that failed."}),
		scrapeErrors: metrics.NewScrapeErrors(sourceCIDRs),
	}
	m.reg.MustRegister(m, m.leader, m.storeErrors)
	return m, nil
}

// Serve serves the metrics on addr until ctx ends; "" serves none. It
// returns the address it listens on.
func (m *Metrics) Serve(ctx context.Context, addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	return metrics.Serve(ctx, addr, m.reg)
}

func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCIDRs
	m.scrapeErrors.Describe(ch)
}

// Collect reads the allocations now, once for every pool; if that
// fails, the CIDR pools are left out of this scrape.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), cidrsTimeout)
	defer cancel()
	if taken, err := m.store.Allocations(ctx); err != nil {
		m.scrapeErrors.WithLabelValues(sourceCIDRs).Inc()
		slog.Warn("metrics: CIDR pools left out of this scrape", "err", err)
	} else {
		for _, a := range m.allocs {
			allocated, free := a.Usage(taken)
			ch <- prometheus.MustNewConstMetric(descCIDRs, prometheus.GaugeValue, allocated, a.Family().String(), "allocated")
			ch <- prometheus.MustNewConstMetric(descCIDRs, prometheus.GaugeValue, free, a.Family().String(), "free")
		}
	}
	m.scrapeErrors.Collect(ch)
}
