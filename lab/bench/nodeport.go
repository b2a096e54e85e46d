package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/lab"
)

// The NodePort rows: netperf from a host outside the cluster to a NodePort
// Service whose one backend, the netserver pod, runs on node 1; through
// ONC's kube-proxy replacement (the uplink load balancer, SNAT or direct
// server return) or through real kube-proxy in iptables or nftables mode;
// connecting to the backend's node (same) or to node 0 (other), which
// forwards to it over the overlay. Each of the eight is a config:
// nodeport-<placement>-<proxy>.
const (
	SameNode  = "same"
	OtherNode = "other"
)

// NodePortHost is the NodePort rows' reference: the outside host to a
// netserver on the backend's node itself (its host network), no Service
// and no proxy; measured at the same placement and in the same
// repetitions, under ONC's setup. It is what a packet costs to reach a
// socket of that node untranslated, so host ÷ iptables says how much room
// the machine leaves any proxy against kube-proxy's iptables mode.
var NodePortHost = NodePortConfig("host", SameNode)

// nodePortHostData is the host netserver's data port: no NodePort.
const nodePortHostData = 12866

// NodePortPlacements in the order a rotation starts with.
var NodePortPlacements = []string{SameNode, OtherNode}

// NodePortTests are the tests the NodePort rows run (of Options.Tests).
var NodePortTests = []string{"TCP_RR", "TCP_CRR"}

// NodePortConfig names the config of proxy and placement.
func NodePortConfig(proxy, placement string) string { return "nodeport-" + placement + "-" + proxy }

// NodePortProxies are the NodePort rows' proxies, in the order a rotation
// starts with: Proxies, and ONC's replacement with direct server return.
var NodePortProxies = []string{ProxyONC, ProxyONCDSR, ProxyIPTables, ProxyNFTables}

// proxyShort names a proxy in a port name.
var proxyShort = map[string]string{ProxyONC: "onc", ProxyONCDSR: "dsr", ProxyIPTables: "ipt", ProxyNFTables: "nft"}

// NodePortConfigs, by placement, then proxy.
var NodePortConfigs = func() []string {
	var out []string
	for _, pl := range NodePortPlacements {
		for _, p := range NodePortProxies {
			out = append(out, NodePortConfig(p, pl))
		}
	}
	return out
}()

const nodePortSvc = "netperf-np"

var (
	// nodePortCtl is netperf's control connection's: to the NodePort, to
	// netserver's port in the pod.
	nodePortCtl = namedPort{"np-ctl", ctlPort.port, 30865}
	// nodePortData are the data connections' ports, one per config as
	// dataPorts are. Each is its NodePort and the pod's port alike:
	// netperf's data connection goes to the port netserver listens on, at
	// whatever address -H names. Port names are at most 15 characters.
	nodePortData = func() map[string]namedPort {
		out := map[string]namedPort{}
		for i, cfg := range NodePortConfigs {
			placement, proxy, _ := strings.Cut(strings.TrimPrefix(cfg, "nodeport-"), "-")
			p := int32(30866 + i)
			out[cfg] = namedPort{fmt.Sprintf("np-%c-%s", placement[0], proxyShort[proxy]), p, p}
		}
		return out
	}()
)

// nodePortDataPorts are nodePortData's ports, in NodePortConfigs' order.
func nodePortDataPorts() []namedPort {
	var out []namedPort
	for _, cfg := range NodePortConfigs {
		out = append(out, nodePortData[cfg])
	}
	return out
}

// RunNodePorts measures the NodePort rows on a lab on the bridge underlay
// with its external client (the outside host joins the bridge, which the
// direct underlay's pair has no room for): a NodePort Service with an
// EndpointSlice naming the server pod, then, o.Reps times, each proxy in
// turn (the order rotating each repetition) with every test of
// NodePortTests in o.Tests at both placements. Switching proxies restarts
// agents and kube-proxy (useProxy); the fast path is on. A proxy that
// cannot be set up, a failed run and a failed path check are samples with
// their reason, and the rows go on. The lab is left with the last proxy.
func RunNodePorts(ctx context.Context, o Options) ([]Sample, error) {
	l := o.Lab
	if l.ExternalClient == "" {
		return nil, errors.New("the NodePort rows need the lab's external client (lab.Options.ExternalClient, on the bridge underlay)")
	}
	_, server, err := pair(l)
	if err != nil {
		return nil, err
	}
	spod := server.Pods[0]
	ext := l.ExternalClient
	spec := serviceSpec{name: nodePortSvc, nodePort: true, ports: append([]namedPort{nodePortCtl}, nodePortDataPorts()...), pods: []*lab.Pod{spod}}
	if _, err := createService(ctx, l, spec); err != nil {
		return nil, err
	}
	stop, err := Netservers(o.Netperf, spod.Netns, server.Netns)
	if err != nil {
		return nil, err
	}
	defer stop()
	entry := map[string]*lab.Node{SameNode: server, OtherNode: l.Nodes[0]}
	fmt.Fprintf(o.Log, "NodePort Service %s/%s → %s (%s) on %s; client %s outside the cluster\n",
		benchNS, nodePortSvc, spod.IP, spod.Key(), server.Name, lab.ExternalClientIP)
	tests := testsOf(o.Tests, NodePortTests)
	var out []Sample
	for rep := 0; rep < o.Reps; rep++ {
		for i := range NodePortProxies {
			proxy := NodePortProxies[(i+rep)%len(NodePortProxies)]
			setup := useProxy(ctx, l, proxy)
			if setup == nil {
				setup = waitNodePorts(ctx, l, proxy, spec.ports)
			}
			if err := ctx.Err(); err != nil {
				return out, err
			}
			// record takes a sample of cfg from run, or the proxy's set-up
			// failure in its stead.
			record := func(test, cfg string, run func() Sample) {
				s := Sample{Test: test}
				if setup != nil {
					s.Error = "setting up " + proxy + ": " + setup.Error()
				} else {
					s = run()
				}
				s.Config, s.Rep = cfg, rep+1
				logSample(o, s)
				out = append(out, s)
			}
			for j, test := range tests {
				for k := range NodePortPlacements {
					placement := NodePortPlacements[(k+j+rep)%len(NodePortPlacements)]
					cfg := NodePortConfig(proxy, placement)
					record(test, cfg, func() Sample {
						return nodePortRun(ctx, o, ext, entry[placement], placement == OtherNode, spod, test, proxy, nodePortData[cfg])
					})
				}
				if proxy == ProxyONC {
					record(test, NodePortHost, func() Sample { return nodePortHostRun(ctx, o, ext, server, test) })
				}
			}
		}
	}
	return out, nil
}

// nodePortHostRun runs one netperf from the outside host ext to a
// netserver on node n itself, checked to have passed ONC's uplink load
// balancer untranslated.
func nodePortHostRun(ctx context.Context, o Options, ext string, n *lab.Node, test string) Sample {
	if err := forgetConnections(ctx, o.Lab.Nodes, lab.ExternalClientIP); err != nil {
		return Sample{Test: test, Error: err.Error()}
	}
	read := func() (paths, error) {
		return readPaths(ctx, n, frontend{netip.AddrPortFrom(n.IP, nodePortHostData), dpservices.NodePort}, n.IP)
	}
	check := func(d paths) error {
		if d.uplinkAll != 0 {
			return fmt.Errorf("ONC's uplink translated %d packets: want none to the node itself", d.uplinkAll)
		}
		return nil
	}
	return pathChecked(ctx, o, ext, netip.AddrPortFrom(n.IP, uint16(ctlPort.port)), nodePortHostData, test, read, check)
}

// nodePortRun runs one path-checked netperf from the outside host ext to
// data's NodePort on entry, whose backend is spod (on another node: remote).
func nodePortRun(ctx context.Context, o Options, ext string, entry *lab.Node, remote bool, spod *lab.Pod, test, proxy string, data namedPort) Sample {
	if err := forgetConnections(ctx, o.Lab.Nodes, lab.ExternalClientIP); err != nil {
		return Sample{Test: test, Error: err.Error()}
	}
	f := frontend{netip.AddrPortFrom(entry.IP, uint16(data.nodePort)), dpservices.NodePort}
	read := func() (paths, error) {
		p, err := readPaths(ctx, entry, f, spod.IP)
		p.remote = remote
		return p, err
	}
	return pathChecked(ctx, o, ext, netip.AddrPortFrom(entry.IP, uint16(nodePortCtl.nodePort)), data.port, test, read, proxyCheck(proxy, dpservices.NodePort))
}

// proxyCheck judges a run to a frontend of kind by the paths of the node
// that translates it (a NodePort's: the node the client connected to; a
// ClusterIP's: the client's): ONC translated (on the uplink, at the
// socket) and netfilter did not; kube-proxy's rule for the frontend
// matched (iptables); netfilter translated with no iptables rule for the
// frontend, so kube-proxy's nftables table did, whose rules have no
// counters (nftables). ONC translates nothing in kube-proxy's configs.
func proxyCheck(proxy string, kind dpservices.Frontend) func(paths) error {
	return func(d paths) error {
		onc := d.socket
		if kind == dpservices.NodePort {
			onc = d.uplink
		}
		switch {
		case isONC(proxy) && (onc == 0 || d.iptablesRules != 0 || d.natted != 0):
			return fmt.Errorf("ONC translated %d connections, netfilter %d, with %d kube-proxy iptables rules for the %s: want some, none and none",
				onc, d.natted, d.iptablesRules, kind)
		case proxy == ProxyONCDSR && d.remote && d.dsrSent == 0:
			return fmt.Errorf("ONC sent no packet to the backend's node directly (dsr_sent): want its flows' every packet")
		case (proxy == ProxyONC || !d.remote) && d.dsrSent != 0:
			return fmt.Errorf("ONC sent %d packets to a backend's node directly (dsr_sent): want none without direct server return or to a local backend", d.dsrSent)
		case proxy == ProxyIPTables && (d.iptables == 0 || onc != 0):
			return fmt.Errorf("kube-proxy's rule for the %s matched %d packets, ONC translated %d connections: want some and none", kind, d.iptables, onc)
		case proxy == ProxyNFTables && (d.natted == 0 || d.iptablesRules != 0 || onc != 0):
			return fmt.Errorf("netfilter translated %d connections with %d kube-proxy iptables rules for the %s, ONC %d: want some (kube-proxy's nftables table), none and none",
				d.natted, d.iptablesRules, kind, onc)
		}
		return nil
	}
}

// waitNodePorts waits until every node serves each of ports' NodePorts
// the way proxy does: an uplink entry with the backend (onc), a
// KUBE-NODEPORTS rule (iptables), an element of kube-proxy's
// service-nodeports map (nftables).
func waitNodePorts(ctx context.Context, l *lab.Lab, proxy string, ports []namedPort) error {
	for _, n := range l.Nodes {
		var fronts []frontend
		for _, p := range ports {
			fronts = append(fronts, frontend{netip.AddrPortFrom(n.IP, uint16(p.nodePort)), dpservices.NodePort})
		}
		var err error
		switch proxy {
		case ProxyONC, ProxyONCDSR:
			err = waitBalanced(ctx, n, fronts, dpservices.Uplink)
		case ProxyIPTables:
			err = waitKubeProxy(ctx, n.Netns, fronts)
		default:
			err = waitNFTNodePorts(ctx, n.Netns, ports)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// waitNFTNodePorts waits until kube-proxy's nftables table in netns maps
// each of ports' NodePorts. The table may not be there yet: kube-proxy
// can answer its health check before its first sync.
func waitNFTNodePorts(ctx context.Context, netns string, ports []namedPort) error {
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := nftList(ctx, netns, "map", "service-nodeports")
		if err != nil {
			last = err.Error()
			continue
		}
		var missing []int32
		for _, p := range ports {
			// An element: "tcp . 30866 : goto external-…".
			if !strings.Contains(out, "tcp . "+strconv.Itoa(int(p.nodePort))+" : ") {
				missing = append(missing, p.nodePort)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		last = fmt.Sprintf("no element for NodePorts %v", missing)
	}
	return fmt.Errorf("kube-proxy's nftables table in %s after 30s: %s", netns, last)
}

// nftList lists one object of kube-proxy's nftables table (family ip) in
// netns: nft list <kind> ip kube-proxy <name>.
func nftList(ctx context.Context, netns, kind, name string) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, "nft", "list", kind, "ip", "kube-proxy", name).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list %s ip kube-proxy %s in %s: %w: %s", kind, name, netns, err, out)
	}
	return string(out), nil
}

// The Services' proxies in the NodePort rows and the scale bench: ONC's
// kube-proxy replacement (no kube-proxy runs), or real kube-proxy in one
// of its modes with ONC's socket LB off on every node, so that ONC
// translates nothing.
const (
	ProxyONC      = "onc"
	ProxyIPTables = lab.ProxyIPTables
	ProxyNFTables = lab.ProxyNFTables
	// ProxyONCDSR is ONC's replacement with direct server return
	// (--load-balancer-mode dsr): the NodePort rows only, as ClusterIPs
	// never leave the node.
	ProxyONCDSR = "onc-dsr"
)

// isONC says whether proxy is ONC's replacement, in either mode.
func isONC(proxy string) bool { return proxy == ProxyONC || proxy == ProxyONCDSR }

// Proxies in the order a rotation starts with.
var Proxies = []string{ProxyONC, ProxyIPTables, ProxyNFTables}

// proxyAgentArgs are the agents' flags under proxy.
func proxyAgentArgs(proxy string) []string {
	switch proxy {
	case ProxyONC:
		return []string{"--kube-proxy-replacement"}
	case ProxyONCDSR:
		return []string{"--kube-proxy-replacement", "--load-balancer-mode=dsr"}
	}
	return []string{"--services=off"}
}

// useProxy hands every node's Services to proxy: kube-proxy stopped and
// its rules of every mode removed (kube-proxy --cleanup, as an operator
// switching modes does), the agents restarted with proxy's flags where
// they run with others, the fast path on, then kube-proxy started in
// proxy's mode. kube-proxy never resyncs by the clock: a resync rewrites
// its chains and resets the rule counters the path checks read.
func useProxy(ctx context.Context, l *lab.Lab, proxy string) error {
	for _, n := range l.Nodes {
		if err := l.CleanupKubeProxy(ctx, n); err != nil {
			return err
		}
	}
	restarted := false
	for _, n := range l.Nodes {
		if args := proxyAgentArgs(proxy); !slices.Equal(n.AgentArgs, args) {
			if err := l.RestartAgent(ctx, n, args...); err != nil {
				return err
			}
			restarted = true
		}
	}
	if err := SetFastPath(ctx, l, true); err != nil {
		return err
	}
	if restarted {
		time.Sleep(2 * time.Second) // let the restarted agents' reconciles settle
	}
	if isONC(proxy) {
		return nil
	}
	for _, n := range l.Nodes {
		if err := l.StartKubeProxy(ctx, n, proxy, "--iptables-sync-period", "1h"); err != nil {
			return err
		}
	}
	return nil
}
