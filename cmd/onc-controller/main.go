// Command onc-controller is ONC's cluster NodeIPAM. On etcd without
// --etcd-endpoints it runs an embedded etcd and serves it to the agents
// (mutual TLS; `onc-controller node-cert NAME` issues an agent's
// credentials); on Kubernetes its replicas elect a leader through a Lease.
// On etcd, `onc-controller remove-node NAME` removes a node at once.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/controller/nodeipam"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/backend"
	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/internal/cmdutil"
	"github.com/spf13/pflag"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "remove-node":
			os.Exit(removeNode(os.Args[2:]))
		case "node-cert":
			os.Exit(nodeCert(os.Args[2:]))
		}
	}
	fs := pflag.NewFlagSet("onc-controller", pflag.ExitOnError)
	clusterCIDRs := fs.String("cluster-cidr", "10.244.0.0/16", "ranges all pod CIDRs come from, comma-separated in the cluster's family order (primary first): an IPv4 range, an IPv6 range, or one of each for dual-stack")
	prefixLen := fs.Int("node-prefix-len", 24, "size of each node's IPv4 pod CIDR")
	prefixLen6Default, err := envInt("NODE_PREFIX_LEN_IPV6", 64)
	if err != nil {
		cmdutil.Fatal("bad setting", err)
	}
	prefixLen6 := fs.Int("node-prefix-len-ipv6", prefixLen6Default, "size of each node's IPv6 pod CIDR (default from env NODE_PREFIX_LEN_IPV6, which the manifest sets from onc-config when the key is there)")
	nodeTimeout := fs.Duration("node-timeout", 24*time.Hour, "delete a node (and free its CIDR) after its agent has been gone this long; 0 never")
	emb := addEmbeddedFlags(fs)
	store := backend.AddControllerFlags(fs)
	host, _ := os.Hostname()
	el := controller.Election{}
	fs.StringVar(&el.Identity, "leader-elect-identity", cmdutil.EnvOr("POD_NAME", host), "this replica's name in the leader Lease (env POD_NAME)")
	fs.DurationVar(&el.LeaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits before taking over a silent leader")
	fs.DurationVar(&el.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew before it gives up leading")
	fs.DurationVar(&el.RetryPeriod, "leader-elect-retry-period", 2*time.Second, "how often the Lease is tried")
	metricsAddr := fs.String("metrics-addr", controller.DefaultMetricsAddr, `where to serve Prometheus metrics (/metrics), host:port; "" serves none`)
	debug := fs.Bool("debug", false, "debug logging")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: onc-controller [flags]\n"+
			"       onc-controller node-cert NAME --out DIR   (embedded etcd: a node's agent credentials; --help for its flags)\n"+
			"       onc-controller remove-node NAME [flags]   (etcd datastore; --help for its flags)\n\n%s", fs.FlagUsages())
	}
	_ = fs.Parse(os.Args[1:])

	ctx, stop := cmdutil.Setup(*debug)
	defer stop()
	cluster, err := clusterConfig(*clusterCIDRs, *prefixLen, *prefixLen6)
	if err != nil {
		cmdutil.Fatal("bad flag", err)
	}
	if err := store.Validate(); err != nil {
		cmdutil.Fatal("bad flag", err)
	}
	if store.Kind == backend.Etcd && len(store.Etcd.Endpoints) == 0 {
		e, err := etcdserver.StartTLS(emb.dir, emb.listen)
		if err != nil {
			cmdutil.Fatal("cannot start the embedded etcd", fmt.Errorf("--embedded-etcd-dir %s, --embedded-etcd-listen %s: %w", emb.dir, emb.listen, err))
		}
		defer e.Close()
		slog.Info("embedded etcd serving (mutual TLS)", "url", e.ClientURL, "dir", emb.dir, "pki", e.PKI.Dir)
		store.Etcd.Endpoints, store.Etcd.TLSFiles = []string{e.ClientURL}, e.PKI.Controller()
	}
	ds, err := store.Open(ctx, backend.ForController)
	if err != nil {
		cmdutil.Fatal("cannot open the datastore", err)
	}
	defer ds.Close()
	// Before the election: a standby serves its metrics too.
	metrics, err := controller.NewMetrics(cluster, ds)
	if err != nil {
		cmdutil.Fatal("bad flag", err)
	}
	if addr, err := metrics.Serve(ctx, *metricsAddr); err != nil {
		cmdutil.Fatal("cannot serve metrics", err)
	} else if addr != "" {
		slog.Info("serving metrics", "addr", addr)
	}
	run := func(ctx context.Context) error {
		c, err := controller.New(ctx, controller.Config{Cluster: cluster, NodeTimeout: *nodeTimeout, Metrics: metrics}, ds)
		if err != nil {
			return err
		}
		slog.Info("controller running", "cluster", cluster.String(), "datastore", ds.Describe())
		return c.Run(ctx)
	}
	if store.Kind == backend.Kubernetes {
		if el.Config, err = store.RESTConfig(); err != nil {
			cmdutil.Fatal("bad flag", err)
		}
		el.Namespace = store.Namespace
		err = controller.RunElected(ctx, el, run)
	} else {
		err = run(ctx)
	}
	if err != nil {
		cmdutil.Fatal("controller failed", err)
	}
}

// clusterConfig makes the cluster's pools of --cluster-cidr, a list in
// family order as kube-controller-manager's, each with its family's node
// prefix length, and checks them.
func clusterConfig(cidrs string, prefixLen4, prefixLen6 int) (datastore.ClusterConfig, error) {
	var cfg datastore.ClusterConfig
	for c := range strings.SplitSeq(cidrs, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return cfg, fmt.Errorf("--cluster-cidr %q: %w", cidrs, err)
		}
		pool := datastore.Pool{CIDR: p, NodePrefixLen: prefixLen4}
		if datastore.FamilyOf(p) == datastore.IPv6 {
			pool.NodePrefixLen = prefixLen6
		}
		cfg.Pools = append(cfg.Pools, pool)
	}
	return cfg, nodeipam.Validate(cfg)
}

// envInt is the integer in environment variable name, def when it is
// unset: a ConfigMap key that an older onc-config lacks reaches the
// controller this way (an optional env), where a flag in the manifest's
// args would stop it from starting.
func envInt(name string, def int) (int, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: not a number", name, v)
	}
	return n, nil
}
