//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The controller's embedded etcd answers only the cluster's components.
// From a pod and from a host on the underlay that is no node, it is
// reachable (TCP connects) but every read and write fails: over plain
// HTTP, over TLS without a client certificate, and with a root
// certificate of another CA; the HTTP/JSON API too. A node's own
// credentials, as the lab has the controller issue them (onc-controller
// node-cert), read ONC's keys but cannot write another node's records.
func TestEmbeddedEtcdAnswersOnlyTheCluster(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1})
	// On the lab's underlay, and no node's or the controller's address.
	outsider, cleanup, err := l.AddOutsider(l.Prefix+"-etcd", netip.MustParseAddr("172.31.250.201"))
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx := context.Background()
	admin, err := etcdstore.New(ctx, l.EtcdAdmin())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	before, err := admin.Nodes(ctx)
	if err != nil || len(before) != 2 {
		t.Fatalf("the lab's nodes: %+v, %v", before, err)
	}
	foreign, err := etcdserver.EnsurePKI(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	foreignRoot, err := foreign.Controller().Config() // user root, another CA
	if err != nil {
		t.Fatal(err)
	}
	foreignRoot.InsecureSkipVerify = true
	etcdURL, err := url.Parse(l.EtcdURL())
	if err != nil {
		t.Fatal(err)
	}
	victim := "/onc/nodes/" + l.Nodes[1].Name

	for _, from := range []struct{ name, netns string }{
		{"FromAPod", l.Nodes[0].Pods[0].Netns},
		{"FromAnOutsideHost", outsider},
	} {
		t.Run(from.name, func(t *testing.T) {
			dial := func(ctx context.Context, addr string) (net.Conn, error) {
				return lab.DialIn(ctx, from.netns, "tcp", addr)
			}
			conn, err := dial(ctx, etcdURL.Host)
			if err != nil {
				t.Fatalf("no TCP connection to the etcd at all (%v): the refusals below would prove nothing", err)
			}
			conn.Close()
			for _, c := range []struct {
				name, scheme string
				tls          *tls.Config
			}{
				{"PlainHTTP", "http", nil},
				{"TLSWithoutCertificate", "https", &tls.Config{InsecureSkipVerify: true}},
				{"RootCertificateOfAnotherCA", "https", foreignRoot},
			} {
				t.Run(c.name, func(t *testing.T) {
					endpoint := c.scheme + "://" + etcdURL.Host
					cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: c.tls, Logger: zap.NewNop(),
						DialOptions: []grpc.DialOption{grpc.WithContextDialer(dial)}})
					if err != nil {
						t.Fatal(err)
					}
					defer cli.Close()
					if resp, err := cli.Get(etcdCallCtx(t), "/onc/", clientv3.WithPrefix()); err == nil {
						t.Errorf("read ONC's keys: %d of them", resp.Count)
					}
					if _, err := cli.Put(etcdCallCtx(t), victim, `{"ip":"172.31.250.201"}`); err == nil {
						t.Errorf("wrote %s", victim)
					}
					// etcd's HTTP/JSON API, on the same port.
					hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: c.tls,
						DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }}}
					for _, path := range []string{"/v3/kv/range", "/v3/kv/put"} {
						body := `{"key":"L29uYy8=","range_end":"L29uYzA="}` // /onc/ to /onc0
						if path == "/v3/kv/put" {
							body = `{"key":"L29uYy9jb25maWc=","value":"eA=="}` // /onc/config = x
						}
						resp, err := hc.Post(endpoint+path, "application/json", bytes.NewBufferString(body))
						if err == nil {
							resp.Body.Close()
							if resp.StatusCode == http.StatusOK {
								t.Errorf("POST %s: %s", path, resp.Status)
							}
						}
					}
				})
			}
		})
	}

	t.Run("ANodesCredentials", func(t *testing.T) {
		n := l.Nodes[0]
		o := l.EtcdAdmin()
		o.TLSFiles = n.EtcdFiles()
		o.Dial = func(ctx context.Context, addr string) (net.Conn, error) { return lab.DialIn(ctx, n.Netns, "tcp", addr) }
		tlsCfg, err := o.TLSFiles.Config()
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, TLS: tlsCfg, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{grpc.WithContextDialer(o.Dial)}})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		if resp, err := cli.Get(etcdCallCtx(t), "/onc/nodes/", clientv3.WithPrefix()); err != nil || resp.Count != 2 {
			t.Fatalf("the node reads the nodes: %v, %v", resp, err)
		}
		other := l.Nodes[1].Name
		for _, key := range []string{"/onc/nodes/" + other, "/onc/alive/" + other, "/onc/nodecidrs/" + n.Name,
			"/onc/nodecidrs/" + other, "/onc/cidrs/10.244.99.0-24", "/onc/config"} {
			if _, err := cli.Put(etcdCallCtx(t), key, "forged"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
				t.Errorf("%s's credentials writing %s: %v, want permission denied", n.Name, key, err)
			}
		}
	})

	after, err := admin.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]datastore.Node{}
	for _, n := range after {
		now[n.Name] = n
	}
	for _, was := range before {
		if n := now[was.Name]; n.IP != was.IP || n.VTEPMAC.String() != was.VTEPMAC.String() || !slices.Equal(n.PodCIDRs, was.PodCIDRs) {
			t.Errorf("node %s changed: %+v, was %+v", was.Name, n, was)
		}
	}
	if cfg, err := admin.ClusterConfig(ctx); err != nil || !cfg.IPv4().CIDR.IsValid() {
		t.Errorf("cluster config after the attempts: %+v, %v", cfg, err)
	}
}

// etcdCallCtx bounds one etcd call: a refused one fails only when its
// context ends (the client retries the connection until then).
func etcdCallCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	return ctx
}
