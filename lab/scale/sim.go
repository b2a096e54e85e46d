// Package scale is ONC's scale bed. A Sim stands in for many nodes in a
// lab's real datastore (embedded etcd, or kube-apiserver): each simulated
// node registers its tunnel endpoint and keeps its liveness lease the way
// an agent does, and on Kubernetes has a Node object. The lab's real
// controller allocates their CIDRs and the lab's one real agent programs
// them all. Run is `make bench-scale`; e2e tests use the Sim alone.
package scale

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/lab"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ClusterCIDR holds 65,536 node blocks of /24; the lab's default /16 holds
// only 256.
const ClusterCIDR = "10.0.0.0/8"

// DefaultTTL is the agent's default --lease-ttl: simulated nodes renew as
// often as real agents do.
const DefaultTTL = 40 * time.Second

// LabOptions is the lab a scale run needs: one real node and a cluster
// CIDR big enough for every simulated one. Nodes never time out: only
// Sim.Remove removes one. The real agent renews its lease as often as by
// default, not every second or so as in other labs, so that the datastore
// writes counted are a real cluster's.
func LabOptions(datastore string) lab.Options {
	return lab.Options{Nodes: 1, Datastore: datastore, NodeTimeout: 24 * time.Hour,
		ControllerArgs: []string{"--cluster-cidr", ClusterCIDR, "--node-prefix-len", "24"},
		AgentArgs:      []string{"--lease-ttl", DefaultTTL.String()}}
}

// nodeIPs is where simulated nodes' underlay addresses come from (shared
// address space, so never a lab's or the host's).
var nodeIPs = netip.MustParsePrefix("100.64.0.0/10")

// SimOptions configure a Sim.
type SimOptions struct {
	TTL      time.Duration // liveness lease TTL of every simulated node; default DefaultTTL
	Parallel int           // registrations in flight; default 32
}

// Sim is a set of simulated nodes in a lab's datastore, their heartbeats
// running in this process until Remove or Close.
type Sim struct {
	store    datastore.Store
	kube     kubernetes.Interface // nil on etcd
	ttl      time.Duration
	period   time.Duration // of heartbeats
	parallel int
	hbCtx    context.Context // heartbeats run until it ends
	hbStop   context.CancelFunc

	mu    sync.Mutex
	seq   int // numbers names and addresses; never reused
	nodes map[string]*simNode
}

type simNode struct {
	spec datastore.NodeSpec
	stop context.CancelFunc
	done chan struct{} // closed when its heartbeat has stopped
}

// NewSim connects to l's datastore from this process (outside the lab's
// namespaces).
func NewSim(ctx context.Context, l *lab.Lab, o SimOptions) (*Sim, error) {
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.Parallel == 0 {
		o.Parallel = 32
	}
	s := &Sim{ttl: o.TTL, period: heartbeatPeriod(l.Datastore, o.TTL), parallel: o.Parallel, nodes: map[string]*simNode{}}
	var err error
	switch l.Datastore {
	case "kubernetes":
		cfg := l.APIServer.RESTConfig()
		// One client carries every simulated node's heartbeats; a client-side
		// rate limit would make the simulator, not the server, the bottleneck.
		cfg.QPS, cfg.Burst = 100_000, 100_000
		if s.kube, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, err
		}
		s.store, err = k8sstore.New(ctx, k8sstore.Options{Config: cfg, Agent: true})
	default:
		// As the controller: one client writes every simulated node's records.
		s.store, err = etcdstore.New(ctx, l.EtcdAdmin())
	}
	if err != nil {
		return nil, fmt.Errorf("simulator's datastore client: %w", err)
	}
	s.hbCtx, s.hbStop = context.WithCancel(context.Background())
	return s, nil
}

// TTL of the simulated nodes' liveness leases.
func (s *Sim) TTL() time.Duration { return s.ttl }

// addrOf is the i-th simulated node address (the first is .1).
func addrOf(i int) netip.Addr {
	a := nodeIPs.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// specOf is simulated node i: a distinct name, address and locally
// administered VTEP MAC, running the fast path (so the agent programs
// the fast path's maps for it too).
func specOf(i int) datastore.NodeSpec {
	return datastore.NodeSpec{Name: fmt.Sprintf("sim-%05d", i), IP: addrOf(i),
		VTEPMAC:  net.HardwareAddr{0x0e, 0x5c, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)},
		FastPath: true}
}

func (s *Sim) next() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	if !nodeIPs.Contains(addrOf(s.seq)) {
		panic("scale: simulated node addresses exhausted")
	}
	return s.seq
}

// Add registers n new nodes, Parallel at a time, and starts their
// heartbeats (each within one renewal period: a node is not alive at
// once). It returns their names, in order, also on error (then only
// those that registered).
func (s *Sim) Add(ctx context.Context, n int) ([]string, error) {
	specs := make([]datastore.NodeSpec, n)
	for i := range specs {
		specs[i] = specOf(s.next())
	}
	sem := make(chan struct{}, s.parallel)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, spec := range specs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = s.start(ctx, spec)
		}()
	}
	wg.Wait()
	var names []string
	var first error
	for i, spec := range specs {
		if errs[i] == nil {
			names = append(names, spec.Name)
		} else if first == nil {
			first = errs[i]
		}
	}
	if first != nil {
		return names, fmt.Errorf("%d of %d registrations failed, the first: %w", n-len(names), n, first)
	}
	return names, nil
}

// start does what an agent does when it first comes up: on Kubernetes its
// kubelet has made the Node (without which the controller removes the
// node), then it registers and keeps its lease.
func (s *Sim) start(ctx context.Context, spec datastore.NodeSpec) error {
	if s.kube != nil {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: map[string]string{"kubernetes.io/hostname": spec.Name}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: spec.IP.String()}}}}
		if _, err := s.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Node %s: %w", spec.Name, err)
		}
	}
	if err := s.store.RegisterNode(ctx, spec); err != nil {
		return fmt.Errorf("register %s: %w", spec.Name, err)
	}
	hb, stop := context.WithCancel(s.hbCtx)
	sn := &simNode{spec: spec, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(sn.done)
		// Nodes registered together would renew together, in bursts of
		// thousands; a real cluster's renewals are spread over the period.
		select {
		case <-hb.Done():
			return
		case <-time.After(rand.N(s.period)):
		}
		_ = s.store.KeepAlive(hb, spec.Name, s.ttl) // it retries failures itself, until hb ends
	}()
	s.mu.Lock()
	s.nodes[spec.Name] = sn
	s.mu.Unlock()
	return nil
}

// Remove takes a node away as when its machine goes: its heartbeat stops
// (the lease is revoked or deleted), then on Kubernetes its Node is
// deleted (the controller deletes its record and frees its block); on etcd
// the record is deleted as the controller does once the node timeout has
// passed.
func (s *Sim) Remove(ctx context.Context, name string) error {
	s.mu.Lock()
	sn := s.nodes[name]
	delete(s.nodes, name)
	s.mu.Unlock()
	if sn == nil {
		return fmt.Errorf("no simulated node %s", name)
	}
	sn.stop()
	<-sn.done
	if s.kube != nil {
		return s.kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	}
	return s.store.DeleteNode(ctx, name)
}

// Readdress gives a node a new underlay address (a re-registration with
// the same name, MAC and CIDR) and returns it.
func (s *Sim) Readdress(ctx context.Context, name string) (netip.Addr, error) {
	ip := addrOf(s.next())
	s.mu.Lock()
	sn := s.nodes[name]
	s.mu.Unlock()
	if sn == nil {
		return netip.Addr{}, fmt.Errorf("no simulated node %s", name)
	}
	spec := sn.spec
	spec.IP = ip
	if err := s.store.RegisterNode(ctx, spec); err != nil {
		return netip.Addr{}, err
	}
	s.mu.Lock()
	sn.spec = spec
	s.mu.Unlock()
	return ip, nil
}

// Spec of a simulated node as last registered.
func (s *Sim) Spec(name string) (datastore.NodeSpec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn := s.nodes[name]
	if sn == nil {
		return datastore.NodeSpec{}, false
	}
	return sn.spec, true
}

// Names of the simulated nodes, sorted.
func (s *Sim) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.nodes))
	for n := range s.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// CIDR is a node's pod CIDR, invalid until the controller has allocated it.
func (s *Sim) CIDR(ctx context.Context, name string) (netip.Prefix, error) {
	n, err := s.store.Node(ctx, name)
	if errors.Is(err, datastore.ErrNotFound) {
		return netip.Prefix{}, nil
	}
	return n.IPv4PodCIDR(), err
}

// WaitAllocated waits until every named node has a pod CIDR, re-reading
// on the datastore's change signals (at most every 250ms, so that with
// thousands of nodes the reads do not load the datastore the controller
// is writing to). progress, if not nil, gets the count after each read.
func (s *Sim) WaitAllocated(ctx context.Context, names []string, progress func(allocated int)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := s.store.Changes(ctx)
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for {
		nodes, err := s.store.Nodes(ctx)
		if err != nil {
			return err
		}
		got := 0
		for _, n := range nodes {
			if want[n.Name] && n.IPv4PodCIDR().IsValid() {
				got++
			}
		}
		if progress != nil {
			progress(got)
		}
		if got == len(want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d simulated nodes have a pod CIDR: %w", got, len(want), ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
		select {
		case <-ctx.Done():
		case <-changes:
		case <-time.After(2 * time.Second):
		}
	}
}

// Alive counts the simulated nodes whose liveness lease the datastore
// holds now.
func (s *Sim) Alive(ctx context.Context) (int, error) {
	alive, err := s.store.Liveness(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range s.Names() {
		if alive[name] {
			n++
		}
	}
	return n, nil
}

// WaitAlive waits until every simulated node's heartbeat has started and
// its lease is held: from then on heartbeats only renew.
func (s *Sim) WaitAlive(ctx context.Context) error {
	for {
		alive, err := s.Alive(ctx)
		if err != nil {
			return err
		}
		if want := len(s.Names()); alive == want {
			return nil
		} else if ctx.Err() != nil {
			return fmt.Errorf("%d of %d simulated nodes alive: %w", alive, want, ctx.Err())
		}
		select { // each read lists every lease: not too often
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// Close stops every heartbeat (revoking or deleting the leases) and the
// datastore client; what the simulated nodes registered stays.
func (s *Sim) Close() {
	s.hbStop()
	s.mu.Lock()
	nodes := make([]*simNode, 0, len(s.nodes))
	for _, sn := range s.nodes {
		nodes = append(nodes, sn)
	}
	s.mu.Unlock()
	for _, sn := range nodes {
		<-sn.done
	}
	s.store.Close()
}
