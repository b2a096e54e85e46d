package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/spf13/pflag"
)

// nodeCert is `onc-controller node-cert NAME --out DIR`: a node's agent
// credentials for the embedded etcd (docs/operations.md, "The embedded
// etcd's certificates"). It returns the process's exit code.
func nodeCert(args []string) int {
	fs := pflag.NewFlagSet("onc-controller node-cert", pflag.ContinueOnError)
	emb := addEmbeddedFlags(fs)
	o := etcdstore.Options{}
	fs.StringVar(&o.Prefix, "etcd-prefix", etcdstore.DefaultPrefix, "key prefix of ONC's data in etcd, as the controller and agents use it")
	out := fs.String("out", "", "directory to write the node's ca.crt, client.crt and client.key into (required)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: onc-controller node-cert NAME --out DIR [flags]\n\n"+
			"Run where the controller runs, with its --embedded-etcd-dir: signs a client certificate for node NAME's\n"+
			"agent with the embedded etcd's CA (etcd user %s) and makes that user and its role: read ONC's\n"+
			"keys, write only the node's own registration and liveness. Again for the same node, it issues a new\n"+
			"certificate; remove-node revokes the user.\n\n%s", etcdstore.NodeUser("NAME"), fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || *out == "" {
		fs.Usage()
		return 2
	}
	name := fs.Arg(0)
	if err := etcdstore.ValidNodeName(name); err != nil {
		fmt.Fprintf(os.Stderr, "onc-controller node-cert: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	files, err := issueNodeCert(ctx, emb, o, name, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "onc-controller node-cert: %v\n", err)
		return 1
	}
	fmt.Printf("node %s: etcd user %s, credentials in %s; its agent's flags:\n"+
		"  --etcd-endpoints %s --etcd-cafile %s --etcd-certfile %s --etcd-keyfile %s\n",
		name, etcdstore.NodeUser(name), *out, emb.listen, files.CAFile, files.CertFile, files.KeyFile)
	return 0
}

// issueNodeCert makes node's etcd user, then writes its credentials.
func issueNodeCert(ctx context.Context, emb *embedded, o etcdstore.Options, node, dir string) (etcdstore.TLSFiles, error) {
	s, pki, err := emb.open(ctx, o)
	if err != nil {
		return etcdstore.TLSFiles{}, fmt.Errorf("the embedded etcd: %w", err)
	}
	defer s.Close()
	if err := s.AuthorizeNode(ctx, node); err != nil {
		return etcdstore.TLSFiles{}, err
	}
	return pki.IssueNode(node, dir)
}
