package controller_test

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
	dto "github.com/prometheus/client_model/go"
)

// flakyStore fails every read of nodes and allocations while broken.
type flakyStore struct {
	datastore.Store
	broken atomic.Bool
}

var errBroken = errors.New("datastore unreachable")

func (s *flakyStore) Nodes(ctx context.Context) ([]datastore.Node, error) {
	if s.broken.Load() {
		return nil, errBroken
	}
	return s.Store.Nodes(ctx)
}

func (s *flakyStore) Allocations(ctx context.Context) (map[netip.Prefix]string, error) {
	if s.broken.Load() {
		return nil, errBroken
	}
	return s.Store.Allocations(ctx)
}

// served is a controller of 10.244.0.0/16 in /24 blocks (256) and
// fd00:10:244::/48 in /64 blocks (65,536) on a fresh etcd, its metrics
// served as onc-controller serves them.
func served(t *testing.T) (*flakyStore, *controller.Controller, func() map[string]*dto.MetricFamily) {
	e := etcdtest.Embedded(t, "")
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	store := &flakyStore{Store: s}
	cfg := cluster(pool4, datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/48"), NodePrefixLen: 64})
	m, err := controller.NewMetrics(cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := m.Serve(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := controller.New(context.Background(), controller.Config{Cluster: cfg, Resync: 50 * time.Millisecond, Metrics: m}, store)
	if err != nil {
		t.Fatal(err)
	}
	return store, c, func() map[string]*dto.MetricFamily {
		t.Helper()
		return testutil.ScrapeMetrics(t, "http://"+addr+"/metrics")
	}
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, family string, labels map[string]string) float64 {
	t.Helper()
	v, ok := testutil.MetricValue(mfs, family, labels)
	if !ok {
		t.Fatalf("no %s%v", family, labels)
	}
	return v
}

func TestMetricsCIDRsAndLeader(t *testing.T) {
	s, c, scrape := served(t)
	register(t, s, "a")
	register(t, s, "b")
	if err := c.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A block outside the cluster CIDR is not one of its blocks.
	for _, p := range []string{"10.99.0.0/24", "fd00:99::/64"} {
		if _, err := datastore.ClaimCIDR(context.Background(), s, "elsewhere", netip.MustParsePrefix(p)); err != nil {
			t.Fatal(err)
		}
	}
	mfs := scrape()
	for labels, want := range map[[2]string]float64{
		{"ipv4", "allocated"}: 2, {"ipv4", "free"}: 254, {"ipv6", "allocated"}: 2, {"ipv6", "free"}: 65534,
	} {
		if got := value(t, mfs, "onc_controller_cidrs", map[string]string{"family": labels[0], "state": labels[1]}); got != want {
			t.Errorf("onc_controller_cidrs%v = %v, want %v", labels, got, want)
		}
	}
	if got := value(t, mfs, "onc_controller_leader", nil); got != 0 {
		t.Errorf("onc_controller_leader = %v before Run", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	testutil.WaitFor(t, "onc_controller_leader 1 while running", 5*time.Second, func() bool {
		return value(t, scrape(), "onc_controller_leader", nil) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := value(t, scrape(), "onc_controller_leader", nil); got != 0 {
		t.Errorf("onc_controller_leader = %v after Run returned", got)
	}
	if got := value(t, scrape(), "onc_controller_datastore_errors_total", nil); got != 0 {
		t.Errorf("onc_controller_datastore_errors_total = %v on a healthy datastore", got)
	}
}

// A datastore that fails: each failed pass counts, and a scrape that
// cannot read the allocations leaves the CIDR pool out.
func TestMetricsDatastoreErrors(t *testing.T) {
	s, c, scrape := served(t)
	s.broken.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	testutil.WaitFor(t, "failed passes counted", 5*time.Second, func() bool {
		return value(t, scrape(), "onc_controller_datastore_errors_total", nil) >= 2
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mfs := scrape()
	if f, ok := mfs["onc_controller_cidrs"]; ok {
		t.Errorf("onc_controller_cidrs despite the failed read: %v", f)
	}
	if got := value(t, mfs, "onc_scrape_errors_total", map[string]string{"source": "cidrs"}); got < 1 {
		t.Errorf("onc_scrape_errors_total{source=cidrs} = %v", got)
	}
}
