package etcdstore_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/datastore/storetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// open gives each subtest its own prefix on one server, so they start
// empty, and that prefix's config key as an older release read it.
func open(t *testing.T, endpoint string, creds etcdstore.TLSFiles) (datastore.Store, storetest.Older) {
	prefix := "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/"
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{endpoint}, Prefix: prefix, TLSFiles: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tlsCfg, err := creds.Config()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return s, older{cli, prefix + "config"}
}

// older is the config key as releases before IPv6 wrote and read it: the
// JSON of their ClusterConfig.
type older struct {
	cli *clientv3.Client
	key string
}

type configBeforeIPv6 struct {
	ClusterCIDR   netip.Prefix `json:"clusterCIDR"`
	NodePrefixLen int          `json:"nodePrefixLen"`
}

func (o older) PutConfig(ctx context.Context, cidr netip.Prefix, bits int) error {
	val, err := json.Marshal(configBeforeIPv6{cidr, bits})
	if err == nil {
		_, err = o.cli.Put(ctx, o.key, string(val))
	}
	return err
}

func (o older) Config(ctx context.Context) (netip.Prefix, int, error) {
	resp, err := o.cli.Get(ctx, o.key)
	if err != nil || len(resp.Kvs) == 0 {
		return netip.Prefix{}, 0, err
	}
	var c configBeforeIPv6
	err = json.Unmarshal(resp.Kvs[0].Value, &c)
	return c.ClusterCIDR, c.NodePrefixLen, err
}

func TestEmbeddedEtcd(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	storetest.Run(t, func(t *testing.T) (datastore.Store, storetest.Older) {
		return open(t, e.ClientURL, etcdstore.TLSFiles{})
	})
}

// The controller's embedded etcd (mutual TLS, authentication) with the
// controller's credentials, root: every call of the store works.
func TestEmbeddedEtcdTLS(t *testing.T) {
	e := etcdtest.Secure(t)
	storetest.Run(t, func(t *testing.T) (datastore.Store, storetest.Older) { return open(t, e.ClientURL, e.PKI.Controller()) })
}

func TestEtcdServerProcess(t *testing.T) {
	url := etcdtest.Process(t)
	storetest.Run(t, func(t *testing.T) (datastore.Store, storetest.Older) { return open(t, url, etcdstore.TLSFiles{}) })
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
