package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	nethttp "net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/onc-net/onc/agent/watch"
)

// HealthCheck is a Service's healthCheckNodePort as this node answers it.
type HealthCheck struct {
	Namespace, Name string
	Port            uint16
	// LocalEndpoints counts the addresses of the Service's ready endpoints
	// on this node: what a cloud load balancer asks before it sends this
	// node the Service's externalTrafficPolicy: Local traffic.
	LocalEndpoints int
}

// HealthChecks are the healthCheckNodePorts of snap's Services that node
// answers, as kube-proxy picks them (pkg/proxy/service.go): LoadBalancer
// Services with externalTrafficPolicy Local, the only ones the API gives
// one. Local endpoints are counted as kube-proxy's LocalReadyEndpoints
// does: ready (not merely serving, nor terminating), on node, each
// address once whatever its ports.
func HealthChecks(snap Snapshot, node string) []HealthCheck {
	var out []HealthCheck
	byService := slicesByService(snap)
	for _, svc := range snap.Services {
		spec := svc.Spec
		if spec.Type != corev1.ServiceTypeLoadBalancer || spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
			spec.HealthCheckNodePort == 0 {
			continue
		}
		// The uplink serves IPv4: its endpoints are the IPv4 family's.
		if _, ok := clusterIP(svc, corev1.IPv4Protocol); !ok {
			continue
		}
		local := map[netip.Addr]bool{}
		for _, eps := range endpoints(byService[sliceSet{svc.Namespace + "/" + svc.Name, discoveryv1.AddressTypeIPv4}], corev1.IPv4Protocol, node) {
			for _, e := range eps {
				if e.local && e.Ready {
					local[e.Addr.Addr()] = true
				}
			}
		}
		out = append(out, HealthCheck{Namespace: svc.Namespace, Name: svc.Name, Port: uint16(spec.HealthCheckNodePort), LocalEndpoints: len(local)})
	}
	return out
}

// HealthConfig is what Health serves.
type HealthConfig struct {
	// ProxyMode is where /proxyMode answers "onc", host:port (where
	// kube-proxy's --metrics-bind-address answers its mode; ONC's metrics
	// are on its own port); "" serves none.
	ProxyMode string
	// Healthz is where /healthz and /livez are served, host:port
	// (kube-proxy's --healthz-bind-address); "" serves neither.
	Healthz string
	// Timeout is how long a change the services watcher has seen may stay
	// unapplied before the proxy counts as unhealthy (kube-proxy: twice
	// its sync period).
	Timeout time.Duration
	// Node says whether this node may take traffic; nil: always.
	Node Eligibility
}

// Eligibility tells whether this node may take load-balanced traffic.
type Eligibility interface{ Eligible() bool }

// Health serves kube-proxy's health endpoints on this node for ONC when
// it replaces kube-proxy (k8s.io/kubernetes pkg/proxy/healthcheck):
// /healthz and /livez, whose health is the services watcher's (proxy),
// and each Service's healthCheckNodePort. Its own loop opens and closes
// the latter as Services come and go.
type Health struct {
	*watch.Informed
	cfg    HealthConfig
	proxy  *watch.Watcher
	inputs Snapshots
	node   string
	retry  time.Duration // between attempts to bind Healthz

	servers map[string]*healthCheckServer // by namespace/name; reconcile's own
}

// NewHealth serves the health of proxy, the services watcher's loop, for
// node, with healthCheckNodePorts from the Services of in.
func NewHealth(cfg HealthConfig, proxy *watch.Watcher, in Snapshots, node string, resync time.Duration) *Health {
	h := &Health{cfg: cfg, proxy: proxy, inputs: in, node: node, retry: 5 * time.Second, servers: map[string]*healthCheckServer{}}
	h.Informed = watch.NewInformed("health", resync, h.reconcile)
	in.OnChange(h.Signal)
	return h
}

// Run serves until ctx ends, then closes every listener.
func (h *Health) Run(ctx context.Context) {
	var serving sync.WaitGroup
	if h.cfg.Healthz != "" {
		mux := nethttp.NewServeMux()
		mux.HandleFunc("/healthz", func(w nethttp.ResponseWriter, _ *nethttp.Request) { h.answer(w, true) })
		mux.HandleFunc("/livez", func(w nethttp.ResponseWriter, _ *nethttp.Request) { h.answer(w, false) })
		serving.Go(func() { h.serveRetrying(ctx, h.cfg.Healthz, "kube-proxy's /healthz and /livez", mux) })
	}
	if h.cfg.ProxyMode != "" {
		mux := nethttp.NewServeMux()
		mux.HandleFunc("/proxyMode", func(w nethttp.ResponseWriter, _ *nethttp.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			_, _ = io.WriteString(w, ProxyModeName)
		})
		serving.Go(func() { h.serveRetrying(ctx, h.cfg.ProxyMode, "kube-proxy's /proxyMode", mux) })
	}
	h.Informed.Run(ctx)
	for key, s := range h.servers {
		s.close()
		delete(h.servers, key)
	}
	serving.Wait()
}

// ProxyModeName is what /proxyMode answers, where kube-proxy names its
// mode (iptables, nftables, ipvs).
const ProxyModeName = "onc"

// serveRetrying serves handler on addr until ctx ends. While another
// process holds the address (kube-proxy, until it is gone from the node)
// it tries again every few seconds, as kube-proxy does.
func (h *Health) serveRetrying(ctx context.Context, addr, what string, handler nethttp.Handler) {
	var failed string
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			slog.Info("serving "+what, "addr", l.Addr())
			serve(ctx, l, handler)
			return
		}
		if err.Error() != failed {
			slog.Error("cannot serve "+what+"; retrying", "addr", addr, "err", err)
			failed = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.retry):
		}
	}
}

// serve serves l with handler until ctx ends.
func serve(ctx context.Context, l net.Listener, handler nethttp.Handler) {
	srv := &nethttp.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	if err := srv.Serve(l); !errors.Is(err, nethttp.ErrServerClosed) {
		slog.Error("health server stopped", "addr", l.Addr(), "err", err)
	}
}

// proxyHealth is kube-proxy's ProxyHealth, its /healthz and /livez body.
type proxyHealth struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"` // /healthz only
	Healthy      bool      `json:"healthy"`
	// By IP family, once that family's proxy has synced; ONC's is IPv4.
	Status map[corev1.IPFamily]familyHealth `json:"status,omitempty"`
}

type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// health is the proxy's: unhealthy while a change it has seen has waited
// longer than the timeout to be applied.
func (h *Health) health() proxyHealth {
	st := h.proxy.Status()
	now := time.Now()
	ph := proxyHealth{LastUpdated: st.LastApplied, CurrentTime: now,
		Healthy: st.Pending.IsZero() || now.Sub(st.Pending) < h.cfg.Timeout}
	if !st.LastApplied.IsZero() {
		ph.Status = map[corev1.IPFamily]familyHealth{corev1.IPv4Protocol: {LastUpdated: st.LastApplied, Healthy: ph.Healthy}}
	}
	return ph
}

// answer writes /healthz (withNode) or /livez: 200 when healthy (on
// /healthz also the node eligible), else 503.
func (h *Health) answer(w nethttp.ResponseWriter, withNode bool) {
	ph := h.health()
	ok := ph.Healthy
	if withNode {
		eligible := h.cfg.Node == nil || h.cfg.Node.Eligible()
		ph.NodeEligible = &eligible
		ok = ok && eligible
	}
	if ok {
		ph.LastUpdated = ph.CurrentTime // kube-proxy's compatibility: healthy reads as just updated
	}
	body, _ := json.Marshal(ph) // of a type that always marshals
	writeJSON(w, ok, body)
}

// writeJSON writes body as kube-proxy's health servers do: JSON, 200 if
// ok, else 503.
func writeJSON(w nethttp.ResponseWriter, ok bool, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := nethttp.StatusOK
	if !ok {
		code = nethttp.StatusServiceUnavailable
	}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// reconcile opens a listener for every wanted healthCheckNodePort and
// closes the rest. A port it cannot bind fails the reconcile, which the
// loop logs and retries; the other ports are served meanwhile.
func (h *Health) reconcile(context.Context, bool) error {
	want := map[string]HealthCheck{}
	for _, hc := range HealthChecks(h.inputs.Snapshot(), h.node) {
		want[hc.Namespace+"/"+hc.Name] = hc
	}
	// Closed first: a port may have moved from one Service to another.
	for key, s := range h.servers {
		if hc, ok := want[key]; !ok || hc.Port != s.port {
			s.close()
			delete(h.servers, key)
			slog.Info("healthCheckNodePort closed", "service", key, "port", s.port)
		}
	}
	var errs []error
	for key, hc := range want {
		if s, ok := h.servers[key]; ok {
			s.local.Store(int64(hc.LocalEndpoints))
			continue
		}
		s, err := h.listen(hc)
		if err != nil {
			errs = append(errs, fmt.Errorf("healthCheckNodePort %d of Service %s: %w", hc.Port, key, err))
			continue
		}
		h.servers[key] = s
		slog.Info("healthCheckNodePort open", "service", key, "port", hc.Port, "localEndpoints", hc.LocalEndpoints)
	}
	return errors.Join(errs...)
}

// healthCheckServer answers one Service's healthCheckNodePort.
type healthCheckServer struct {
	port  uint16
	local atomic.Int64 // endpoints on this node
	stop  context.CancelFunc
	done  chan struct{}
}

// serviceHealth is kube-proxy's answer on a healthCheckNodePort.
type serviceHealth struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int64 `json:"localEndpoints"`
	ServiceProxyHealthy bool  `json:"serviceProxyHealthy"`
}

// listen opens hc's port on every address of the node, as kube-proxy
// does, and serves it: 200 while the Service has endpoints here and the
// proxy is healthy, else 503.
func (h *Health) listen(hc HealthCheck) (*healthCheckServer, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(int(hc.Port))))
	if err != nil {
		return nil, err
	}
	s := &healthCheckServer{port: hc.Port, done: make(chan struct{})}
	s.local.Store(int64(hc.LocalEndpoints))
	handler := nethttp.HandlerFunc(func(w nethttp.ResponseWriter, _ *nethttp.Request) {
		var body serviceHealth
		body.Service.Namespace, body.Service.Name = hc.Namespace, hc.Name
		body.LocalEndpoints, body.ServiceProxyHealthy = s.local.Load(), h.health().Healthy
		// Weighs this node by its endpoints where the load balancer can.
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(body.LocalEndpoints, 10))
		out, _ := json.MarshalIndent(body, "", "\t") // kube-proxy's layout
		writeJSON(w, body.LocalEndpoints > 0 && body.ServiceProxyHealthy, out)
	})
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go func() { serve(ctx, l, handler); close(s.done) }()
	return s, nil
}

// close stops serving and waits until the port is free.
func (s *healthCheckServer) close() {
	s.stop()
	<-s.done
}

// toBeDeleted is the taint the cluster autoscaler puts on a node it is
// about to remove (kube-proxy's healthcheck.ToBeDeletedTaint).
const toBeDeleted = "ToBeDeletedByClusterAutoscaler"

// Eligible says whether the node may take load-balanced traffic: it
// exists, is not being deleted, and the autoscaler is not removing it.
func (in *Inputs) Eligible() bool {
	n := in.Snapshot().Node
	return n != nil && eligible(n)
}

func eligible(n *corev1.Node) bool {
	if n.DeletionTimestamp != nil {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == toBeDeleted {
			return false
		}
	}
	return true
}
