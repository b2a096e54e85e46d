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
	// QPS and Burst limit the Kubernetes client. client-go's defaults (5,
	// 10) would pace the controller's four requests per new node to one
	// node in 0.8 s: minutes for a cluster's first thousand nodes.
	QPS   float32
	Burst int
}

// AddFlags registers the datastore flags.
func AddFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Kind, "datastore", Etcd, "where cluster state lives: etcd or kubernetes")
	f.Etcd = etcdstore.AddFlags(fs)
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig for --datastore=kubernetes (default: in-cluster service account)")
	fs.StringVar(&f.Namespace, "namespace", "onc-system", "namespace of ONC's ledger and leader Lease (--datastore=kubernetes)")
	fs.StringVar(&f.LeaseNamespace, "lease-namespace", k8sstore.DefaultLeaseNamespace, "namespace of the nodes' liveness Leases (--datastore=kubernetes)")
	fs.Float32Var(&f.QPS, "kube-api-qps", 50, "requests per second the Kubernetes client may send (--datastore=kubernetes)")
	fs.IntVar(&f.Burst, "kube-api-burst", 100, "burst of requests the Kubernetes client may send (--datastore=kubernetes)")
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
		if f.QPS <= 0 || f.Burst < 1 {
			return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: must be positive", f.QPS, f.Burst)
		}
	default:
		return fmt.Errorf("--datastore %q: must be %s or %s", f.Kind, Etcd, Kubernetes)
	}
	return nil
}

// RESTConfig is the Kubernetes client config: --kubeconfig, else in-cluster.
func (f *Flags) RESTConfig() (*rest.Config, error) {
	var c *rest.Config
	var err error
	if f.Kubeconfig != "" {
		if c, err = clientcmd.BuildConfigFromFlags("", f.Kubeconfig); err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", f.Kubeconfig, err)
		}
	} else if c, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("not in a pod and no --kubeconfig: %w", err)
	}
	c.QPS, c.Burst = f.QPS, f.Burst
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
