package etcdserver_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
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
	e := etcdtest.Secure(t)
	root := etcdtest.Client(t, e, e.PKI.Controller())
	if _, err := root.Put(short(t), "/onc/config", "{}"); err != nil {
		t.Fatalf("the controller's credentials: %v", err)
	}
	if _, err := root.Get(short(t), "/onc/config"); err != nil {
		t.Fatalf("the controller's credentials: %v", err)
	}

	other, err := etcdserver.EnsurePKI(t.TempDir(), []string{"127.0.0.1"})
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
	if resp, err := root.Get(short(t), "/onc/config"); err != nil || string(resp.Kvs[0].Value) != "{}" {
		t.Fatalf("config after the strangers: %v, %v", resp, err)
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
	e, err := etcdserver.StartTLS(dir, url("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	pkiDir := etcdserver.PKIDir(dir)
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
	e, err = etcdserver.StartTLS(dir, url("127.0.0.2"))
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
	root := etcdtest.Client(t, e, e.PKI.Controller())
	if _, err := root.Put(short(t), "/onc/k", "v"); err != nil {
		t.Fatalf("the controller's credentials after a restart: %v", err)
	}

	for listen, want := range map[string]string{
		"http://127.0.0.1:2379": "only https",
		"https://0.0.0.0:2379":  "not a wildcard",
		"https://[::]:2379":     "not a wildcard",
		"https://:2379":         "not a wildcard", // no host: every address
	} {
		if _, err := etcdserver.StartTLS(t.TempDir(), listen); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("StartTLS(%s) = %v, want an error saying %q", listen, err, want)
		}
	}
	if _, err := etcdserver.OpenPKI(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no etcd CA") {
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

// What runs on every node links etcd's client only: the server is the
// controller's (and the lab's).
func TestNodesLinkNoEtcdServer(t *testing.T) {
	for _, p := range testutil.Deps(t, "./cmd/onc-agent", "./cmd/onc", "./cmd/onctl") {
		if p == "github.com/onc-net/onc/datastore/etcdserver" || strings.HasPrefix(p, "go.etcd.io/etcd/server/") {
			t.Fatalf("a node's command imports %s", p) // the first says enough
		}
	}
}
