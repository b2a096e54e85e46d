package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/lab"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"k8s.io/client-go/kubernetes"
)

// Writes counts a datastore's writes by kind, as its /metrics reports them
// (counters since it started).
type Writes map[string]float64

// Total of every kind.
func (w Writes) Total() float64 {
	var t float64
	for _, v := range w {
		t += v
	}
	return t
}

// Rate is the writes per second of each kind between w and later, d apart.
func (w Writes) Rate(later Writes, d time.Duration) Writes {
	out := Writes{}
	for k, v := range later {
		if r := (v - w[k]) / d.Seconds(); r != 0 {
			out[k] = r
		}
	}
	return out
}

// String lists the kinds, largest first.
func (w Writes) String() string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return w[keys[i]] > w[keys[j]] || w[keys[i]] == w[keys[j]] && keys[i] < keys[j] })
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.4g", k, w[k])
	}
	return b.String()
}

// Heartbeat kinds: the etcd lease renewals, and the Lease updates on
// Kubernetes.
const (
	etcdHeartbeat = "lease renewal"
	kubeHeartbeat = "PUT leases"
)

// etcdWrites counts what etcd writes: keys put and deleted (each key of a
// transaction too) and lease renewals seen by the leader, which touch no
// key but are requests every member's leader serves.
func etcdWrites(metrics []byte) (Writes, error) {
	fams, err := parseMetrics(metrics)
	if err != nil {
		return nil, err
	}
	w := Writes{}
	for name, kind := range map[string]string{"etcd_mvcc_put_total": "put", "etcd_mvcc_delete_total": "delete",
		"etcd_debugging_lease_renewed_total": etcdHeartbeat} {
		f, ok := fams[name]
		if !ok {
			return nil, fmt.Errorf("etcd metrics lack %s", name)
		}
		for _, m := range f.GetMetric() {
			w[kind] += m.GetCounter().GetValue()
		}
	}
	return w, nil
}

// mutating are the verbs of apiserver_request_total that write.
var mutating = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// apiserverWrites counts kube-apiserver's mutating requests (every caller,
// the apiserver's own included) by verb and resource ("PUT leases").
func apiserverWrites(metrics []byte) (Writes, error) {
	fams, err := parseMetrics(metrics)
	if err != nil {
		return nil, err
	}
	f, ok := fams["apiserver_request_total"]
	if !ok {
		return nil, fmt.Errorf("kube-apiserver metrics lack apiserver_request_total")
	}
	w := Writes{}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if mutating[labels["verb"]] {
			kind := labels["verb"] + " " + labels["resource"]
			if labels["subresource"] != "" {
				kind += "/" + labels["subresource"]
			}
			w[kind] += m.GetCounter().GetValue()
		}
	}
	return w, nil
}

func parseMetrics(b []byte) (map[string]*dto.MetricFamily, error) {
	var p expfmt.TextParser
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// Counts says what writes_per_s counts on a datastore.
func Counts(datastore string) string {
	if datastore == "kubernetes" {
		return "kube-apiserver's apiserver_request_total of verbs POST, PUT, PATCH, DELETE, DELETECOLLECTION and APPLY (every client's, the apiserver's own included)"
	}
	return "etcd's etcd_mvcc_put_total + etcd_mvcc_delete_total (keys written, in transactions too) + etcd_debugging_lease_renewed_total (lease keepalives)"
}

// WriteCounter reads the write counters of a lab's datastore.
type WriteCounter struct {
	heartbeat string
	scrape    func(ctx context.Context) ([]byte, error)
	parse     func([]byte) (Writes, error)
}

// NewWriteCounter scrapes l's etcd on its client URL, or kube-apiserver
// as the lab's admin.
func NewWriteCounter(l *lab.Lab) (*WriteCounter, error) {
	if l.Datastore == "kubernetes" {
		kube, err := kubernetes.NewForConfig(l.APIServer.RESTConfig())
		if err != nil {
			return nil, err
		}
		return &WriteCounter{
			heartbeat: kubeHeartbeat,
			scrape: func(ctx context.Context) ([]byte, error) {
				return kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
			},
			parse: apiserverWrites,
		}, nil
	}
	tlsCfg, err := l.EtcdAdmin().TLSFiles.Config()
	if err != nil {
		return nil, err
	}
	cli := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: l.DialDatastore, TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	url := l.EtcdURL() + "/metrics"
	return &WriteCounter{
		heartbeat: etcdHeartbeat,
		scrape: func(ctx context.Context) ([]byte, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return nil, err
			}
			resp, err := cli.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
			}
			return io.ReadAll(resp.Body)
		},
		parse: etcdWrites,
	}, nil
}

// Read scrapes the counters now.
func (c *WriteCounter) Read(ctx context.Context) (Writes, error) {
	b, err := c.scrape(ctx)
	if err != nil {
		return nil, fmt.Errorf("datastore metrics: %w", err)
	}
	return c.parse(b)
}

// Heartbeats is the heartbeat kind's share of w.
func (c *WriteCounter) Heartbeats(w Writes) float64 { return w[c.heartbeat] }

// HeartbeatRate is how many heartbeats per second n nodes with lease ttl
// make when the datastore keeps up: a Lease update every quarter of the
// TTL on Kubernetes (k8sstore), a keepalive every third on etcd (the etcd
// client's schedule).
func HeartbeatRate(datastore string, n int, ttl time.Duration) float64 {
	return float64(n) / heartbeatPeriod(datastore, ttl).Seconds()
}

func heartbeatPeriod(datastore string, ttl time.Duration) time.Duration {
	if datastore == "kubernetes" {
		return k8sstore.RenewInterval(ttl)
	}
	return ttl / 3 // clientv3's keepalive period
}
