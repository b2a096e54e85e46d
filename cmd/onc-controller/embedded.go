package main

import (
	"context"

	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/spf13/pflag"
)

// defaultEmbeddedListen is where the embedded etcd serves by default.
const defaultEmbeddedListen = "https://127.0.0.1:2379"

// embedded names the controller's embedded etcd: for the controller, its
// data and PKI and where it serves; for the subcommands, where to find it.
type embedded struct{ dir, listen string }

func addEmbeddedFlags(fs *pflag.FlagSet) *embedded {
	e := &embedded{}
	fs.StringVar(&e.dir, "embedded-etcd-dir", "/var/lib/onc/etcd", "data directory of the embedded etcd (--datastore=etcd without --etcd-endpoints); its CA and certificates are in pki/ there")
	fs.StringVar(&e.listen, "embedded-etcd-listen", defaultEmbeddedListen, "client URL the embedded etcd serves agents on: https only (mutual TLS), an address agents reach, not a wildcard")
	return e
}

// open connects to the running embedded etcd as the controller, with the
// credentials in its PKI (etcd's root user); o gives the rest.
func (e *embedded) open(ctx context.Context, o etcdstore.Options) (*etcdstore.Store, *etcdserver.PKI, error) {
	pki, err := etcdserver.OpenPKI(etcdserver.PKIDir(e.dir))
	if err != nil {
		return nil, nil, err
	}
	o.Endpoints, o.TLSFiles = []string{e.listen}, pki.Controller()
	s, err := etcdstore.New(ctx, o)
	return s, pki, err
}
