package etcdstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// client connects to endpoint with tlsCfg (nil: plain HTTP) and does not
// wait for the connection: the calls say whether it works.
func client(t *testing.T, endpoint string, tlsCfg *tls.Config) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clientWith connects with files' credentials.
func clientWith(t *testing.T, endpoint string, files etcdstore.TLSFiles) *clientv3.Client {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	return client(t, endpoint, cfg)
}

func short(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Nobody without a certificate of the controller's CA reads or writes the
// embedded etcd: not over plain HTTP, not over TLS without a certificate,
// not with a root certificate of another CA, not with a certificate of its
// CA whose user is gone. The controller's credentials work.
func TestEmbeddedEtcdRefusesStrangers(t *testing.T) {
	e := testutil.SecureEtcd(t)
	root := clientWith(t, e.ClientURL, e.PKI.Controller())
	if _, err := root.Put(short(t), "/onc/config", "{}"); err != nil {
		t.Fatalf("the controller's credentials: %v", err)
	}
	if _, err := root.Get(short(t), "/onc/config"); err != nil {
		t.Fatalf("the controller's credentials: %v", err)
	}

	other, err := etcdstore.EnsurePKI(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	otherRoot, err := other.Controller().Config() // CN root, wrong CA
	if err != nil {
		t.Fatal(err)
	}
	otherRoot.InsecureSkipVerify = true
	caOnly, err := etcdstore.TLSFiles{CAFile: e.PKI.Controller().CAFile}.Config()
	if err != nil {
		t.Fatal(err)
	}
	gone, err := e.PKI.IssueNode("gone", t.TempDir()) // its CA, no such user
	if err != nil {
		t.Fatal(err)
	}
	goneCfg, err := gone.Config()
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.ClientURL, "https://")
	// The strangers in parallel (each call waits for its timeout), all
	// done before the last check.
	t.Run("Strangers", func(t *testing.T) {
		for _, c := range []struct {
			name, endpoint string
			tls            *tls.Config
			handshakes     bool // the TLS handshake succeeds: etcd's authorization refuses
		}{
			{name: "PlainHTTP", endpoint: "http://" + addr},
			{name: "NoCertificate", endpoint: e.ClientURL, tls: &tls.Config{InsecureSkipVerify: true}},
			{name: "NoCertificateVerifiedServer", endpoint: e.ClientURL, tls: caOnly},
			{name: "RootCertificateOfAnotherCA", endpoint: e.ClientURL, tls: otherRoot},
			{name: "CertificateOfAnUnknownUser", endpoint: e.ClientURL, tls: goneCfg, handshakes: true},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				cli := client(t, c.endpoint, c.tls)
				if resp, err := cli.Get(short(t), "/onc/", clientv3.WithPrefix()); err == nil {
					t.Errorf("read: %d keys", resp.Count)
				}
				if _, err := cli.Get(short(t), "other"); err == nil {
					t.Error("read outside ONC's prefix worked")
				}
				if _, err := cli.Put(short(t), "/onc/config", "stolen"); err == nil {
					t.Error("write worked")
				}
				// etcd checks no permission to grant a lease: only TLS stops it.
				if _, err := cli.Grant(short(t), 10); !c.handshakes && err == nil {
					t.Error("lease grant worked")
				}
			})
		}
	})
	if resp, err := root.Get(short(t), "/onc/config"); err != nil || string(resp.Kvs[0].Value) != "{}" {
		t.Fatalf("config after the strangers: %v, %v", resp, err)
	}
}

// A node's credentials (node-cert: PKI.IssueNode and Store.AuthorizeNode)
// read all of ONC's keys and write its own registration and liveness, and
// nothing else: a subtest per kind of key.
func TestNodeCredentials(t *testing.T) {
	e := testutil.SecureEtcd(t)
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
	root := clientWith(t, e.ClientURL, e.PKI.Controller())
	n1 := clientWith(t, e.ClientURL, files)
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
	e := testutil.SecureEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl := testutil.SecureEtcdStore(t, e, e.PKI.Controller())
	agent := testutil.SecureEtcdStore(t, e, testutil.SecureEtcdNode(t, e, "n1"))
	cluster := datastore.ClusterConfig{ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	if err := ctl.PutClusterConfig(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	changes := agent.Changes(ctx)
	<-changes // the watch exists
	if got, err := agent.ClusterConfig(ctx); err != nil || got != cluster {
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
	if _, err := ctl.ClaimCIDR(ctx, "n1", cidr); err != nil {
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
	if n, err := agent.Node(ctx, "n1"); err != nil || n.PodCIDR != cidr {
		t.Fatalf("Node(n1) = %+v, %v", n, err)
	}
	if nodes, err := agent.Nodes(ctx); err != nil || len(nodes) != 1 || nodes[0].PodCIDR != cidr {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	stop()
	<-done
	// The agent revoked its own lease: it is gone at once.
	if l, err := ctl.Liveness(ctx); err != nil || l["n1"] {
		t.Fatalf("liveness after the agent stopped: %v, %v", l, err)
	}

	other := spec
	other.Name = "n2"
	for name, err := range map[string]error{
		"RegisterNode(n2)":    agent.RegisterNode(ctx, other),
		"PutClusterConfig":    agent.PutClusterConfig(ctx, cluster),
		"DeleteNode(n1)":      agent.DeleteNode(ctx, "n1"),
		"ReleaseCIDR(n1)":     agent.ReleaseCIDR(ctx, "n1"),
		"AuthorizeNode(n2)":   agent.AuthorizeNode(ctx, "n2"),
		"ClaimCIDR(n1, more)": func() error { _, err := agent.ClaimCIDR(ctx, "n1", netip.MustParsePrefix("10.244.8.0/24")); return err }(),
	} {
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s with a node's credentials: %v, want permission denied", name, err)
		}
	}
}

// The PKI is made once, with its keys private, and kept across restarts;
// the server's certificate follows the listen address; plain HTTP and a
// wildcard address are refused.
func TestEmbeddedEtcdPKI(t *testing.T) {
	dir := t.TempDir()
	url := func(host string) string {
		return "https://" + net.JoinHostPort(host, strconv.Itoa(testutil.FreePort(t)))
	}
	e, err := etcdstore.StartEmbeddedTLS(dir, url("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	pkiDir := etcdstore.PKIDir(dir)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(pkiDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for name, mode := range map[string]os.FileMode{"ca.key": 0o600, "server.key": 0o600, "controller.key": 0o600,
		"ca.crt": 0o644, "server.crt": 0o644, "controller.crt": 0o644} {
		if st, err := os.Stat(filepath.Join(pkiDir, name)); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %v", name, st, err, mode)
		}
	}
	ca, ctlCert, server := read("ca.crt"), read("controller.crt"), read("server.crt")
	e.Close()

	// Another address (127.0.0.2 is loopback too): a new server
	// certificate from the same CA; the controller's stays.
	e, err = etcdstore.StartEmbeddedTLS(dir, url("127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if read("ca.crt") != ca || read("controller.crt") != ctlCert {
		t.Error("a restart replaced the CA or the controller's certificate")
	}
	if read("server.crt") == server {
		t.Error("the server certificate does not follow the listen address")
	}
	root := clientWith(t, e.ClientURL, e.PKI.Controller())
	if _, err := root.Put(short(t), "/onc/k", "v"); err != nil {
		t.Fatalf("the controller's credentials after a restart: %v", err)
	}

	for listen, want := range map[string]string{
		"http://127.0.0.1:2379": "only https",
		"https://0.0.0.0:2379":  "not a wildcard",
		"https://[::]:2379":     "not a wildcard",
		"https://:2379":         "not a wildcard", // no host: every address
	} {
		if _, err := etcdstore.StartEmbeddedTLS(t.TempDir(), listen); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("StartEmbeddedTLS(%s) = %v, want an error saying %q", listen, err, want)
		}
	}
	if _, err := etcdstore.OpenPKI(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no etcd CA") {
		t.Errorf("OpenPKI of an empty directory: %v", err)
	}
	if _, err := e.PKI.IssueNode("a/b", t.TempDir()); err == nil || !strings.Contains(err.Error(), "invalid node name") {
		t.Errorf("IssueNode(a/b): %v", err)
	}
	files, err := e.PKI.IssueNode("n1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(files.KeyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("node key: %v, %v; want mode 0600", st, err)
	}
}

// EndLiveness, as root, revokes the lease a node's alive/ key is bound to
// (whoever renews it) or deletes a key bound to none; a missing key is
// fine. A node's credentials cannot end another's liveness.
func TestEndLiveness(t *testing.T) {
	e := testutil.SecureEtcd(t)
	ctx := context.Background()
	admin := testutil.SecureEtcdStore(t, e, e.PKI.Controller())
	files := testutil.SecureEtcdNode(t, e, "n1")
	n1 := testutil.SecureEtcdStore(t, e, files)
	root, n1Cli := clientWith(t, e.ClientURL, e.PKI.Controller()), clientWith(t, e.ClientURL, files)
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
