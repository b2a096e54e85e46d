package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// run runs remove-node with args and returns its exit code and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	capture := func(f **os.File) func() string {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		old := *f
		*f = w
		var buf bytes.Buffer
		done := make(chan struct{})
		go func() { _, _ = io.Copy(&buf, r); close(done) }()
		return func() string { *f = old; w.Close(); <-done; r.Close(); return buf.String() }
	}
	out, errOut := capture(&os.Stdout), capture(&os.Stderr)
	code = removeNode(args)
	return code, out(), errOut()
}

// --even-if-alive needs the embedded etcd's root credentials: elsewhere it
// is refused before anything is dialled.
func TestRemoveNodeEvenIfAliveOnlyOnTheEmbeddedEtcd(t *testing.T) {
	for want, args := range map[string][]string{
		"--even-if-alive is only for the embedded etcd": {"n", "--even-if-alive", "--etcd-endpoints", "https://192.0.2.1:2379"},
		"kubectl delete node n":                         {"n", "--even-if-alive", "--datastore", "kubernetes"},
	} {
		if code, _, stderr := run(t, args...); code != 2 || !strings.Contains(stderr, want) {
			t.Errorf("remove-node %q: exit %d, %q; want 2 and %q", args, code, stderr, want)
		}
	}
}

// On the embedded etcd, a node whose lease another node keeps alive is
// refused with a pointer to --even-if-alive, and removed with it; the
// output says what was revoked.
func TestRemoveNodeEvenIfAliveCommand(t *testing.T) {
	dir := t.TempDir()
	e, err := etcdserver.StartTLS(dir, fmt.Sprintf("https://127.0.0.1:%d", testutil.FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx := context.Background()
	ctl := etcdtest.Store(t, e, e.PKI.Controller())
	client := func(name string) *clientv3.Client {
		return etcdtest.Client(t, e, etcdtest.Node(t, e, name))
	}
	if err := ctl.RegisterNode(ctx, datastore.NodeSpec{Name: "kept", IP: netip.MustParseAddr("192.0.2.1"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	cidr := netip.MustParsePrefix("10.244.1.0/24")
	if _, err := datastore.ClaimCIDR(ctx, ctl, "kept", cidr); err != nil {
		t.Fatal(err)
	}
	kept, keeper := client("kept"), client("keeper")
	lease, err := kept.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kept.Put(ctx, "/onc/alive/kept", "1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := keeper.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("another node renews kept's lease: %v", err)
	}

	args := []string{"kept", "--embedded-etcd-dir", dir, "--embedded-etcd-listen", e.ClientURL, "--timeout", (10 * time.Second).String()}
	code, _, stderr := run(t, args...)
	if code != 1 || !strings.Contains(stderr, "--even-if-alive") {
		t.Fatalf("remove-node of a node kept alive: exit %d, %q; want 1 and a pointer to --even-if-alive", code, stderr)
	}
	code, stdout, stderr := run(t, append(args, "--even-if-alive")...)
	if code != 0 || !strings.Contains(stdout, "etcd user and role node:kept deleted; liveness ended (its lease revoked)") || !strings.Contains(stdout, "pod CIDR "+cidr.String()+" released") {
		t.Fatalf("remove-node --even-if-alive: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if l, _ := ctl.Liveness(ctx); l["kept"] {
		t.Error("kept still looks alive")
	}
	if _, err := keeper.KeepAliveOnce(ctx, lease.ID); err == nil {
		t.Error("kept's lease is still renewed")
	}
}
