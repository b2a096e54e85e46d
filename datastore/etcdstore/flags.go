package etcdstore

import (
	"time"

	"github.com/spf13/pflag"
)

// AddFlags registers the etcd connection flags shared by onc-agent and
// onc-controller and returns the options they fill.
func AddFlags(fs *pflag.FlagSet) *Options {
	o := &Options{}
	fs.StringSliceVar(&o.Endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated")
	fs.StringVar(&o.Prefix, "etcd-prefix", DefaultPrefix, "key prefix of ONC's data in etcd")
	fs.StringVar(&o.CAFile, "etcd-cafile", "", "CA bundle to verify etcd's certificate")
	fs.StringVar(&o.CertFile, "etcd-certfile", "", "client certificate for etcd")
	fs.StringVar(&o.KeyFile, "etcd-keyfile", "", "client key for etcd")
	fs.DurationVar(&o.DialTimeout, "etcd-dial-timeout", 5*time.Second, "how long to wait for etcd at start")
	return o
}
