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
	// QPS and Burst limit the Kubernetes client (client-go's defaults, 5
	// and 10, suit a human at a terminal); their defaults depend on the
	// role (AddFlags, AddControllerFlags).
	QPS   float32
	Burst int
}

// The Kubernetes client's default limits. An agent sends a handful of
// requests as it starts and little after. The controller writes two
// objects per new node (its ONCNode's copy of the block, Node.spec.podCIDR)
// besides one ledger update per batch: at 300 requests/s, 5,000 nodes
// joining at once cost 33 s of its budget, within a minute with margin
// where the kube-apiserver of a 2-core machine serves some 400 writes/s
// (there the API server, not this limit, sets the pace).
// kube-controller-manager (whose node IPAM writes one Node.spec.podCIDR per
// node) defaults to 20/30, Cilium's operator to 100/200. At steady state
// ONC's controller writes next to nothing, and the API server's priority
// and fairness queues its bursts with other service accounts' requests.
const (
	AgentQPS, AgentBurst           = 50, 100
	ControllerQPS, ControllerBurst = 300, 600
)

// AddFlags registers the datastore flags, with the agent's client limits.
func AddFlags(fs *pflag.FlagSet) *Flags {
	return addFlags(fs, AgentQPS, AgentBurst, "")
}

// AddControllerFlags registers the datastore flags, with the controller's
// client limits.
func AddControllerFlags(fs *pflag.FlagSet) *Flags {
	return addFlags(fs, ControllerQPS, ControllerBurst,
		"; the controller writes two objects per new node, so 5,000 nodes joining at once take 33 s at 300 (docs/install.md)")
}

func addFlags(fs *pflag.FlagSet, qps float32, burst int, why string) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Kind, "datastore", Etcd, "where cluster state lives: etcd or kubernetes")
	f.Etcd = etcdstore.AddFlags(fs)
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig for --datastore=kubernetes (default: in-cluster service account)")
	fs.StringVar(&f.Namespace, "namespace", "onc-system", "namespace of ONC's ledger and leader Lease (--datastore=kubernetes)")
	fs.StringVar(&f.LeaseNamespace, "lease-namespace", k8sstore.DefaultLeaseNamespace, "namespace of the nodes' liveness Leases (--datastore=kubernetes)")
	fs.Float32Var(&f.QPS, "kube-api-qps", qps, "requests per second the Kubernetes client may send (--datastore=kubernetes)"+why)
	fs.IntVar(&f.Burst, "kube-api-burst", burst, "burst of requests the Kubernetes client may send (--datastore=kubernetes)")
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
