// Command onc-controller is ONC's cluster NodeIPAM. With no --etcd-endpoints
// it runs an embedded etcd and serves it to the agents.
package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/controller/datastore"
	"github.com/onc-net/onc/controller/datastore/etcdstore"
	"github.com/onc-net/onc/internal/cmdutil"
	"github.com/spf13/pflag"
)

func main() {
	fs := pflag.NewFlagSet("onc-controller", pflag.ExitOnError)
	clusterCIDR := fs.String("cluster-cidr", "10.244.0.0/16", "IPv4 range all pod CIDRs come from")
	prefixLen := fs.Int("node-prefix-len", 24, "size of each node's pod CIDR")
	nodeTimeout := fs.Duration("node-timeout", 24*time.Hour, "delete a node (and free its CIDR) after its agent has been gone this long; 0 never")
	embedDir := fs.String("embedded-etcd-dir", "/var/lib/onc/etcd", "data directory of the embedded etcd (used without --etcd-endpoints)")
	embedListen := fs.String("embedded-etcd-listen", "http://127.0.0.1:2379", "client URL the embedded etcd serves agents on")
	etcd := etcdstore.AddFlags(fs)
	debug := fs.Bool("debug", false, "debug logging")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := cmdutil.Setup(*debug)
	defer stop()
	cidr, err := netip.ParsePrefix(*clusterCIDR)
	if err != nil {
		cmdutil.Fatal("bad flag", fmt.Errorf("--cluster-cidr %q: %w", *clusterCIDR, err))
	}
	if len(etcd.Endpoints) == 0 {
		e, err := etcdstore.StartEmbedded(*embedDir, *embedListen)
		if err != nil {
			cmdutil.Fatal("cannot start the embedded etcd", err)
		}
		defer e.Close()
		slog.Info("embedded etcd serving", "url", e.ClientURL, "dir", *embedDir)
		etcd.Endpoints = []string{e.ClientURL}
	}
	store, err := etcdstore.New(ctx, *etcd)
	if err != nil {
		cmdutil.Fatal("cannot open the datastore", err)
	}
	defer store.Close()
	c, err := controller.New(ctx, controller.Config{
		Cluster:     datastore.ClusterConfig{ClusterCIDR: cidr, NodePrefixLen: *prefixLen},
		NodeTimeout: *nodeTimeout,
	}, store)
	if err != nil {
		cmdutil.Fatal("cannot start the controller", err)
	}
	slog.Info("controller running", "clusterCIDR", cidr, "nodePrefixLen", *prefixLen, "datastore", store.Describe())
	if err := c.Run(ctx); err != nil {
		cmdutil.Fatal("controller failed", err)
	}
}
