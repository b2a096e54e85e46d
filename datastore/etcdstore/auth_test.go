package etcdstore_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func short(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A node's credentials (node-cert: PKI.IssueNode and Store.AuthorizeNode)
// read all of ONC's keys and write its own registration and liveness, and
// nothing else: a subtest per kind of key.
func TestNodeCredentials(t *testing.T) {
	e := etcdtest.Secure(t)
	ctx := context.Background()
	admin, err := etcdstore.New(ctx, etcdstore.Options{Endpoints: []string{e.ClientURL}, TLSFiles: e.PKI.Controller()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, n := range []string{"n1", "n2"} {
		if err := admin.AuthorizeNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.AuthorizeNode(ctx, "n1"); err != nil {
		t.Fatalf("authorizing a node again: %v", err)
	}
	files, err := e.PKI.IssueNode("n1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := etcdtest.Client(t, e, e.PKI.Controller())
	n1 := etcdtest.Client(t, e, files)
	for k, v := range map[string]string{"/onc/config": "{}", "/onc/nodes/n2": "{}", "/onc/cidrs/10.244.1.0-24": "n2",
		"/onc/nodecidrs/n2": "10.244.1.0/24", "/elsewhere": "x"} {
		if _, err := root.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	n2Lease, err := root.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Put(ctx, "/onc/alive/n2", "1", clientv3.WithLease(n2Lease.ID)); err != nil {
		t.Fatal(err)
	}

	t.Run("ReadsAndWatchesThePrefix", func(t *testing.T) {
		resp, err := n1.Get(short(t), "/onc/", clientv3.WithPrefix())
		if err != nil || resp.Count != 5 {
			t.Fatalf("read of the prefix: %v, %v; want 5 keys", resp, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		w := n1.Watch(clientv3.WithRequireLeader(wctx), "/onc/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if r := <-w; r.Err() != nil || !r.Created {
			t.Fatalf("watch: %v", r.Err())
		}
		if _, err := root.Put(ctx, "/onc/nodecidrs/n1", "10.244.2.0/24"); err != nil {
			t.Fatal(err)
		}
		if r := <-w; r.Err() != nil || len(r.Events) != 1 {
			t.Fatalf("watch event: %+v, %v", r.Events, r.Err())
		}
	})
	t.Run("WritesItsRecordAndLiveness", func(t *testing.T) {
		if _, err := n1.Put(short(t), "/onc/nodes/n1", "{}"); err != nil {
			t.Fatal(err)
		}
		l, err := n1.Grant(short(t), 60)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n1.Put(short(t), "/onc/alive/n1", "1", clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		if _, err := n1.KeepAliveOnce(short(t), l.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := n1.Revoke(short(t), l.ID); err != nil {
			t.Fatal(err)
		}
	})
	denied := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Fatalf("err = %v, want permission denied", err)
		}
	}
	for _, k := range []struct{ name, key string }{
		{"OtherNodesRecord", "/onc/nodes/n2"},
		{"OtherNodesLiveness", "/onc/alive/n2"},
		{"ABlock", "/onc/cidrs/10.244.3.0-24"},
		{"ABlockOfAnother", "/onc/cidrs/10.244.1.0-24"},
		{"ItsOwnBlock", "/onc/nodecidrs/n1"},
		{"AnothersBlock", "/onc/nodecidrs/n2"},
		{"AnIPv6Block", "/onc/cidrs-ipv6/fd00_10_244_1__-64"},
		{"ItsOwnIPv6Block", "/onc/nodecidrs-ipv6/n1"},
		{"Config", "/onc/config"},
		{"ARecordBelowItsOwn", "/onc/nodes/n1/x"},
		// Keys that share its name as a prefix: its grants are exact keys.
		{"ASiblingsRecord", "/onc/nodes/n1x"},
		{"ASiblingsLiveness", "/onc/alive/n1x"},
		{"OutsideThePrefix", "/elsewhere"},
	} {
		t.Run("Refused"+k.name, func(t *testing.T) {
			_, err := n1.Put(short(t), k.key, "forged")
			denied(t, err)
			_, err = n1.Delete(short(t), k.key)
			denied(t, err)
			_, err = n1.Txn(short(t)).Then(clientv3.OpPut("/onc/nodes/n1", "{}"), clientv3.OpPut(k.key, "forged")).Commit()
			denied(t, err)
		})
	}
	t.Run("RefusedReadOutsideThePrefix", func(t *testing.T) {
		_, err := n1.Get(short(t), "/elsewhere")
		denied(t, err)
	})
	t.Run("RefusedRevokingAnothersLease", func(t *testing.T) {
		_, err := n1.Revoke(short(t), n2Lease.ID)
		denied(t, err)
	})
	t.Run("RefusedUserAdministration", func(t *testing.T) {
		_, err := n1.UserGrantRole(short(t), etcdstore.NodeUser("n1"), "root")
		denied(t, err)
		_, err = n1.AuthDisable(short(t))
		denied(t, err)
	})
	t.Run("NothingAfterRevocation", func(t *testing.T) {
		if err := admin.RevokeNode(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := admin.RevokeNode(ctx, "n1"); err != nil {
			t.Fatalf("revoking again: %v", err)
		}
		if _, err := n1.Get(short(t), "/onc/config"); err == nil {
			t.Fatal("a revoked node's credentials still read")
		}
		if _, err := n1.Put(short(t), "/onc/nodes/n1", "{}"); err == nil {
			t.Fatal("a revoked node's credentials still write its own record")
		}
	})
	for k, v := range map[string]string{"/onc/config": "{}", "/onc/nodes/n2": "{}", "/onc/cidrs/10.244.1.0-24": "n2",
		"/onc/nodecidrs/n2": "10.244.1.0/24", "/onc/alive/n2": "1", "/elsewhere": "x"} {
		if resp, err := root.Get(ctx, k); err != nil || resp.Count != 1 || string(resp.Kvs[0].Value) != v {
			t.Errorf("%s after the refusals: %v, %v; want %q", k, resp, err, v)
		}
	}
}

// An agent's datastore calls work with its node's credentials, beside the
// controller's; the controller's calls do not.
func TestAgentStoreWithNodeCredentials(t *testing.T) {
	e := etcdtest.Secure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl := etcdtest.Store(t, e, e.PKI.Controller())
	agent := etcdtest.Store(t, e, etcdtest.Node(t, e, "n1"))
	cluster := datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}}
	if err := ctl.PutClusterConfig(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	changes := agent.Changes(ctx)
	<-changes // the watch exists
	if got, err := agent.ClusterConfig(ctx); err != nil || !got.Equal(cluster) {
		t.Fatalf("ClusterConfig = %v, %v", got, err)
	}
	spec := datastore.NodeSpec{Name: "n1", IP: netip.MustParseAddr("192.0.2.1"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}
	if err := agent.RegisterNode(ctx, spec); err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.KeepAlive(kctx, "n1", 5*time.Second) }()
	testutil.WaitFor(t, "n1 alive", 10*time.Second, func() bool { l, _ := agent.Liveness(ctx); return l["n1"] })
	cidr := netip.MustParsePrefix("10.244.7.0/24")
	if _, err := datastore.ClaimCIDR(ctx, ctl, "n1", cidr); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "a change signal", 10*time.Second, func() bool {
		select {
		case <-changes:
			return true
		default:
			return false
		}
	})
	if n, err := agent.Node(ctx, "n1"); err != nil || n.IPv4PodCIDR() != cidr {
		t.Fatalf("Node(n1) = %+v, %v", n, err)
	}
	if nodes, err := agent.Nodes(ctx); err != nil || len(nodes) != 1 || nodes[0].IPv4PodCIDR() != cidr {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	stop()
	<-done
	// The agent revoked its own lease: it is gone at once.
	if l, err := ctl.Liveness(ctx); err != nil || l["n1"] {
		t.Fatalf("liveness after the agent stopped: %v, %v", l, err)
	}

	// n2's record pins n2's peer key; n1 may not pin its own key there,
	// which would let it speak as n2 on the peer API (agent/peer).
	n2 := spec
	n2.Name, n2.PeerPin = "n2", "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	if err := ctl.RegisterNode(ctx, n2); err != nil {
		t.Fatal(err)
	}
	other := n2
	other.PeerPin = "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="
	dualStack := datastore.ClusterConfig{Pools: append(cluster.Pools, datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64})}
	for name, err := range map[string]error{
		"RegisterNode(n2)":  agent.RegisterNode(ctx, other),
		"PutClusterConfig":  agent.PutClusterConfig(ctx, dualStack),
		"DeleteNode(n1)":    agent.DeleteNode(ctx, "n1"),
		"ReleaseCIDR(n1)":   agent.ReleaseCIDR(ctx, "n1"),
		"AuthorizeNode(n2)": agent.AuthorizeNode(ctx, "n2"),
		"ClaimCIDR(n1, more)": func() error {
			_, err := datastore.ClaimCIDR(ctx, agent, "n1", netip.MustParsePrefix("10.244.8.0/24"))
			return err
		}(),
	} {
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s with a node's credentials: %v, want permission denied", name, err)
		}
	}
	if n, err := ctl.Node(ctx, "n2"); err != nil || n.PeerPin != n2.PeerPin {
		t.Errorf("n2 after n1's refused write: %+v, %v; want its own pin", n, err)
	}
}

// EndLiveness, as root, revokes the lease a node's alive/ key is bound to
// (whoever renews it) or deletes a key bound to none; a missing key is
// fine. A node's credentials cannot end another's liveness.
func TestEndLiveness(t *testing.T) {
	e := etcdtest.Secure(t)
	ctx := context.Background()
	admin := etcdtest.Store(t, e, e.PKI.Controller())
	files := etcdtest.Node(t, e, "n1")
	n1 := etcdtest.Store(t, e, files)
	root, n1Cli := etcdtest.Client(t, e, e.PKI.Controller()), etcdtest.Client(t, e, files)
	lease, err := root.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Put(ctx, "/onc/alive/leased", "1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Put(ctx, "/onc/alive/leaseless", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := n1Cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("another node renews the lease: %v", err)
	}

	if err := n1.EndLiveness(ctx, "leased"); err == nil {
		t.Error("a node's credentials ended another's liveness")
	}
	for _, name := range []string{"leased", "leaseless", "missing"} {
		if err := admin.EndLiveness(ctx, name); err != nil {
			t.Errorf("EndLiveness(%s): %v", name, err)
		}
	}
	if live, err := admin.Liveness(ctx); err != nil || len(live) != 0 {
		t.Errorf("liveness left: %v, %v", live, err)
	}
	if _, err := n1Cli.KeepAliveOnce(ctx, lease.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Errorf("renewing the ended lease: %v, want ErrLeaseNotFound", err)
	}
	if err := admin.EndLiveness(ctx, "a/b"); err == nil || !strings.Contains(err.Error(), "invalid node name") {
		t.Errorf("EndLiveness(a/b): %v", err)
	}
}
