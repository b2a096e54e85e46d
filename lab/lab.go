// Package lab builds ONC's local lab: a few "nodes" as network namespaces
// on a shared underlay bridge, the real onc-controller (embedded etcd) and
// one real onc-agent per node as processes inside those namespaces, and
// pods as namespaces attached by invoking the real `onc` CNI binary through
// libcni, exactly as a container runtime does; with the Kubernetes
// datastore each pod is also a Pod object, made and given its status the
// way a kubelet would (AddPodSpec). The lab is also the end-to-end test
// bed. All it creates carries its name prefix.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/atomicfile"
	"github.com/onc-net/onc/internal/daemon"
	"github.com/onc-net/onc/internal/kubeapiserver"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// Options of a lab.
type Options struct {
	Prefix      string // names every namespace; short, e.g. "onclab"
	BinDir      string // holds onc, onc-agent, onc-controller
	Nodes       int
	PodsPerNode int
	// NodeTimeout is the controller's --node-timeout: how soon a removed
	// node's CIDR and tunnel entries go away.
	NodeTimeout time.Duration
	StateRoot   string // default /run/onc-lab
	// ControllerArgs are extra onc-controller flags, e.g. --cluster-cidr.
	ControllerArgs []string
	// AgentArgs are extra onc-agent flags, e.g. --fast-path=false.
	AgentArgs []string
	// Datastore is "etcd" (default: the controller's embedded etcd) or
	// "kubernetes": a real kube-apiserver from KubeBin in the controller's
	// namespace, a Node object per lab node, ONC's CRD and RBAC applied
	// from manifests/onc.yaml, controller and agents as its service accounts.
	Datastore string
	KubeBin   string // directory with kube-apiserver (make kube-bins)
	// Underlay is "bridge" (default: every node's eth0 on one bridge) or
	// "direct": exactly 2 nodes whose eth0s are the two ends of one veth
	// pair, as two machines on one cable. The bridge puts two veth pairs and
	// a bridge under every packet, which dilutes the overlay's share of the cost;
	// the bench measures on "direct". The controller's namespace is on the
	// bridge either way, which the nodes join by ctl0 for the control plane.
	Underlay string
	// ExternalClient adds a host outside the cluster on the underlay
	// bridge (ExternalClientIP, and ExternalClientIPv6 with an IPv6
	// family; namespace <prefix>-ext): a client of NodePorts, externalIPs
	// and load balancer IPs.
	ExternalClient bool
	// IPFamily is the pods' families: IPFamilyIPv4 (default),
	// IPFamilyDual (ClusterCIDRs, IPv4 first; the tunnels IPv4's) or
	// IPFamilyIPv6 (ClusterCIDR6, and the tunnels between the nodes'
	// IPv6 underlay addresses). The control plane talks IPv4 either way.
	IPFamily string
}

// IP families of Options.IPFamily.
const (
	IPFamilyIPv4 = "ipv4"
	IPFamilyDual = "dual"
	IPFamilyIPv6 = "ipv6"
)

// ClusterCIDRs are a dual-stack lab's pod ranges, in the cluster's family
// order, and ClusterCIDR6 an IPv6 lab's.
const (
	ClusterCIDRs = "10.244.0.0/16," + ClusterCIDR6
	ClusterCIDR6 = "fd00:10:244::/56"
)

// Underlay addressing (inside the lab's own namespaces only).
var (
	underlay     = netip.MustParsePrefix("172.31.250.0/24")
	controllerIP = netip.MustParseAddr("172.31.250.250")
	// ExternalClientIP is Options.ExternalClient's address: above every
	// node's (.11 to .210) and below the controller's; in a dual-stack or
	// IPv6 lab it has ExternalClientIPv6 too, as the nodes have theirs.
	ExternalClientIP   = netip.MustParseAddr("172.31.250.240")
	ExternalClientIPv6 = underlay6Addr(ExternalClientIP)
	// directUnderlay addresses the direct pair's ends (Underlay "direct").
	directUnderlay = netip.MustParsePrefix("172.31.251.0/24")
)

// Underlays of Options.Underlay.
const (
	UnderlayBridge = "bridge"
	UnderlayDirect = "direct"
)

// Lab is a running lab; its JSON form is the state file lab-down reads.
type Lab struct {
	mu         sync.Mutex     // guards the node and pod lists and the state file
	Prefix     string         `json:"prefix"`
	Dir        string         `json:"dir"`
	BinDir     string         `json:"binDir"`
	Controller daemon.Process `json:"controller"`
	// ControllerArgs are the controller's flags, for RestartController.
	ControllerArgs []string `json:"controllerArgs"`
	Nodes          []*Node  `json:"nodes"`
	AgentArgs      []string `json:"agentArgs,omitempty"`
	Datastore      string   `json:"datastore"`
	Underlay       string   `json:"underlay"`
	IPFamily       string   `json:"ipFamily,omitempty"` // Options.IPFamily
	// Namespaces are the pod namespaces the lab made or labelled, with
	// their labels (on etcd only recorded).
	Namespaces map[string]map[string]string `json:"namespaces,omitempty"`
	// The Kubernetes datastore's etcd and kube-apiserver.
	Etcd      daemon.Process        `json:"etcd,omitempty"`
	APIServer *kubeapiserver.Server `json:"apiServer,omitempty"`
	KubeBin   string                `json:"kubeBin,omitempty"` // Options.KubeBin, for StartKubeProxy
	// Flannel, if StartFlannel ran it.
	Flannel *Flannel `json:"flannel,omitempty"`
	// ExternalClient is the namespace of the host outside the cluster
	// (Options.ExternalClient; at ExternalClientIP), "" when there is none.
	ExternalClient string `json:"externalClient,omitempty"`

	kubeOnce sync.Once
	kube     kubernetes.Interface
	kubeErr  error
}

// Node is one lab node.
type Node struct {
	Name  string     `json:"name"`
	Netns string     `json:"netns"`
	IP    netip.Addr `json:"ip"`
	// IPv6 is its underlay's IPv6 address in a dual-stack or IPv6 lab,
	// beside IP on the same interface: in an IPv6 lab its tunnel endpoint
	// (TunnelIP); the bench reaches the node over it for IPv6's bare rows.
	IPv6  netip.Addr     `json:"ipv6,omitzero"`
	Dir   string         `json:"dir"`
	Agent daemon.Process `json:"agent"`
	// AgentArgs are this node's extra onc-agent flags, after the lab's
	// (RestartAgent sets them).
	AgentArgs []string `json:"agentArgs,omitempty"`
	// KubeProxy is its kube-proxy, if StartKubeProxy ran one.
	KubeProxy daemon.Process `json:"kubeProxy,omitempty"`
	Pods      []*Pod         `json:"pods"`
	// PodSeq numbers pods; never reused, so names stay unique.
	PodSeq int `json:"podSeq"`
	// Flanneld and FlannelPods, if StartFlannel ran.
	Flanneld    daemon.Process `json:"flanneld,omitzero"`
	FlannelPods []*Pod         `json:"flannelPods,omitempty"`
}

// Pod is one lab pod: a namespace attached through the CNI plugin. In
// Kubernetes mode it is also a Pod object (UID set), made as a kubelet
// would: created, attached, then its status written Running and Ready
// with its IP.
type Pod struct {
	Name        string     `json:"name"`
	Netns       string     `json:"netns"`
	ContainerID string     `json:"containerID"`
	IP          netip.Addr `json:"ip"`
	// IPv6 is its IPv6 address in a dual-stack or IPv6 lab, invalid
	// otherwise (in an IPv6 lab IP is the same).
	IPv6 netip.Addr `json:"ipv6,omitzero"`
	// Namespace is its Kubernetes namespace; "" (older state) is "lab".
	Namespace string                 `json:"namespace,omitempty"`
	Node      string                 `json:"node,omitempty"`
	Labels    map[string]string      `json:"labels,omitempty"`
	Ports     []corev1.ContainerPort `json:"ports,omitempty"`
	// UID of its Pod object; empty when the API has none (etcd, or
	// DeletePodObject).
	UID string `json:"uid,omitempty"`
}

// PodSpec is what AddPodSpec makes.
type PodSpec struct {
	Namespace string // default "lab"
	// Name defaults to p<N> (numbered per node) when the pod is not a Pod
	// object, and to <node>-p<N> when it is, so it is unique in the
	// namespace.
	Name   string
	Labels map[string]string
	Ports  []corev1.ContainerPort // of its one container, "c"
	// WithoutObject, in Kubernetes mode: CNI ADD only, no Pod object, as
	// for a sandbox the kubelet sets up while the API server is away.
	WithoutObject bool
}

// DefaultNamespace is where AddPod's pods are.
const DefaultNamespace = "lab"

// Key is the pod's namespace/name.
func (p *Pod) Key() string { return p.ns() + "/" + p.Name }

func (p *Pod) ns() string {
	if p.Namespace == "" {
		return DefaultNamespace
	}
	return p.Namespace
}

// NetnsPath of a named namespace.
func NetnsPath(name string) string { return "/run/netns/" + name }

func stateDir(root, prefix string) string {
	if root == "" {
		root = "/run/onc-lab"
	}
	return filepath.Join(root, prefix)
}

// Up builds the lab. On failure it removes everything it made.
func Up(ctx context.Context, o Options) (l *Lab, err error) {
	if o.Prefix == "" || len(o.Prefix) > 10 || strings.ContainsAny(o.Prefix, "/ ") {
		return nil, fmt.Errorf("prefix %q: 1-10 characters, no '/' or spaces", o.Prefix)
	}
	if o.Nodes < 1 || o.Nodes > 200 {
		return nil, fmt.Errorf("nodes %d: must be 1..200", o.Nodes)
	}
	switch o.Datastore {
	case "":
		o.Datastore = "etcd"
	case "etcd", "kubernetes":
	default:
		return nil, fmt.Errorf("datastore %q: etcd or kubernetes", o.Datastore)
	}
	switch o.Underlay {
	case "":
		o.Underlay = UnderlayBridge
	case UnderlayBridge:
	case UnderlayDirect:
		if o.Nodes != 2 {
			return nil, fmt.Errorf("underlay direct joins exactly 2 nodes, not %d", o.Nodes)
		}
	default:
		return nil, fmt.Errorf("underlay %q: bridge or direct", o.Underlay)
	}
	if o.ExternalClient && o.Underlay == UnderlayDirect {
		return nil, errors.New("an external client joins the underlay bridge; underlay direct has none between the nodes")
	}
	switch o.IPFamily {
	case "", IPFamilyIPv4:
	case IPFamilyDual:
		o.ControllerArgs = append([]string{"--cluster-cidr", ClusterCIDRs}, o.ControllerArgs...)
	case IPFamilyIPv6:
		o.ControllerArgs = append([]string{"--cluster-cidr", ClusterCIDR6}, o.ControllerArgs...)
	default:
		return nil, fmt.Errorf("IP family %q: %s, %s or %s", o.IPFamily, IPFamilyIPv4, IPFamilyDual, IPFamilyIPv6)
	}
	for _, b := range []string{"onc", "onc-agent", "onc-controller", "onc-lab"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s missing in %s (run make build): %w", b, o.BinDir, err)
		}
	}
	dir := stateDir(o.StateRoot, o.Prefix)
	if _, err := os.Stat(filepath.Join(dir, "lab.json")); err == nil {
		return nil, fmt.Errorf("lab %s is already up (state in %s); take it down first", o.Prefix, dir)
	}
	if leftovers := namespaces(o.Prefix); len(leftovers) > 0 {
		return nil, fmt.Errorf("namespaces of lab %s already exist (%s); take it down first", o.Prefix, strings.Join(leftovers, " "))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	l = &Lab{Prefix: o.Prefix, Dir: dir, BinDir: o.BinDir, AgentArgs: o.AgentArgs, Datastore: o.Datastore, KubeBin: o.KubeBin, Underlay: o.Underlay,
		IPFamily: o.IPFamily}
	defer func() {
		if err != nil {
			_ = l.Down()
		}
	}()
	if err := l.underlay(); err != nil {
		return l, err
	}
	if err := l.attach(l.ctlNetns(), "ctl", "eth0", controllerIP); err != nil {
		return l, err
	}
	if l.Datastore == "kubernetes" {
		if err := l.startKubernetes(ctx, o.KubeBin, o.IPFamily != "" && o.IPFamily != IPFamilyIPv4); err != nil {
			return l, err
		}
	}
	if err := l.startController(o.NodeTimeout, o.ControllerArgs); err != nil {
		return l, err
	}
	if l.Datastore == "etcd" {
		if err := l.waitEtcd(ctx); err != nil {
			return l, err
		}
	}
	for i := 1; i <= o.Nodes; i++ {
		if _, err := l.AddNode(ctx); err != nil {
			return l, err
		}
	}
	for _, n := range l.Nodes {
		if err := l.WaitReady(ctx, n); err != nil {
			return l, err
		}
	}
	for _, n := range l.Nodes {
		for j := 1; j <= o.PodsPerNode; j++ {
			if _, err := l.AddPod(ctx, n); err != nil {
				return l, err
			}
		}
	}
	if o.ExternalClient {
		// Down removes it with every namespace of the prefix.
		if l.ExternalClient, _, err = l.AddOutsider(l.Prefix+"-ext", ExternalClientIP); err != nil {
			return l, err
		}
		if l.IPFamily == IPFamilyDual || l.IPFamily == IPFamilyIPv6 {
			if err := run([][]string{{"ip", "-n", l.ExternalClient, "addr", "add", netip.PrefixFrom(ExternalClientIPv6, 64).String(), "dev", "eth0", "nodad"}}); err != nil {
				return l, err
			}
		}
	}
	return l, l.Save()
}

// Load reads a running lab's state.
func Load(root, prefix string) (*Lab, error) {
	b, err := os.ReadFile(filepath.Join(stateDir(root, prefix), "lab.json"))
	if err != nil {
		return nil, err
	}
	var l Lab
	return &l, json.Unmarshal(b, &l)
}

// Save writes the state file.
func (l *Lab) Save() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.save()
}

func (l *Lab) save() error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(l.Dir, "lab.json"), b, 0o644)
}

func (l *Lab) ulNetns() string  { return l.Prefix + "-ul" }
func (l *Lab) ctlNetns() string { return l.Prefix + "-ctl" }

// UnderlayNetns is the namespace of the underlay: its bridge (br0), or the
// parked end of the direct pair. Tests change the underlay there.
func (l *Lab) UnderlayNetns() string { return l.ulNetns() }

// EtcdURL is where the lab's agents reach the embedded etcd.
func (l *Lab) EtcdURL() string { return "https://" + controllerIP.String() + ":2379" }

// etcdDir is the controller's --embedded-etcd-dir: its data and PKI.
func (l *Lab) etcdDir() string { return filepath.Join(l.Dir, "etcd") }

// EtcdAdmin connects a client outside the lab (a test, a benchmark) to
// the embedded etcd as the controller: its credentials, etcd's root user,
// dialled from the controller's namespace.
func (l *Lab) EtcdAdmin() etcdstore.Options {
	return etcdstore.Options{Endpoints: []string{l.EtcdURL()}, TLSFiles: etcdserver.ControllerFiles(etcdserver.PKIDir(l.etcdDir())),
		Dial: func(ctx context.Context, addr string) (net.Conn, error) { return l.DialDatastore(ctx, "tcp", addr) }}
}

// EtcdFiles are the node's agent's credentials for the embedded etcd,
// which AddNode has the controller issue (onc-controller node-cert).
func (n *Node) EtcdFiles() etcdstore.TLSFiles { return etcdserver.NodeFiles(n.etcdDir()) }

func (n *Node) etcdDir() string { return filepath.Join(n.Dir, "etcd") }

// embeddedEtcdArgs name the controller's embedded etcd to onc-controller
// and its subcommands.
func (l *Lab) embeddedEtcdArgs() []string {
	return []string{"--embedded-etcd-dir", l.etcdDir(), "--embedded-etcd-listen", l.EtcdURL()}
}

// waitEtcd waits until the controller's embedded etcd answers its
// controller: before that, no node can get its credentials.
func (l *Lab) waitEtcd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	o := l.EtcdAdmin()
	o.DialTimeout = time.Second
	for {
		s, err := etcdstore.New(ctx, o)
		if err == nil {
			return s.Close()
		}
		if !l.Controller.Alive() || ctx.Err() != nil {
			return fmt.Errorf("the controller's embedded etcd does not answer: %w; controller log %s:\n%s", err, l.Controller.Log, daemon.Tail(l.Controller.Log, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DialDatastore connects to addr from inside the controller's namespace,
// where the lab's datastore serves (the embedded etcd, or kube-apiserver
// and its etcd): how a client outside the lab, a test or a benchmark,
// reaches it. The connection stays there whichever thread uses it.
func (l *Lab) DialDatastore(ctx context.Context, network, addr string) (net.Conn, error) {
	return DialIn(ctx, l.ctlNetns(), network, addr)
}

// dialIn connects to addr from inside netns.
func DialIn(ctx context.Context, netns, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := InNetns(netns, func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

func (l *Lab) underlay() error {
	ul := l.ulNetns()
	return run([][]string{
		{"ip", "netns", "add", ul},
		{"ip", "-n", ul, "link", "set", "lo", "up"},
		{"ip", "-n", ul, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", ul, "link", "set", "br0", "up"},
	})
}

// attach creates netns name with dev on the underlay bridge at ip.
func (l *Lab) attach(name, port, dev string, ip netip.Addr) error {
	ul := l.ulNetns()
	return run([][]string{
		{"ip", "netns", "add", name},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", ul, "link", "add", port, "type", "veth", "peer", "name", dev, "netns", name},
		{"ip", "-n", ul, "link", "set", port, "master", "br0", "up"},
		{"ip", "-n", name, "addr", "add", netip.PrefixFrom(ip, underlay.Bits()).String(), "dev", dev},
		{"ip", "-n", name, "link", "set", dev, "up"},
	})
}

// directEnd gives node number i (1 or 2) its end of the direct pair as
// eth0 at ip. Node 1's turn makes the pair and parks the far end in the
// underlay namespace, where node 2's turn takes it.
func (l *Lab) directEnd(netns string, i int, ip netip.Addr) error {
	ul, parked := l.ulNetns(), "direct2"
	var cmds [][]string
	switch i {
	case 1:
		cmds = [][]string{{"ip", "-n", ul, "link", "add", parked, "type", "veth", "peer", "name", "eth0", "netns", netns}}
	case 2:
		cmds = [][]string{
			{"ip", "-n", ul, "link", "set", parked, "netns", netns},
			{"ip", "-n", netns, "link", "set", parked, "name", "eth0"},
		}
	default: // AddNode refuses these
		return fmt.Errorf("underlay direct joins exactly 2 nodes; node %d has no cable", i)
	}
	// GRO on, as every NIC driver does it (a veth does not by default):
	// without it a receiver takes each MTU-sized packet through the stack.
	return run(append(cmds,
		[]string{"ip", "-n", netns, "addr", "add", netip.PrefixFrom(ip, directUnderlay.Bits()).String(), "dev", "eth0"},
		[]string{"ip", "netns", "exec", netns, "ethtool", "-K", "eth0", "gro", "on"},
		[]string{"ip", "-n", netns, "link", "set", "eth0", "up"}))
}

func (l *Lab) startController(nodeTimeout time.Duration, extra []string) error {
	args := l.embeddedEtcdArgs()
	if l.Datastore == "kubernetes" {
		args = []string{"--datastore=kubernetes", "--kubeconfig", l.controllerKubeconfig()}
	}
	l.ControllerArgs = append(append(args, "--node-timeout", nodeTimeout.String()), extra...)
	return l.RestartController()
}

// RestartController stops the controller (on etcd: and the datastore it
// embeds) if it runs, and starts it again with the same flags.
func (l *Lab) RestartController() error {
	l.Controller.Stop()
	p, err := daemon.Start(l.ctlNetns(), filepath.Join(l.Dir, "controller.log"), filepath.Join(l.BinDir, "onc-controller"), l.ControllerArgs...)
	if err != nil {
		return err
	}
	l.Controller = p
	return l.Save()
}

// AddNode creates the next node and starts its agent (not waiting for it).
func (l *Lab) AddNode(ctx context.Context) (*Node, error) {
	i := len(l.Nodes) + 1
	for _, n := range l.Nodes { // numbers are never reused, even after RemoveNode
		var k int
		fmt.Sscanf(strings.TrimPrefix(n.Name, l.Prefix+"-n"), "%d", &k)
		i = max(i, k+1)
	}
	short := fmt.Sprintf("n%d", i)
	n := &Node{Name: l.Prefix + "-" + short, IP: hostAddr(underlay, 10+i), Dir: filepath.Join(l.Dir, short)}
	n.Netns = n.Name
	if l.Underlay == UnderlayDirect && i > 2 {
		return nil, fmt.Errorf("underlay direct joins exactly 2 nodes; node %d has no cable", i)
	}
	if l.Underlay == UnderlayDirect {
		// The node's address, and so its tunnels, are on the direct
		// pair; ctl0 carries only the control plane.
		n.IP = hostAddr(directUnderlay, 10+i)
		if err := l.attach(n.Netns, short, "ctl0", hostAddr(underlay, 10+i)); err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, n)
		if err := l.directEnd(n.Netns, i, n.IP); err != nil {
			return nil, err
		}
	} else {
		if err := l.attach(n.Netns, short, "eth0", n.IP); err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, n)
	}
	if l.IPFamily == IPFamilyDual || l.IPFamily == IPFamilyIPv6 {
		n.IPv6 = underlay6Addr(n.IP)
		if err := run([][]string{{"ip", "-n", n.Netns, "addr", "add", netip.PrefixFrom(n.IPv6, 64).String(), "dev", "eth0", "nodad"}}); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(n.Dir, "net.d"), 0o755); err != nil {
		return nil, err
	}
	// The agent's bpffs is mounted here, in the host's mount namespace:
	// one the agent mounted itself would vanish with its `ip netns exec`
	// mount namespace, and pinned maps and links must outlive the agent.
	if err := os.MkdirAll(n.BPFFS(), 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("bpf", n.BPFFS(), "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("mount bpffs at %s: %w", n.BPFFS(), err)
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": "onc",
  "plugins": [{"type": "onc", "agentSocket": %q, "capabilities": {"portMappings": true}}]
}
`, filepath.Join(n.Dir, "run", "cni.sock"))
	if err := os.WriteFile(filepath.Join(n.Dir, "net.d", "10-onc.conflist"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if l.Datastore == "kubernetes" {
		if err := l.createNode(ctx, n); err != nil {
			return nil, err
		}
	} else if err := l.nodeCert(n); err != nil {
		return nil, err
	}
	if err := l.StartAgent(n); err != nil {
		return nil, err
	}
	return n, l.Save()
}

// underlay6Addr is the IPv6 underlay address of the node at IPv4 address
// a.b.c.d: fd00:a:b:c::d, its decimal digits read as hex, so nodes on one
// IPv4 underlay share a /64 and 172.31.251.12 is fd00:172:31:251::12.
func underlay6Addr(a netip.Addr) netip.Addr {
	b := a.As4()
	return netip.MustParseAddr(fmt.Sprintf("fd00:%d:%d:%d::%d", b[0], b[1], b[2], b[3]))
}

// hostAddr is host number i of an IPv4 prefix.
func hostAddr(p netip.Prefix, i int) netip.Addr {
	a := p.Addr().As4()
	a[3] = byte(i)
	return netip.AddrFrom4(a)
}

// nodeCert has the controller issue n's etcd credentials, as an
// operator would: onc-controller node-cert where the controller runs.
func (l *Lab) nodeCert(n *Node) error {
	return run([][]string{append([]string{"ip", "netns", "exec", l.ctlNetns(),
		filepath.Join(l.BinDir, "onc-controller"), "node-cert", n.Name, "--out", n.etcdDir()}, l.embeddedEtcdArgs()...)})
}

// TunnelIP is n's address as ONC knows it, its overlay's tunnel
// endpoint: IPv6 in an IPv6 lab, IPv4 otherwise.
func (l *Lab) TunnelIP(n *Node) netip.Addr {
	if l.IPFamily == IPFamilyIPv6 {
		return n.IPv6
	}
	return n.IP
}

// StartAgent (re)starts a node's agent process.
func (l *Lab) StartAgent(n *Node) error {
	args := []string{"--node-name", n.Name, "--node-ip", l.TunnelIP(n).String(),
		"--state-dir", filepath.Join(n.Dir, "state"), "--run-dir", filepath.Join(n.Dir, "run"), "--bpffs", n.BPFFS(),
		"--lease-ttl", "5s"}
	if l.Datastore == "kubernetes" {
		kubeconfig, err := l.agentKubeconfig(n)
		if err != nil {
			return err
		}
		args = append(args, "--datastore=kubernetes", "--kubeconfig", kubeconfig)
	} else {
		f := n.EtcdFiles()
		args = append(args, "--etcd-endpoints", l.EtcdURL(), "--etcd-cafile", f.CAFile, "--etcd-certfile", f.CertFile, "--etcd-keyfile", f.KeyFile)
	}
	args = append(append(args, l.AgentArgs...), n.AgentArgs...) // the last of a flag wins
	p, err := daemon.Start(n.Netns, filepath.Join(n.Dir, "agent.log"), filepath.Join(l.BinDir, "onc-agent"), args...)
	if err != nil {
		return err
	}
	n.Agent = p
	return l.Save()
}

// RestartAgent restarts n's agent with extra flags on top of the lab's
// (none: as the lab started it) and waits until it is ready.
func (l *Lab) RestartAgent(ctx context.Context, n *Node, extra ...string) error {
	n.Agent.Stop()
	n.AgentArgs = extra
	if err := l.StartAgent(n); err != nil {
		return err
	}
	return l.WaitReady(ctx, n)
}

// BPFFS is where the node's agent pins its eBPF maps and links.
func (n *Node) BPFFS() string { return filepath.Join(n.Dir, "bpf") }

// AgentSocket of a node, for onctl.
func (n *Node) AgentSocket() string { return filepath.Join(n.Dir, "run", "agent.sock") }

// AgentAPI connects to a node's agent API; close the connection after use.
func (n *Node) AgentAPI() (apiv1.AgentClient, io.Closer, error) {
	conn, err := grpc.NewClient("unix://"+n.AgentSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return apiv1.NewAgentClient(conn), conn, nil
}

// Status asks a node's agent for its status.
func (n *Node) Status(ctx context.Context) (*apiv1.NodeStatus, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return c.GetStatus(ctx, &apiv1.GetStatusRequest{})
}

// WaitReady waits until the node's agent reports ready.
func (l *Lab) WaitReady(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	last := "agent socket not up"
	for {
		if !n.Agent.Alive() {
			return fmt.Errorf("agent of %s exited; log %s:\n%s", n.Name, n.Agent.Log, daemon.Tail(n.Agent.Log, 20))
		}
		if st, err := n.Status(ctx); err == nil {
			if st.Ready {
				return nil
			}
			last = st.NotReadyReason
		}
		select {
		case <-ctx.Done():
			// Readiness waits on the controller too (the pod CIDR): show both sides.
			return fmt.Errorf("agent of %s not ready after 60s: %s; log %s:\n%s\ncontroller log %s:\n%s",
				n.Name, last, n.Agent.Log, daemon.Tail(n.Agent.Log, 20), l.Controller.Log, daemon.Tail(l.Controller.Log, 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cni is what a runtime on n calls plugins with: the lab's binaries, n's
// network configuration and cache.
func (l *Lab) cni(n *Node) (*libcni.CNIConfig, *libcni.NetworkConfigList, error) {
	list, err := libcni.ConfListFromFile(filepath.Join(n.Dir, "net.d", "10-onc.conflist"))
	if err != nil {
		return nil, nil, err
	}
	return libcni.NewCNIConfigWithCacheDir([]string{l.BinDir}, filepath.Join(n.Dir, "cni-cache"), nil), list, nil
}

// attach makes p's network namespace and runs CNI ADD for it; if ADD
// fails, the namespace is removed again.
func attach(ctx context.Context, cfg *libcni.CNIConfig, list *libcni.NetworkConfigList, p *Pod) ([]netip.Addr, error) {
	if err := run([][]string{{"ip", "netns", "add", p.Netns}}); err != nil {
		return nil, err
	}
	ips, err := cniAttach(ctx, cfg, list, p.RuntimeConf())
	if err != nil {
		_ = delNetns(p.Netns)
		return nil, fmt.Errorf("CNI ADD for %s: %w", p.Netns, err)
	}
	return ips, nil
}

// setAddrs records the addresses CNI ADD gave p: IP its IPv4 one (its
// first if it has none), IPv6 its IPv6 one.
func (p *Pod) setAddrs(ips []netip.Addr) {
	p.IP, p.IPv6 = ips[0], netip.Addr{}
	for _, ip := range ips {
		if ip.Is4() {
			p.IP = ip
		} else if !p.IPv6.IsValid() {
			p.IPv6 = ip
		}
	}
}

// detach runs CNI DEL for p and removes its network namespace.
func detach(ctx context.Context, cfg *libcni.CNIConfig, list *libcni.NetworkConfigList, p *Pod) error {
	if err := cfg.DelNetworkList(ctx, list, p.RuntimeConf()); err != nil {
		return fmt.Errorf("CNI DEL for %s: %w", p.Netns, err)
	}
	return delNetns(p.Netns)
}

// RuntimeConf is what a runtime passes for a pod.
func (p *Pod) RuntimeConf() *libcni.RuntimeConf {
	// IgnoreUnknown, as containerd passes it: the reference plugins
	// (Flannel's chain) reject CNI_ARGS keys they do not know.
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.ns()}, {"K8S_POD_NAME", p.Name}, {"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID}}
	if p.UID != "" {
		args = append(args, [2]string{"K8S_POD_UID", p.UID})
	}
	rt := &libcni.RuntimeConf{ContainerID: p.ContainerID, NetNS: NetnsPath(p.Netns), IfName: "eth0", Args: args}
	// Its hostPorts, as the kubelet passes them (the portMappings capability).
	var mappings []map[string]any
	for _, cp := range p.Ports {
		if cp.HostPort != 0 {
			mappings = append(mappings, map[string]any{"hostPort": cp.HostPort, "containerPort": cp.ContainerPort,
				"protocol": strings.ToLower(string(cp.Protocol)), "hostIP": cp.HostIP})
		}
	}
	if mappings != nil {
		rt.CapabilityArgs = map[string]any{"portMappings": mappings}
	}
	return rt
}

// AddPod creates a pod namespace on n and attaches it through libcni: a
// pod of namespace "lab" without labels or ports, as AddPodSpec makes it.
// Safe to call in parallel.
func (l *Lab) AddPod(ctx context.Context, n *Node) (*Pod, error) {
	return l.AddPodSpec(ctx, n, PodSpec{})
}

// AddPodSpec creates pod s on n. In Kubernetes mode it does what the API
// and a kubelet would: the namespace if missing (with its default
// ServiceAccount), the Pod object bound to n, then the namespace attached
// through libcni, then the Pod's status written Running and Ready with the
// CNI result's IP as status.podIP(s). If any of that fails, what was made
// is removed. On etcd s is only recorded. Safe to call in parallel.
func (l *Lab) AddPodSpec(ctx context.Context, n *Node, s PodSpec) (_ *Pod, err error) {
	object := l.Datastore == "kubernetes" && !s.WithoutObject
	l.mu.Lock()
	n.PodSeq++
	seq := n.PodSeq
	l.mu.Unlock()
	p := &Pod{Name: s.Name, Namespace: s.Namespace, Node: n.Name, Labels: maps.Clone(s.Labels), Ports: slices.Clone(s.Ports),
		ContainerID: newContainerID(), Netns: fmt.Sprintf("%s-p%d", n.Name, seq)}
	if p.Namespace == "" {
		p.Namespace = DefaultNamespace
	}
	if p.Name == "" {
		p.Name = fmt.Sprintf("p%d", seq)
		if object {
			p.Name = p.Netns // unique in the namespace across nodes
		}
	}
	if object {
		if err := l.createPod(ctx, n, p); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, l.deletePod(context.WithoutCancel(ctx), p))
			}
		}()
	} else {
		l.recordNamespace(p.Namespace, nil)
	}
	cfg, list, err := l.cni(n)
	if err != nil {
		return nil, err
	}
	ips, err := attach(ctx, cfg, list, p)
	if err != nil {
		return nil, err
	}
	p.setAddrs(ips)
	if object {
		if err := l.podRunning(ctx, n, p); err != nil {
			err = fmt.Errorf("after CNI ADD for %s: %w", p.Netns, err)
			delErr := cfg.DelNetworkList(context.WithoutCancel(ctx), list, p.RuntimeConf())
			return nil, errors.Join(err, delErr, delNetns(p.Netns))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n.Pods = append(n.Pods, p)
	return p, l.save()
}

// ReattachPod recreates p's sandbox as a runtime does after it died: CNI
// DEL, then a fresh network namespace and container ID, and CNI ADD. A Pod
// object keeps its status (its kubelet would rewrite the IP later).
func (l *Lab) ReattachPod(ctx context.Context, n *Node, p *Pod) error {
	cfg, list, err := l.cni(n)
	if err != nil {
		return err
	}
	if err := detach(ctx, cfg, list, p); err != nil {
		return err
	}
	l.mu.Lock()
	p.ContainerID = newContainerID()
	l.mu.Unlock()
	ips, err := attach(ctx, cfg, list, p)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p.setAddrs(ips)
	return l.save()
}

// newContainerID is a random ID as a runtime gives a pod's sandbox.
func newContainerID() string {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	return hex.EncodeToString(id)
}

// cniAttach runs ADD and returns the result's first IP. When ADD fails,
// or its result has no IP, it runs DEL, as a runtime must, so nothing
// stays half made.
func cniAttach(ctx context.Context, cfg *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) ([]netip.Addr, error) {
	res, err := cfg.AddNetworkList(ctx, list, rt)
	if err != nil {
		return nil, errors.Join(err, cfg.DelNetworkList(context.WithoutCancel(ctx), list, rt))
	}
	var parsed struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	raw, _ := json.Marshal(res)
	perr := json.Unmarshal(raw, &parsed)
	if perr == nil && len(parsed.IPs) == 0 {
		perr = errors.New("no IP")
	}
	var ips []netip.Addr
	for _, ip := range parsed.IPs {
		var pfx netip.Prefix
		if pfx, perr = netip.ParsePrefix(ip.Address); perr != nil {
			break
		}
		ips = append(ips, pfx.Addr())
	}
	if perr != nil {
		delErr := cfg.DelNetworkList(context.WithoutCancel(ctx), list, rt)
		return nil, errors.Join(fmt.Errorf("result %s: %w", raw, perr), delErr)
	}
	return ips, nil
}

// DelPod detaches a pod through libcni and removes its namespace, then its
// Pod object if it has one. Safe to call in parallel.
func (l *Lab) DelPod(ctx context.Context, n *Node, p *Pod) error {
	cfg, list, err := l.cni(n)
	if err != nil {
		return err
	}
	if err := detach(ctx, cfg, list, p); err != nil {
		return err
	}
	if p.UID != "" {
		if err := l.deletePod(ctx, p); err != nil {
			return err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, q := range n.Pods {
		if q == p {
			n.Pods = append(n.Pods[:i], n.Pods[i+1:]...)
			break
		}
	}
	return l.save()
}

// RemoveNode stops a node's agent and deletes the node and its pods, as if
// the machine were gone, and removes it as an operator would: on etcd with
// `onc-controller remove-node`, on Kubernetes by deleting the Node object
// (and its pods' objects, as the pod garbage collector would). Its CIDR is
// free at once.
func (l *Lab) RemoveNode(ctx context.Context, n *Node) error {
	n.Agent.Stop()
	n.KubeProxy.Stop()
	n.Flanneld.Stop()
	var errs []error
	if l.Datastore == "kubernetes" {
		errs = append(errs, l.deleteNode(ctx, n))
	} else {
		errs = append(errs, run([][]string{append([]string{"ip", "netns", "exec", l.ctlNetns(),
			filepath.Join(l.BinDir, "onc-controller"), "remove-node", n.Name}, l.embeddedEtcdArgs()...)}))
	}
	for _, p := range n.Pods {
		if p.UID != "" {
			errs = append(errs, l.deletePod(ctx, p))
		}
		errs = append(errs, delNetns(p.Netns))
	}
	for _, p := range n.FlannelPods {
		errs = append(errs, delNetns(p.Netns))
	}
	errs = append(errs, delNetns(n.Netns), unmount(n.BPFFS()))
	for i, m := range l.Nodes {
		if m == n {
			l.Nodes = append(l.Nodes[:i], l.Nodes[i+1:]...)
			break
		}
	}
	errs = append(errs, l.Save())
	return errors.Join(errs...)
}

// Down stops every process the lab started and removes all it made. It
// carries on past errors and is safe to call more than once.
func (l *Lab) Down() error {
	for _, n := range l.Nodes {
		n.Agent.Stop()
		n.KubeProxy.Stop()
		n.Flanneld.Stop()
	}
	if l.Flannel != nil {
		l.Flannel.Etcd.Stop()
	}
	l.Controller.Stop()
	if l.APIServer != nil {
		l.APIServer.Stop()
	}
	l.Etcd.Stop()
	var errs []error
	for _, ns := range namespaces(l.Prefix) {
		errs = append(errs, delNetns(ns))
	}
	for _, mp := range bpfMounts(l.Dir) {
		errs = append(errs, unmount(mp))
	}
	errs = append(errs, os.RemoveAll(l.Dir))
	return errors.Join(errs...)
}

// Down removes the lab named prefix, also when its state file is gone
// (then only its namespaces can be found).
func DownByName(root, prefix string) error {
	l, err := Load(root, prefix)
	if err != nil {
		l = &Lab{Prefix: prefix, Dir: stateDir(root, prefix)}
	}
	return l.Down()
}

// namespaces lists the named namespaces that belong to the lab prefix.
func namespaces(prefix string) []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// bpfMounts lists the bpffs mounts below dir (found even without a state file).
func bpfMounts(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") && strings.Contains(line, " - bpf ") {
			out = append(out, f[4])
		}
	}
	return out
}

func unmount(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

func delNetns(name string) error {
	if _, err := os.Stat(NetnsPath(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return run([][]string{{"ip", "netns", "del", name}})
}

func run(cmds [][]string) error {
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
