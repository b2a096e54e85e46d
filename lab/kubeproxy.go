package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/onc-net/onc/internal/daemon"
)

const kubeProxyHealthzPort = 10256

// kube-proxy's --proxy-mode values the lab runs.
const (
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
)

// StartKubeProxy runs a real kube-proxy (from the lab's KubeBin) in mode
// in n's namespace against the lab's kube-apiserver, as the admin, and
// waits until its health check says it has programmed the rules once.
// extra are more kube-proxy flags. It runs until n.KubeProxy.Stop() or the
// lab goes down.
func (l *Lab) StartKubeProxy(ctx context.Context, n *Node, mode string, extra ...string) error {
	if l.APIServer == nil {
		return fmt.Errorf("kube-proxy needs the lab's Kubernetes mode (datastore %q)", l.Datastore)
	}
	bin, err := l.kubeProxyBin()
	if err != nil {
		return err
	}
	st, err := n.Status(ctx)
	if err != nil {
		return fmt.Errorf("%s: agent status: %w", n.Name, err)
	}
	healthz := netip.AddrPortFrom(n.IP, kubeProxyHealthzPort).String()
	args := append([]string{"--kubeconfig", l.APIServer.Kubeconfig, "--proxy-mode", mode,
		"--hostname-override", n.Name, "--bind-address", n.IP.String(), "--cluster-cidr", st.ClusterCidr,
		"--healthz-bind-address", healthz, "--metrics-bind-address", netip.AddrPortFrom(n.IP, 10249).String(),
		// A node namespace cannot change the machine's conntrack table size.
		"--conntrack-max-per-core", "0"}, extra...)
	p, err := daemon.Start(n.Netns, filepath.Join(n.Dir, "kube-proxy.log"), bin, args...)
	if p.PID > 0 {
		n.KubeProxy = p
	}
	if err == nil {
		err = l.Save()
	}
	if err != nil {
		return err
	}
	if err := waitHealthy(ctx, n.Netns, "http://"+healthz+"/healthz", 60*time.Second); err != nil {
		return fmt.Errorf("kube-proxy on %s: %w; log %s:\n%s", n.Name, err, p.Log, daemon.Tail(p.Log, 20))
	}
	return nil
}

// CleanupKubeProxy stops n's kube-proxy, if it runs, and has kube-proxy
// remove every rule it writes in any mode (kube-proxy --cleanup: its
// iptables chains and its nftables table), as an operator does before
// switching modes or handing Services to ONC.
func (l *Lab) CleanupKubeProxy(ctx context.Context, n *Node) error {
	n.KubeProxy.Stop()
	bin, err := l.kubeProxyBin()
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.Netns, bin, "--cleanup").CombinedOutput()
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup on %s: %w: %s", n.Name, err, out)
	}
	return nil
}

func (l *Lab) kubeProxyBin() (string, error) {
	bin := filepath.Join(l.KubeBin, "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("kube-proxy not found in %q (run make kube-bins): %w", l.KubeBin, err)
	}
	return bin, nil
}

// waitHealthy polls url from inside netns until it answers 200.
func waitHealthy(ctx context.Context, netns, url string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return DialIn(ctx, netns, network, addr)
		}}}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := "no answer"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy after %v: %s", url, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
