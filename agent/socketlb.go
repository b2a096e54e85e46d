package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/onc-net/onc/agent/services"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bpf"
	dpservices "github.com/onc-net/onc/datapath/services"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ServiceInputs are the Kubernetes objects Services are balanced from
// (*services.Inputs: informers on Services and EndpointSlices).
type ServiceInputs interface {
	Snapshot() services.Snapshot
	// OnChange registers fn, called after any of them changes.
	OnChange(fn func())
}

// servicesNeedKubernetes is what the agent says about Services on etcd.
const servicesNeedKubernetes = "no Services: they need the Kubernetes datastore (--datastore=kubernetes)"

// serviceWatcher keeps the socket programs balancing the cluster's
// Services: every informer event only signals, and each reconcile compiles
// the whole table from the caches; the datapath writes only the services
// that changed.
type serviceWatcher struct {
	a      *Agent
	inputs ServiceInputs
	*informed
	count int // service ports last synced, for the log; reconcile's own
}

func newServiceWatcher(a *Agent, in ServiceInputs) *serviceWatcher {
	s := &serviceWatcher{a: a, inputs: in}
	s.informed = newInformed("services", a.cfg.Resync, s.reconcile)
	in.OnChange(s.signal)
	return s
}

func (s *serviceWatcher) reconcile(ctx context.Context, full bool) error {
	if s.a.dp.SocketLB() == nil {
		return nil // off, failed (status says why) or not up yet: bringUp signals
	}
	pool, _ := s.a.readyPool()
	if pool == nil {
		return nil // bringUp signals
	}
	var pods []netip.Addr
	for _, att := range pool.List() {
		pods = append(pods, att.IP)
	}
	svcs := services.Compile(s.inputs.Snapshot(), s.a.cfg.NodeName)
	if err := s.a.dp.SyncServices(svcs, pods, full); err != nil {
		return err
	}
	if len(svcs) != s.count {
		s.count = len(svcs)
		slog.Info("services balanced at the socket", "servicePorts", len(svcs))
	}
	return nil
}

// socketLBStatus is onctl status's line: the mode, or why nothing is
// balanced at the socket.
func (a *Agent) socketLBStatus() string {
	if a.svcs == nil {
		return servicesNeedKubernetes
	}
	if lb := a.dp.SocketLB(); lb != nil {
		return string(lb.Mode())
	}
	return a.dp.SocketLBStatus()
}

func (s *onctlServer) ListServices(ctx context.Context, _ *apiv1.ListServicesRequest) (*apiv1.ListServicesResponse, error) {
	lb := s.a.dp.SocketLB()
	if s.a.svcs == nil || lb == nil {
		return nil, status.Error(codes.FailedPrecondition, "socket load balancing: "+s.a.socketLBStatus())
	}
	ws := s.a.svcs.w.Status()
	resp := &apiv1.ListServicesResponse{Seen: ws.Seen, Applied: ws.Applied, LastError: ws.LastError,
		Mode: string(lb.Mode()), Cgroup: lb.Cgroup()}
	states, err := lb.Services()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the service map: %v", err)
	}
	affs, err := lb.Affinities()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the affinity map: %v", err)
	}
	byService := map[dpservices.Key][]*apiv1.ServiceAffinity{}
	for _, a := range affs {
		client := "host"
		switch {
		case a.Gone:
			client = fmt.Sprintf("gone (netns %d)", a.Netns)
		case a.Pod.IsValid():
			client = a.Pod.String()
		}
		byService[a.Service] = append(byService[a.Service], &apiv1.ServiceAffinity{Client: client,
			Backend: a.Backend.String(), AgeSeconds: a.Age.Seconds()})
	}
	for _, st := range states {
		bs := &apiv1.BalancedService{Name: st.Name, Vip: netip.AddrPortFrom(st.VIP, st.Port).String(), Proto: st.Proto.String(),
			AffinitySeconds: uint32(st.Affinity.Seconds()), Translated: st.Translated, Refused: st.Refused,
			Affinity: byService[st.Key()]}
		for _, b := range st.Backends {
			bs.Backends = append(bs.Backends, &apiv1.ServiceBackend{Addr: b.Addr.String(), Pod: b.Pod, Node: b.Node, Ready: b.Ready})
		}
		resp.Services = append(resp.Services, bs)
	}
	stats, err := lb.Stats()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the socket-LB counters: %v", err)
	}
	resp.Counters = counters("socklb", stats)
	return resp, nil
}

// counters are a program's counters as onctl shows them.
func counters(program string, cs []bpf.Counter) []*apiv1.Counter {
	out := make([]*apiv1.Counter, len(cs))
	for i, c := range cs {
		out[i] = &apiv1.Counter{Program: program, Name: c.Name, Value: c.Value}
	}
	return out
}
