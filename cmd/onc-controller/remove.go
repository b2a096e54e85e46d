package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/backend"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/spf13/pflag"
)

// removeNode is `onc-controller remove-node NAME`: the etcd datastore's way
// to remove a node at once (docs/operations.md, "Removing a node"). It
// returns the process's exit code.
func removeNode(args []string) int {
	fs := pflag.NewFlagSet("onc-controller remove-node", pflag.ContinueOnError)
	store := backend.AddFlags(fs)
	emb := addEmbeddedFlags(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	evenIfAlive := fs.Bool("even-if-alive", false, "remove the node even if its liveness lease is held (by anyone: another node can renew it): first delete its etcd user and role, then revoke that lease; the embedded etcd only")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: onc-controller remove-node NAME [flags]\n\n"+
			"Removes the node's registration and liveness and releases its pod CIDR in one transaction;\n"+
			"every agent then takes it off its peers. Stop the node's agent first. Without --etcd-endpoints\n"+
			"it acts on the controller's embedded etcd, with the controller's credentials from\n"+
			"--embedded-etcd-dir, and also deletes the node's etcd user and role; there --even-if-alive\n"+
			"removes a node that still looks alive.\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	name := fs.Arg(0)
	if store.Kind == backend.Kubernetes {
		fmt.Fprintf(os.Stderr, "onc-controller remove-node: on Kubernetes, delete the Node instead (kubectl delete node %s): the controller then frees its pod CIDR at once\n", name)
		return 2
	}
	if *evenIfAlive && len(store.Etcd.Endpoints) > 0 {
		fmt.Fprintf(os.Stderr, "onc-controller remove-node: --even-if-alive is only for the embedded etcd (without --etcd-endpoints), where it has the controller's root credentials; on an external etcd, revoke the lease of %salive/%s with etcdctl\n", store.Etcd.Prefix, name)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var ds datastore.Store
	var creds controller.Revoker
	var err error
	if len(store.Etcd.Endpoints) == 0 {
		s, _, openErr := emb.open(ctx, *store.Etcd)
		ds, creds, err = s, s, openErr
	} else {
		ds, err = store.Open(ctx, backend.ForController)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "onc-controller remove-node: datastore: %v\n", err)
		return 1
	}
	defer ds.Close()
	remove := controller.RemoveNode
	if *evenIfAlive {
		remove = controller.RemoveNodeEvenIfAlive
	}
	cidrs, err := remove(ctx, ds, creds, name)
	switch {
	case creds != nil && errors.Is(err, datastore.ErrNotFound):
		err = fmt.Errorf("%w; its etcd user %s, if it had one, is deleted", err, etcdstore.NodeUser(name))
	case errors.Is(err, controller.ErrNodeAlive):
		err = fmt.Errorf("%w; if it stays alive with its agent stopped (anyone can renew its lease), --even-if-alive removes it anyway on the embedded etcd", err)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "onc-controller remove-node: %v\n", err)
		return 1
	}
	if *evenIfAlive {
		fmt.Printf("node %s: etcd user and role %s deleted; liveness ended (its lease revoked)\n", name, etcdstore.NodeUser(name))
	}
	if len(cidrs) > 0 {
		fmt.Printf("node %s removed; pod CIDR %s released\n", name, prefixList(cidrs))
	} else {
		fmt.Printf("node %s removed (it had no pod CIDR)\n", name)
	}
	return 0
}

// prefixList names a node's blocks: "10.244.1.0/24 and fd00:10:244:1::/64".
func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " and ")
}
