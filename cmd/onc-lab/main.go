// Command onc-lab brings ONC's local lab up and down (see lab).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/lab"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		os.Exit(1)
	}
}

// newRoot builds onc-lab and its commands.
func newRoot() *cobra.Command {
	var o lab.Options
	var keep, slow bool
	root := &cobra.Command{Use: "onc-lab", Short: "ONC's local lab: nodes and pods as network namespaces", SilenceUsage: true}
	root.PersistentFlags().StringVar(&o.Prefix, "prefix", "onclab", "name prefix of everything the lab makes")
	root.PersistentFlags().StringVar(&o.StateRoot, "state-root", "/run/onc-lab", "where labs keep logs, sockets and state")

	up := &cobra.Command{Use: "up", Short: "Build the lab, show the connectivity matrix, leave it running", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if o.BinDir == "" {
				exe, _ := os.Executable()
				o.BinDir = filepath.Dir(exe)
			}
			if slow {
				o.AgentArgs = append(o.AgentArgs, "--fast-path=false")
			}
			fmt.Printf("Building lab %q: %d nodes × %d pods, datastore %s...\n", o.Prefix, o.Nodes, o.PodsPerNode, o.Datastore)
			l, err := lab.Up(ctx, o)
			if err != nil {
				return err
			}
			fmt.Println("Probing every pair (ICMP, TCP, UDP)...")
			if err := matrix(ctx, l); err != nil {
				if keep {
					fmt.Printf("\nLab left up for debugging (logs in %s); remove it with: make lab-down\n", l.Dir)
				} else {
					_ = l.Down()
				}
				return err
			}
			printExplore(ctx, l)
			return nil
		}}
	upFlags := pflag.NewFlagSet("up", pflag.ContinueOnError)
	upFlags.IntVar(&o.Nodes, "nodes", 3, "number of nodes")
	upFlags.IntVar(&o.PodsPerNode, "pods", 2, "pods per node")
	upFlags.StringVar(&o.BinDir, "bin", "", "directory with onc, onc-agent, onc-controller (default: next to onc-lab)")
	upFlags.DurationVar(&o.NodeTimeout, "node-timeout", 30*time.Second, "controller --node-timeout")
	upFlags.BoolVar(&keep, "keep-on-failure", false, "leave the lab up when the matrix fails")
	upFlags.BoolVar(&slow, "slow-path-only", false, "start the agents with the fast path off")
	upFlags.StringVar(&o.Datastore, "datastore", "etcd", "etcd (embedded in the controller) or kubernetes (a real kube-apiserver; make kube-bins)")
	upFlags.StringVar(&o.Underlay, "underlay", lab.UnderlayBridge, "bridge (every node on one bridge) or direct (2 nodes on one veth pair, as the bench runs)")
	upFlags.StringVar(&o.IPFamily, "ip-family", lab.IPFamilyIPv4, "pods' address families: ipv4; dual (IPv4 and IPv6, cluster CIDRs "+lab.ClusterCIDRs+", IPv4 tunnels); or ipv6 (cluster CIDR "+lab.ClusterCIDR6+", IPv6 tunnels)")
	upFlags.BoolVar(&o.ExternalClient, "external-client", false, "add a host outside the cluster on the underlay (namespace <prefix>-ext, "+lab.ExternalClientIP.String()+"), a client of NodePorts and external IPs")
	upFlags.StringVar(&o.KubeBin, "kube-bin", os.Getenv("ONC_KUBE_BIN"), "directory with kube-apiserver for --datastore=kubernetes (env ONC_KUBE_BIN)")
	up.Flags().AddFlagSet(upFlags)

	down := &cobra.Command{Use: "down", Short: "Stop the lab's processes and remove all it made", Args: cobra.NoArgs,
		Long: "Stop the lab's processes and remove all it made. It also accepts, and ignores, every flag of up,\n" +
			"so `make lab-down` takes the LAB_ARGS `make lab` took; only --prefix and --state-root matter to it.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.DownByName(o.StateRoot, o.Prefix); err != nil {
				return err
			}
			fmt.Printf("lab %q removed\n", o.Prefix)
			return nil
		}}
	acceptHidden(down, upFlags)

	matrix := &cobra.Command{Use: "matrix", Short: "Probe every pair of a running lab again", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := lab.Load(o.StateRoot, o.Prefix)
			if err != nil {
				return fmt.Errorf("lab %q is not up: %w", o.Prefix, err)
			}
			return matrix(cmd.Context(), l)
		}}
	var etcdDir, etcdListen string
	etcd := &cobra.Command{Use: "etcd", Hidden: true, Short: "Serve an embedded etcd (the lab's kube-apiserver store)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			e, err := etcdserver.Start(etcdDir, etcdListen)
			if err != nil {
				return err
			}
			defer e.Close()
			<-ctx.Done()
			return nil
		}}
	etcd.Flags().StringVar(&etcdDir, "dir", "", "data directory")
	etcd.Flags().StringVar(&etcdListen, "listen", "http://127.0.0.1:2379", "client URL")
	root.AddCommand(up, down, matrix, etcd)
	return root
}

// acceptHidden makes cmd parse the flags of fs, out of its help: their
// values go where fs's do, and cmd ignores them.
func acceptHidden(cmd *cobra.Command, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		hidden := *f // fs's own flag stays in up's help
		hidden.Hidden = true
		cmd.Flags().AddFlag(&hidden)
	})
}

// matrix probes every pair of l and prints the results, then what the
// probes did to each node's fast-path counters.
func matrix(ctx context.Context, l *lab.Lab) error {
	before, statsErr := l.Stats(ctx)
	results, err := l.Matrix(ctx)
	failed := lab.PrintMatrix(os.Stdout, results)
	if err != nil {
		return err
	}
	fmt.Println("\nThe fast path during the matrix (onctl stats, what grew):")
	after, afterErr := l.Stats(ctx)
	if statsErr = errors.Join(statsErr, afterErr); statsErr != nil {
		fmt.Println(statsErr) // the matrix is the verdict; counters only explain it
	} else {
		lab.PrintStatsDelta(os.Stdout, lab.StatsDelta(before, after))
	}
	if failed > 0 {
		return fmt.Errorf("%d pairs failed", failed)
	}
	return nil
}

func printExplore(ctx context.Context, l *lab.Lab) {
	n := l.Nodes[0]
	fmt.Printf(`
The lab is up. Explore it:
  %[1]s/onctl -s %[2]s status      # or pods, peers, stats; -o json
  ip netns exec %[3]s ip route     # a node's routes (onc.vxlan peers)
  ip netns exec %[4]s ping %[5]s   # from a pod
  %[1]s/onc-lab matrix --prefix %[6]s
`, l.BinDir, n.AgentSocket(), n.Netns, n.Pods[0].Netns, l.Nodes[len(l.Nodes)-1].Pods[0].IP, l.Prefix)
	if l.ExternalClient != "" {
		fmt.Printf("  ip netns exec %s curl http://%s:NODEPORT/   # from the host outside the cluster\n", l.ExternalClient, n.IP)
	}
	printMetrics(ctx, l)
	fmt.Printf("Logs and state: %s\nRemove it: make lab-down\n", l.Dir)
}

// printMetrics says how to scrape every agent's and the controller's
// Prometheus metrics.
func printMetrics(ctx context.Context, l *lab.Lab) {
	targets, err := l.MetricsTargets(ctx)
	if err != nil {
		fmt.Println("Metrics:", err)
		return
	}
	fmt.Println("Prometheus metrics (docs/metrics.md), each served in its daemon's namespace:")
	for _, t := range targets {
		fmt.Printf("  %s   # %s\n", t.Command(), t.Name)
	}
}
