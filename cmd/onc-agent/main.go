// Command onc-agent is ONC's per-node agent.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/onc-net/onc/agent"
	"github.com/onc-net/onc/agent/k8spods"
	"github.com/onc-net/onc/agent/policy"
	"github.com/onc-net/onc/agent/services"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass"
	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore/backend"
	"github.com/onc-net/onc/internal/cmdutil"
	"github.com/spf13/pflag"
)

func main() {
	cfg := agent.DefaultConfig()
	fs := pflag.NewFlagSet("onc-agent", pflag.ExitOnError)
	host, _ := os.Hostname()
	fs.StringVar(&cfg.NodeName, "node-name", cmdutil.EnvOr("NODE_NAME", host), "this node's name (env NODE_NAME)")
	nodeIP := fs.String("node-ip", "", "this node's underlay address, IPv4 or IPv6: the overlay's tunnel endpoint (default: the uplink's first IPv4 address, else its first global IPv6 one)")
	fs.StringVar(&cfg.Datapath.Iface, "iface", "", "uplink interface (default: the one holding --node-ip, else the default route's)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "persistent state: VTEP MAC, pod addresses")
	fs.StringVar(&cfg.RunDir, "run-dir", cfg.RunDir, "where cni.sock and agent.sock are served")
	fs.IntVar(&cfg.Datapath.VNI, "vni", cfg.Datapath.VNI, "VXLAN network identifier")
	fs.IntVar(&cfg.Datapath.Port, "vxlan-port", cfg.Datapath.Port, "VXLAN UDP port")
	fs.IntVar(&cfg.MTU, "mtu", 0, "pod MTU (default: uplink MTU − 50)")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "liveness lease TTL: the node counts as alive this long after a renewal (renewed every 30 % of it on Kubernetes, every third on etcd)")
	fs.DurationVar(&cfg.Resync, "resync", cfg.Resync, "how often every watcher reconciles without a change, repairing drift in the kernel")
	fs.BoolVar(&cfg.Datapath.FastPath, "fast-path", cfg.Datapath.FastPath, "start with the eBPF fast path on (onctl fastpath on|off switches it at runtime)")
	fs.StringVar(&cfg.Datapath.BPFFS, "bpffs", cfg.Datapath.BPFFS, "directory on a bpffs where the fast path pins its maps and links (mounted there if needed)")
	fs.StringVar(&cfg.Datapath.ProcSys, "proc-sys", "", "where the host's sysctls are written (its net/ subtree; default /proc/sys); a container's own /proc/sys is read-only, so the DaemonSet mounts the host's elsewhere")
	fs.BoolVar(&cfg.Datapath.FastPathConnSetup, "fast-path-connection-setup", cfg.Datapath.FastPathConnSetup, "let a TCP connection that no NetworkPolicy can deny on this node open and close on the fast path too (off: every SYN, FIN and RST takes the slow path, and conntrack sees every connection)")
	fs.Uint32Var(&cfg.Datapath.FastPathMark, "fast-path-mark", cfg.Datapath.FastPathMark, "skb->mark bit ONC uses internally for ESTABLISHED pod traffic; pick one no other component uses (ONC's own fixed bits 0x80000, 0x100000 and 0x200000 are refused)")
	fs.StringVar(&cfg.Datapath.AttachMode, "attach-mode", cfg.Datapath.AttachMode, "how eBPF programs attach: auto (tcx, else clsact), tcx or clsact")
	servicesMode := fs.String("services", string(dpservices.All), "whose sockets Services are balanced for at connect() (the socket LB): all (the host's and every pod's), host-only (pods left to kube-proxy, for sidecar meshes) or off (kube-proxy balances everything)")
	fs.StringVar(servicesMode, "socket-lb", string(dpservices.All), "")
	_ = fs.MarkDeprecated("socket-lb", "use --services")
	fs.BoolVar(&cfg.Datapath.KubeProxyReplacement, "kube-proxy-replacement", false, "no kube-proxy runs beside ONC: serve every Service frontend (ClusterIP, NodePort, externalIPs, load balancer IPs) at the socket and, for clients outside the cluster, on the uplink; and kube-proxy's health endpoints; needs --services=all and the Kubernetes datastore (docs/install.md, \"Without kube-proxy\")")
	fs.StringVar(&cfg.Datapath.Cgroup, "cgroup", "", "cgroup v2 directory the services and bypass programs attach to, as this process sees it (default: the highest cgroup v2 directory it sees, the root unless it runs in a cgroup namespace without the host's hierarchy mounted; where none is mounted ONC mounts one at "+bpf.OwnCgroupMount+")")
	fs.StringVar(&cfg.Datapath.Cgroup, "socket-lb-cgroup", "", "")
	_ = fs.MarkDeprecated("socket-lb-cgroup", "use --cgroup")
	bypassMode := fs.String("bypass", string(bypass.Off), "intra-node bypass: which TCP connections between two pods of this node skip both TCP/IP stacks: off, on (all) or size (a direction whose first message is at least --bypass-min-size bytes); onctl bypass switches it until the agent restarts")
	bypassMinSize := fs.Uint32("bypass-min-size", 256, "with --bypass=size: the smallest first message, in bytes, for which a direction is bypassed")
	lbMode := fs.String("load-balancer-mode", "snat", "with --kube-proxy-replacement, how a client outside the cluster reaches a backend pod on another node: snat (the backend sees this node's address and answers through it) or dsr (direct server return: the backend sees the client's address and its node answers the client itself; docs/services.md)")
	fs.StringVar(&cfg.Health.Healthz, "healthz-addr", "0.0.0.0:10256", `with --kube-proxy-replacement: where kube-proxy's /healthz and /livez are served, host:port; "" serves neither`)
	fs.StringVar(&cfg.Health.ProxyMode, "proxy-mode-addr", "127.0.0.1:10249", `with --kube-proxy-replacement: where /proxyMode answers "onc", host:port (kube-proxy's metrics address, which answers its mode there); "" serves none`)
	fs.IntVar(&cfg.FlowsBuffer, "flows-buffer", 8192, "how many flow records the agent keeps for onctl flows (docs/observability.md); 0 records none")
	fs.Uint32Var(&cfg.Datapath.FlowEvents, "flows-events-rate", 1000, "flow records from the eBPF programs (drops, Service translations, fast-path open and learn): at most this many a second of each kind on each CPU, twice that at once; the rest are counted, not recorded (docs/observability.md); 0 records none")
	fs.IntVar(&cfg.FlowsTopPods, "flows-top-pods", envInt("FLOWS_TOP_PODS", 10), "how many of this node's pods onc_pod_drops_total names: those with the most drops in the flow records (docs/metrics.md); 0 names none (env FLOWS_TOP_PODS)")
	flowsGroup := fs.Uint("flows-log-group", 1707, "NFLOG group (1-65535) the policy table logs its verdicts to, for the flow records; pick one no other program of the node reads")
	fs.IntVar(&cfg.PeerPort, "peer-port", envInt("PEER_PORT", cfg.PeerPort), "TCP port of the peer API on every node's address, where the other nodes' agents ask this one for its side of their traces (mutual TLS with the keys pinned in the node records: docs/security.md); the same on every node; 0 serves none and asks none (env PEER_PORT)")
	flowsExport := exportFlags(fs)
	store := backend.AddFlags(fs)
	metricsAddr := fs.String("metrics-addr", agent.DefaultMetricsAddr, `where to serve Prometheus metrics (/metrics), host:port; "" serves none`)
	debug := fs.Bool("debug", false, "debug logging")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := cmdutil.Setup(*debug)
	defer stop()
	// First: a second agent on this node must not touch anything.
	lock, err := agent.LockNode(cfg)
	if err != nil {
		cmdutil.Fatal("cannot start the agent", err)
	}
	defer lock.Close()
	mode, err := dpservices.ParseMode(*servicesMode)
	if err != nil {
		cmdutil.Fatal("bad flag", fmt.Errorf("--services: %w", err))
	}
	cfg.Datapath.Services = mode
	if cfg.Datapath.KubeProxyReplacement && mode != dpservices.All {
		cmdutil.Fatal("bad flag", fmt.Errorf("--kube-proxy-replacement needs --services=all (is %s): with no kube-proxy, nothing else balances the pods' Service traffic", mode))
	}
	switch *lbMode {
	case "snat":
	case "dsr":
		cfg.Datapath.DSR = true
	default:
		cmdutil.Fatal("bad flag", fmt.Errorf("--load-balancer-mode %q: want snat or dsr", *lbMode))
	}
	if cfg.Datapath.DSR && !cfg.Datapath.KubeProxyReplacement {
		cmdutil.Fatal("bad flag", errors.New("--load-balancer-mode dsr needs --kube-proxy-replacement: beside kube-proxy, kube-proxy serves clients outside the cluster"))
	}
	switch {
	case cfg.FlowsBuffer < 0:
		cmdutil.Fatal("bad flag", fmt.Errorf("--flows-buffer %d: a number of records, 0 or more", cfg.FlowsBuffer))
	case cfg.FlowsTopPods < 0:
		cmdutil.Fatal("bad flag", fmt.Errorf("--flows-top-pods %d: a number of pods, 0 or more", cfg.FlowsTopPods))
	case cfg.Datapath.FlowEvents > bpf.MaxEventsPerSecond:
		cmdutil.Fatal("bad flag", fmt.Errorf("--flows-events-rate %d: events a second of each kind on each CPU, 0-%d", cfg.Datapath.FlowEvents, bpf.MaxEventsPerSecond))
	case cfg.PeerPort < 0 || cfg.PeerPort > 65535:
		cmdutil.Fatal("bad flag", fmt.Errorf("--peer-port %d: a TCP port, 1-65535, or 0 for none", cfg.PeerPort))
	case *flowsGroup < 1 || *flowsGroup > 65535:
		cmdutil.Fatal("bad flag", fmt.Errorf("--flows-log-group %d: an NFLOG group, 1-65535", *flowsGroup))
	case cfg.FlowsBuffer > 0:
		cfg.Datapath.PolicyLogGroup = uint16(*flowsGroup)
	default:
		cfg.Datapath.FlowEvents = 0 // no store to record them in
	}
	if cfg.FlowsExport, err = flowsExport(cfg.FlowsBuffer); err != nil {
		cmdutil.Fatal("bad flag", err)
	}
	if cfg.Datapath.Bypass, err = bypass.ParseConfig(*bypassMode, *bypassMinSize); err != nil {
		cmdutil.Fatal("bad flag", fmt.Errorf("--bypass=%s --bypass-min-size=%d: %w", *bypassMode, *bypassMinSize, err))
	}
	// Without kube-proxy nothing would serve the API server's Service in
	// its place: the agent dials the API server itself (k8s-service-host).
	if store.Kind == backend.Kubernetes && !cfg.Datapath.KubeProxyReplacement {
		if err := dpservices.UnbalanceAPIServer(cfg.Datapath.BPFFS); err != nil {
			cmdutil.Fatal("cannot leave the API server's Service to kube-proxy", err)
		}
	}
	// kubelet's KUBERNETES_PORT names the ClusterIP whatever
	// KUBERNETES_SERVICE_HOST was set to.
	if cfg.Datapath.KubeProxyReplacement && os.Getenv("KUBERNETES_PORT") == "tcp://"+net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")) {
		slog.Warn("replacing kube-proxy, the agent dials the API server at its ClusterIP, which only ONC serves: on a node without ONC's programs it cannot start; set k8s-service-host and k8s-service-port in onc-config (docs/install.md)")
	}
	if *nodeIP != "" {
		ip, err := netip.ParseAddr(*nodeIP)
		// A tunnel endpoint is a unicast address without a zone: an IPv6
		// link-local one would need its interface on every peer.
		if err != nil || ip.Is4In6() || ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() ||
			ip.Is6() && ip.IsLinkLocalUnicast() {
			cmdutil.Fatal("bad flag", fmt.Errorf("--node-ip %q: not a unicast IPv4 or global IPv6 address", *nodeIP))
		}
		cfg.Datapath.NodeIP = ip
	}
	ds, err := store.Open(ctx, backend.ForAgent)
	if err != nil {
		cmdutil.Fatal("cannot open the datastore", err)
	}
	defer ds.Close()
	if store.Kind == backend.Kubernetes {
		kcfg, err := store.RESTConfig()
		if err != nil {
			cmdutil.Fatal("bad flag", err)
		}
		pods, err := k8spods.Watch(ctx, kcfg, cfg.NodeName)
		if err != nil {
			cmdutil.Fatal("cannot watch this node's pods", err)
		}
		defer pods.Close()
		cfg.Pods = pods
		inputs, err := policy.Watch(ctx, kcfg)
		if err != nil {
			cmdutil.Fatal("cannot watch the NetworkPolicy inputs", err)
		}
		defer inputs.Close()
		cfg.Policy = inputs
		svcs, err := services.Watch(ctx, kcfg, cfg.NodeName)
		if err != nil {
			cmdutil.Fatal("cannot watch Services and EndpointSlices", err)
		}
		defer svcs.Close()
		cfg.Services = svcs
		cfg.Health.Node = svcs
	} else {
		if cfg.Datapath.KubeProxyReplacement {
			cmdutil.Fatal("bad flag", errors.New("--kube-proxy-replacement needs the Kubernetes datastore: etcd clusters have no Services"))
		}
		cfg.Datapath.Services = dpservices.Off // etcd clusters have no Services
		cfg.Datapath.NoPolicy = true           // nor NetworkPolicies
	}
	dp, err := datapath.New(cfg.Datapath)
	if err != nil {
		cmdutil.Fatal("cannot start the agent", err)
	}
	a, err := agent.New(cfg, ds, agent.KernelDatapath(dp))
	if err != nil {
		cmdutil.Fatal("cannot start the agent", err)
	}
	if err := a.ServeMetrics(ctx, *metricsAddr); err != nil {
		cmdutil.Fatal("cannot start the agent", err)
	}
	if err := a.Run(ctx, lock); err != nil {
		cmdutil.Fatal("agent failed", err)
	}
}

// envInt is the integer in the environment variable name, else def: the
// DaemonSet passes optional ConfigMap keys so (an unset one stays unset,
// where $(NAME) in an argument would be passed on literally).
func envInt(name string, def int) int {
	env := os.Getenv(name)
	if env == "" {
		return def
	}
	v, err := strconv.Atoi(env)
	if err != nil {
		cmdutil.Fatal("bad environment", fmt.Errorf("%s %q: %w", name, env, err))
	}
	return v
}
