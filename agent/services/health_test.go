package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	nethttp "net/http" // the package's tests name a port list http
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onc-net/onc/agent/watch"
)

// lb makes web a LoadBalancer Service with externalTrafficPolicy Local
// and healthCheckNodePort port.
func lb(port int32) func(*corev1.ServiceSpec) {
	return func(s *corev1.ServiceSpec) {
		s.Type, s.ExternalTrafficPolicy, s.HealthCheckNodePort = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, port
	}
}

func named(name string, s *corev1.Service) *corev1.Service {
	s.Name = name
	return s
}

func TestHealthChecks(t *testing.T) {
	twoPorts := ports(slicePort("http", corev1.ProtocolTCP, 8080), slicePort("metrics", corev1.ProtocolTCP, 9090))
	for _, tc := range []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     []HealthCheck // on node n1
	}{{
		name:     "ready endpoints on this node count, each address once",
		services: []*corev1.Service{web(lb(30100))},
		slices: []*discoveryv1.EndpointSlice{
			slice("web-1", "web", twoPorts, ep("10.0.1.1", "n1", ready), ep("10.0.1.2", "n1", discoveryv1.EndpointConditions{}),
				ep("10.0.2.1", "n2", ready), ep("10.0.0.1", "", ready)),
			slice("web-2", "web", http, ep("10.0.1.1", "n1", ready), ep("10.0.1.3", "n1", ready)),
		},
		want: []HealthCheck{{Namespace: ns, Name: "web", Port: 30100, LocalEndpoints: 3}},
	}, {
		name:     "not ready ones do not, serving and terminating or not: the load balancer is to drain the node",
		services: []*corev1.Service{web(lb(30100))},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http,
			ep("10.0.1.1", "n1", notReady), ep("10.0.1.2", "n1", servingTerm), ep("10.0.1.3", "n1", notServingTerm),
			ep("10.0.1.4", "n1", conditions(true, true, true)), ep("10.0.2.1", "n2", ready))},
		want: []HealthCheck{{Namespace: ns, Name: "web", Port: 30100, LocalEndpoints: 1}},
	}, {
		name:     "no endpoints here: answered, with none",
		services: []*corev1.Service{web(lb(30100))},
		slices:   []*discoveryv1.EndpointSlice{slice("web-1", "web", http, ep("10.0.2.1", "n2", ready))},
		want:     []HealthCheck{{Namespace: ns, Name: "web", Port: 30100}},
	}, {
		name:     "a port without a number or name is no endpoint, as for kube-proxy",
		services: []*corev1.Service{web(lb(30100))},
		slices: []*discoveryv1.EndpointSlice{slice("web-1", "web", ports(discoveryv1.EndpointPort{Name: ptr.To("x")}),
			ep("10.0.1.1", "n1", ready))},
		want: []HealthCheck{{Namespace: ns, Name: "web", Port: 30100}},
	}, {
		name:     "IPv6 slices are not ONC's",
		services: []*corev1.Service{web(lb(30100))},
		slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
			es := slice("web-1", "web", http, ep("fd00::1", "n1", ready))
			es.AddressType = discoveryv1.AddressTypeIPv6
			return es
		}()},
		want: []HealthCheck{{Namespace: ns, Name: "web", Port: 30100}},
	}, {
		name: "only LoadBalancer Services with policy Local and a port have one",
		services: []*corev1.Service{
			named("cluster", web(lb(30101), func(s *corev1.ServiceSpec) { s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster })),
			named("noport", web(lb(0))),
			named("nodeport", web(lb(30102), func(s *corev1.ServiceSpec) { s.Type = corev1.ServiceTypeNodePort })),
			named("web", web(lb(30100))),
		},
		slices: []*discoveryv1.EndpointSlice{slice("cluster-1", "cluster", http, ep("10.0.1.1", "n1", ready)),
			slice("web-1", "web", http, ep("10.0.1.2", "n1", ready))},
		want: []HealthCheck{{Namespace: ns, Name: "web", Port: 30100, LocalEndpoints: 1}},
	}, {
		name:     "each Service counts its own slices",
		services: []*corev1.Service{named("a", web(lb(30100))), named("b", web(lb(30200)))},
		slices: []*discoveryv1.EndpointSlice{slice("a-1", "a", http, ep("10.0.1.1", "n1", ready), ep("10.0.1.2", "n1", ready)),
			slice("b-1", "b", http, ep("10.0.1.3", "n1", ready))},
		want: []HealthCheck{{Namespace: ns, Name: "a", Port: 30100, LocalEndpoints: 2}, {Namespace: ns, Name: "b", Port: 30200, LocalEndpoints: 1}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := HealthChecks(Snapshot{Services: tc.services, EndpointSlices: tc.slices}, "n1")
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// sources is a Snapshot the test changes; each change signals.
type sources struct {
	mu       sync.Mutex
	snap     Snapshot
	onChange []func()
}

func (s *sources) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

func (s *sources) OnChange(fn func()) {
	s.mu.Lock()
	s.onChange = append(s.onChange, fn)
	s.mu.Unlock()
	fn()
}

func (s *sources) set(snap Snapshot) {
	s.mu.Lock()
	s.snap = snap
	fns := s.onChange
	s.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// proxy stands for the services watcher: a real loop whose reconcile
// fails while failing is set.
type proxy struct {
	*watch.Informed
	failing atomic.Bool
}

func newProxy(t *testing.T, ctx context.Context) *proxy {
	p := &proxy{}
	p.Informed = watch.NewInformed("services", time.Hour, func(context.Context, bool) error {
		if p.failing.Load() {
			return errors.New("kernel said no")
		}
		return nil
	})
	go p.Run(ctx)
	if err := p.Await(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

type eligibility struct{ atomic.Bool }

func (e *eligibility) Eligible() bool { return e.Load() }

// freePort is a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startHealth runs Health for node n1 until the test ends, and waits
// until it is stopped then.
func startHealth(t *testing.T, cfg HealthConfig, in *sources) (*Health, *proxy) {
	ctx, cancel := context.WithCancel(context.Background())
	p := newProxy(t, ctx)
	h := NewHealth(cfg, p.Loop(), in, "n1", time.Hour)
	h.retry = 50 * time.Millisecond
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Health did not stop with its context")
		}
	})
	return h, p
}

type answer struct {
	code   int
	header nethttp.Header
	body   string
}

// get fetches url; err is a connection's failure.
func get(url string) (answer, error) {
	c := nethttp.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

// eventually polls url until ok accepts its answer.
func eventually(t *testing.T, what, url string, ok func(answer, error) bool) answer {
	t.Helper()
	var a answer
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if a, err = get(url); ok(a, err) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s answered %+v, %v", what, url, a, err)
		}
	}
}

func code(want int) func(answer, error) bool {
	return func(a answer, err error) bool { return err == nil && a.code == want }
}

// kube-proxy's headers on every health answer.
func checkHeaders(t *testing.T, a answer) {
	t.Helper()
	if ct, nosniff := a.header.Get("Content-Type"), a.header.Get("X-Content-Type-Options"); ct != "application/json" || nosniff != "nosniff" {
		t.Errorf("Content-Type %q, X-Content-Type-Options %q; want application/json, nosniff", ct, nosniff)
	}
}

// /healthz and /livez answer as kube-proxy's: 200 while the services
// watcher keeps up, 503 once a change has waited past the timeout; and
// /healthz also 503 while the node is not eligible.
func TestHealthz(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	node := &eligibility{}
	node.Store(true)
	timeout := 300 * time.Millisecond
	_, p := startHealth(t, HealthConfig{Healthz: addr, Timeout: timeout, Node: node}, &sources{})
	healthz, livez := "http://"+addr+"/healthz", "http://"+addr+"/livez"

	type body struct {
		LastUpdated, CurrentTime time.Time
		NodeEligible             *bool
		Healthy                  bool
		Status                   map[string]struct {
			LastUpdated time.Time
			Healthy     bool
		}
	}
	decode := func(a answer) body {
		t.Helper()
		checkHeaders(t, a)
		var b body
		if err := json.Unmarshal([]byte(a.body), &b); err != nil {
			t.Fatalf("%q: %v", a.body, err)
		}
		return b
	}
	applied := p.Loop().Status().LastApplied

	a := eventually(t, "healthy", healthz, code(200))
	b := decode(a)
	if !b.Healthy || b.NodeEligible == nil || !*b.NodeEligible || !b.LastUpdated.Equal(b.CurrentTime) ||
		!b.Status["IPv4"].Healthy || !b.Status["IPv4"].LastUpdated.Equal(applied) {
		t.Errorf("healthy /healthz: %s", a.body)
	}
	a = eventually(t, "healthy", livez, code(200))
	if b := decode(a); !b.Healthy || b.NodeEligible != nil || strings.Contains(a.body, "nodeEligible") {
		t.Errorf("healthy /livez: %s", a.body)
	}

	// The node is leaving: /healthz says so, /livez does not care.
	node.Store(false)
	if b := decode(eventually(t, "node not eligible", healthz, code(503))); b.NodeEligible == nil || *b.NodeEligible || !b.Healthy {
		t.Errorf("/healthz of an ineligible node: %+v", b)
	}
	eventually(t, "node not eligible", livez, code(200))
	node.Store(true)
	eventually(t, "node eligible again", healthz, code(200))

	// A change the watcher fails to apply: healthy until the timeout.
	p.failing.Store(true)
	pending := time.Now()
	p.Signal()
	for time.Since(pending) < timeout*2/3 {
		if a, err := get(healthz); err != nil || a.code != 200 {
			t.Fatalf("%v after a change, within the timeout: %+v, %v", time.Since(pending), a, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a = eventually(t, "a change unapplied past the timeout", healthz, code(503))
	if time.Since(pending) < timeout {
		t.Errorf("unhealthy %v after the change, before the timeout (%v)", time.Since(pending), timeout)
	}
	if b := decode(a); b.Healthy || !b.LastUpdated.Equal(applied) || b.Status["IPv4"].Healthy {
		t.Errorf("unhealthy /healthz: %s (last applied %v)", a.body, applied)
	}
	eventually(t, "a change unapplied past the timeout", livez, code(503))
	p.failing.Store(false)
	eventually(t, "applied at last", healthz, code(200))
	eventually(t, "applied at last", livez, code(200))
}

// Another process holding the address (kube-proxy, during a migration)
// delays /healthz until it lets go.
func TestHealthzWaitsForItsAddress(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	startHealth(t, HealthConfig{Healthz: addr, Timeout: time.Minute}, &sources{})
	time.Sleep(200 * time.Millisecond) // a few failed attempts
	held.Close()
	eventually(t, "the address freed", "http://"+addr+"/healthz", code(200))
}

// /proxyMode answers as kube-proxy's metrics server names its mode: with
// ONC's, which the upstream suite's "kube-proxy urls" check asks for.
func TestProxyMode(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	startHealth(t, HealthConfig{ProxyMode: addr, Timeout: time.Minute}, &sources{})
	if a := eventually(t, "proxyMode", "http://"+addr+"/proxyMode", code(200)); a.body != "onc" {
		t.Errorf("/proxyMode answered %q, want onc", a.body)
	}
}

// A healthCheckNodePort answers as kube-proxy's: 200 with endpoints on
// this node, 503 without or while the proxy is unhealthy, and closes when
// its Service goes.
func TestHealthCheckNodePort(t *testing.T) {
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	in := &sources{}
	withEndpoints := func(eps ...discoveryv1.Endpoint) Snapshot {
		return Snapshot{Services: []*corev1.Service{web(lb(int32(port)))}, EndpointSlices: []*discoveryv1.EndpointSlice{slice("web-1", "web", http, eps...)}}
	}
	in.set(withEndpoints(ep("10.0.1.1", "n1", ready), ep("10.0.1.2", "n1", ready), ep("10.0.2.1", "n2", ready)))
	h, p := startHealth(t, HealthConfig{Timeout: 300 * time.Millisecond}, in)

	a := eventually(t, "two endpoints here", url, code(200))
	checkHeaders(t, a)
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"app\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if a.body != want || a.header.Get("X-Load-Balancing-Endpoint-Weight") != "2" {
		t.Errorf("answer %q, weight %q; want %q, 2", a.body, a.header.Get("X-Load-Balancing-Endpoint-Weight"), want)
	}
	if _, err := get(fmt.Sprintf("http://127.0.0.1:%d/any/path", port)); err != nil {
		t.Error(err)
	}

	in.set(withEndpoints(ep("10.0.1.1", "n1", servingTerm), ep("10.0.2.1", "n2", ready)))
	a = eventually(t, "none ready here", url, code(503))
	if !strings.Contains(a.body, `"localEndpoints": 0,`) || a.header.Get("X-Load-Balancing-Endpoint-Weight") != "0" {
		t.Errorf("without local endpoints: %q, weight %q", a.body, a.header.Get("X-Load-Balancing-Endpoint-Weight"))
	}

	in.set(withEndpoints(ep("10.0.1.1", "n1", ready)))
	eventually(t, "ready again", url, code(200))
	p.failing.Store(true)
	p.Signal()
	a = eventually(t, "the proxy unhealthy", url, code(503))
	if !strings.Contains(a.body, `"localEndpoints": 1,`) || !strings.Contains(a.body, `"serviceProxyHealthy": false`) {
		t.Errorf("with the proxy unhealthy: %q", a.body)
	}
	p.failing.Store(false)
	eventually(t, "the proxy healthy again", url, code(200))

	in.set(Snapshot{})
	if err := h.Await(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a, err := get(url); err == nil {
		t.Errorf("the Service is gone, its port still answers: %+v", a)
	}
}

// A port another process holds fails the reconcile with a clear error,
// leaves the other Services' ports served, and is bound on a retry once
// free.
func TestHealthCheckNodePortTaken(t *testing.T) {
	held, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	taken, free := held.Addr().(*net.TCPAddr).Port, freePort(t)
	in := &sources{}
	in.set(Snapshot{Services: []*corev1.Service{named("a", web(lb(int32(taken)))), named("b", web(lb(int32(free))))},
		EndpointSlices: []*discoveryv1.EndpointSlice{slice("a-1", "a", http, ep("10.0.1.1", "n1", ready)),
			slice("b-1", "b", http, ep("10.0.1.2", "n1", ready))}})
	h, _ := startHealth(t, HealthConfig{Timeout: time.Minute}, in)

	eventually(t, "the free port", fmt.Sprintf("http://127.0.0.1:%d/", free), code(200))
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.Loop().Status().LastError, "Service app/a"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no error about the taken port: %+v", h.Loop().Status())
		}
	}
	if e := h.Loop().Status().LastError; !strings.Contains(e, fmt.Sprintf("healthCheckNodePort %d of Service app/a", taken)) || !strings.Contains(e, "in use") {
		t.Errorf("error %q: want the port, the Service and why", e)
	}
	held.Close()
	a := eventually(t, "the port freed", fmt.Sprintf("http://127.0.0.1:%d/", taken), code(200))
	if !strings.Contains(a.body, `"name": "a"`) {
		t.Errorf("port %d answers for another Service: %q", taken, a.body)
	}
}

// The informer keeps only what eligibility reads.
func TestNodeEligibility(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		node corev1.Node
		want bool
	}{
		{"a node", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}, true},
		{"being deleted", corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false},
		{"the autoscaler removing it", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: toBeDeleted, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}}}}, false},
	} {
		if got := eligible(trimNode(&tc.node)); got != tc.want {
			t.Errorf("%s: eligible %v, want %v", tc.name, got, tc.want)
		}
	}
}
