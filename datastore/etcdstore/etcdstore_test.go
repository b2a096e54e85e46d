package etcdstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/datastore/storetest"
)

// open gives each subtest its own prefix on one server, so they start empty.
func open(t *testing.T, endpoint string, creds etcdstore.TLSFiles) datastore.Store {
	s, err := etcdstore.New(context.Background(), etcdstore.Options{
		Endpoints: []string{endpoint}, Prefix: "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/", TLSFiles: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestEmbeddedEtcd(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	storetest.Run(t, func(t *testing.T) datastore.Store { return open(t, e.ClientURL, etcdstore.TLSFiles{}) })
}

// The controller's embedded etcd (mutual TLS, authentication) with the
// controller's credentials, root: every call of the store works.
func TestEmbeddedEtcdTLS(t *testing.T) {
	e := etcdtest.Secure(t)
	storetest.Run(t, func(t *testing.T) datastore.Store { return open(t, e.ClientURL, e.PKI.Controller()) })
}

func TestEtcdServerProcess(t *testing.T) {
	url := etcdtest.Process(t)
	storetest.Run(t, func(t *testing.T) datastore.Store { return open(t, url, etcdstore.TLSFiles{}) })
}

func TestUnreachableEtcdIsAClearError(t *testing.T) {
	_, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: 500_000_000})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("err = %v, want an error naming the endpoint", err)
	}
	if _, err := etcdstore.New(context.Background(), etcdstore.Options{}); err == nil {
		t.Fatal("no endpoints accepted")
	}
}
