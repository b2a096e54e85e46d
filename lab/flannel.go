package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/onc-net/onc/internal/daemon"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Flannel beside ONC on the lab's nodes: what a user would run instead,
// for the bench to measure side by side. flanneld (vxlan backend) stores
// its subnet leases in an etcd of its own in the controller's namespace;
// its pods are made through libcni with the flannel CNI plugin, which
// delegates to the reference bridge and host-local plugins. Its VXLAN
// (port 8472, flannel.1) and ONC's (4789) coexist in one node namespace,
// and its pod network is apart from ONC's.
type Flannel struct {
	Dir  string         `json:"dir"` // flanneld and cni/ (make flannel-bins)
	Etcd daemon.Process `json:"etcd"`
}

const (
	flannelNetwork  = "10.245.0.0/16"
	flannelEtcdPort = 2381
	flannelPrefix   = "/flannel/network"
)

func (l *Lab) flannelEtcdURL() string {
	return fmt.Sprintf("http://%s:%d", controllerIP, flannelEtcdPort)
}

func (n *Node) flannelDir() string { return filepath.Join(n.Dir, "flannel") }

// StartFlannel runs Flannel on every node, binaries from dir: its etcd
// with the network config, then flanneld per node, each waited for until
// it wrote its subnet file. Down stops it all.
func (l *Lab) StartFlannel(ctx context.Context, dir string) error {
	if l.Flannel != nil {
		return fmt.Errorf("flannel already runs on lab %s", l.Prefix)
	}
	// Absolute and resolved: a daemon is known by its /proc/PID/exe.
	dir, err := filepath.Abs(dir)
	if err == nil {
		dir, err = filepath.EvalSymlinks(dir)
	}
	if err != nil {
		return fmt.Errorf("flannel binaries: %w", err)
	}
	for _, b := range []string{"flanneld", "cni/flannel", "cni/bridge", "cni/host-local"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("flannel binary %s missing in %s (make flannel-bins): %w", b, dir, err)
		}
	}
	l.Flannel = &Flannel{Dir: dir}
	p, err := daemon.Start(l.ctlNetns(), filepath.Join(l.Dir, "flannel-etcd.log"), filepath.Join(l.BinDir, "onc-lab"),
		"etcd", "--dir", filepath.Join(l.Dir, "flannel-etcd"), "--listen", l.flannelEtcdURL())
	if err != nil {
		return err
	}
	l.Flannel.Etcd = p
	if err := l.Save(); err != nil {
		return err
	}
	if err := l.putFlannelConfig(ctx); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		if err := l.startFlanneld(n); err != nil {
			return err
		}
	}
	for _, n := range l.Nodes {
		if err := waitFile(ctx, filepath.Join(n.flannelDir(), "subnet.env"), n.Flanneld); err != nil {
			return fmt.Errorf("flanneld on %s: %w", n.Name, err)
		}
	}
	return l.Save()
}

// putFlannelConfig writes the network config flanneld reads at start.
func (l *Lab) putFlannelConfig(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: []string{l.flannelEtcdURL()}, DialTimeout: 20 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return l.DialDatastore(ctx, "tcp", addr)
		})},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	conf := fmt.Sprintf(`{"Network":%q,"Backend":{"Type":"vxlan"}}`, flannelNetwork)
	if _, err := c.Put(ctx, flannelPrefix+"/config", conf); err != nil {
		return fmt.Errorf("flannel's network config into its etcd (log %s): %w", l.Flannel.Etcd.Log, err)
	}
	return nil
}

// startFlanneld starts n's flanneld on the node's address (eth0) and writes
// the CNI config its pods are made with: flannel's own plugin chain as
// kube-flannel ships it, with its state kept in the node's directory.
func (l *Lab) startFlanneld(n *Node) error {
	d := n.flannelDir()
	if err := os.MkdirAll(filepath.Join(d, "net.d"), 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "flannel",
  "plugins": [{
    "type": "flannel",
    "subnetFile": %q,
    "dataDir": %q,
    "ipam": {"dataDir": %q},
    "delegate": {"hairpinMode": true, "isDefaultGateway": true}
  }]
}
`, filepath.Join(d, "subnet.env"), filepath.Join(d, "data"), filepath.Join(d, "ipam"))
	if err := os.WriteFile(filepath.Join(d, "net.d", "10-flannel.conflist"), []byte(conf), 0o644); err != nil {
		return err
	}
	p, err := daemon.Start(n.Netns, filepath.Join(d, "flanneld.log"), filepath.Join(l.Flannel.Dir, "flanneld"),
		"-etcd-endpoints="+l.flannelEtcdURL(), "-etcd-prefix="+flannelPrefix, "-iface=eth0", "-ip-masq",
		"-subnet-file="+filepath.Join(d, "subnet.env"))
	if err != nil {
		return err
	}
	n.Flanneld = p
	return l.Save()
}

// waitFile waits up to 30 s for path to exist while p runs.
func waitFile(ctx context.Context, path string, p daemon.Process) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("exited before writing %s; log %s:\n%s", path, p.Log, daemon.Tail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %s after 30s; log %s:\n%s", path, p.Log, daemon.Tail(p.Log, 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// AddFlannelPod creates a pod namespace on n attached by Flannel's CNI
// chain (StartFlannel first). Its namespace is <node>-f<N>.
func (l *Lab) AddFlannelPod(ctx context.Context, n *Node) (*Pod, error) {
	if l.Flannel == nil {
		return nil, fmt.Errorf("flannel is not running on lab %s", l.Prefix)
	}
	l.mu.Lock()
	seq := len(n.FlannelPods) + 1
	l.mu.Unlock()
	p := &Pod{Name: fmt.Sprintf("f%d", seq), Node: n.Name, ContainerID: newContainerID(), Netns: fmt.Sprintf("%s-f%d", n.Name, seq)}
	// lo up: a runtime does that apart from the pod network (containerd
	// with the loopback plugin).
	if err := run([][]string{{"ip", "netns", "add", p.Netns}, {"ip", "-n", p.Netns, "link", "set", "lo", "up"}}); err != nil {
		_ = delNetns(p.Netns)
		return nil, err
	}
	list, err := libcni.ConfListFromFile(filepath.Join(n.flannelDir(), "net.d", "10-flannel.conflist"))
	if err != nil {
		_ = delNetns(p.Netns)
		return nil, err
	}
	cfg := libcni.NewCNIConfigWithCacheDir([]string{filepath.Join(l.Flannel.Dir, "cni")}, filepath.Join(n.flannelDir(), "cni-cache"), nil)
	// The plugins create cni0 and their routes in the namespace of the
	// thread that runs them, the node's, as a runtime on the node would.
	err = InNetns(n.Netns, func() error {
		ips, err := cniAttach(ctx, cfg, list, p.RuntimeConf())
		if err == nil {
			p.setAddrs(ips)
		}
		return err
	})
	if err != nil {
		_ = delNetns(p.Netns)
		return nil, fmt.Errorf("flannel CNI ADD for %s: %w", p.Netns, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n.FlannelPods = append(n.FlannelPods, p)
	return p, l.save()
}
