// Package backend opens the datastore that onc-agent's and onc-controller's
// flags name: etcd (the default) or Kubernetes.
package backend

import (
	"context"
	"fmt"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Backend names.
const (
	Etcd       = "etcd"
	Kubernetes = "kubernetes"
)

// Role is who opens the store: an agent needs less of it than the
// controller (on Kubernetes, neither the cluster's Nodes nor the liveness
// Leases are watched for it).
type Role int

// Roles.
const (
	ForController Role = iota
	ForAgent
)

// Flags select and configure the backend.
type Flags struct {
	Kind           string
	Etcd           *etcdstore.Options
	Kubeconfig     string
	Namespace      string
	LeaseNamespace string
}

// AddFlags registers the datastore flags.
func AddFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Kind, "datastore", Etcd, "where cluster state lives: etcd or kubernetes")
	f.Etcd = etcdstore.AddFlags(fs)
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig for --datastore=kubernetes (default: in-cluster service account)")
	fs.StringVar(&f.Namespace, "namespace", "onc-system", "namespace of ONC's ledger and leader Lease (--datastore=kubernetes)")
	fs.StringVar(&f.LeaseNamespace, "lease-namespace", k8sstore.DefaultLeaseNamespace, "namespace of the nodes' liveness Leases (--datastore=kubernetes)")
	return f
}

// Validate checks the flags agree with each other.
func (f *Flags) Validate() error {
	switch f.Kind {
	case Etcd:
		if f.Kubeconfig != "" {
			return fmt.Errorf("--kubeconfig is only for --datastore=%s", Kubernetes)
		}
	case Kubernetes:
		if len(f.Etcd.Endpoints) > 0 {
			return fmt.Errorf("--etcd-endpoints is only for --datastore=%s", Etcd)
		}
	default:
		return fmt.Errorf("--datastore %q: must be %s or %s", f.Kind, Etcd, Kubernetes)
	}
	return nil
}

// RESTConfig is the Kubernetes client config: --kubeconfig, else in-cluster.
func (f *Flags) RESTConfig() (*rest.Config, error) {
	if f.Kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", f.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", f.Kubeconfig, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a pod and no --kubeconfig: %w", err)
	}
	return c, nil
}

// Open connects to the backend for role.
func (f *Flags) Open(ctx context.Context, role Role) (datastore.Store, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.Kind == Etcd {
		return etcdstore.New(ctx, *f.Etcd)
	}
	cfg, err := f.RESTConfig()
	if err != nil {
		return nil, err
	}
	return k8sstore.New(ctx, k8sstore.Options{Config: cfg, Namespace: f.Namespace, LeaseNamespace: f.LeaseNamespace, Agent: role == ForAgent})
}
