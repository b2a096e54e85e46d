// Package kubeapiserver runs a real kube-apiserver (built by
// hack/kube-build.sh, `make kube-bins`) as a daemon, optionally inside a
// network namespace: for the lab's Kubernetes datastore (lab) and for
// tests against the Kubernetes API (internal/testutil.KubeAPIServer).
package kubeapiserver

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onc-net/onc/internal/netns"

	"github.com/onc-net/onc/internal/daemon"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Server is a real kube-apiserver (built by hack/kube-build.sh) that the
// lab or a test runs: RBAC on, a static admin token, a self-signed serving
// certificate and a service-account signing key of its own. Its JSON form
// is kept in the lab's state file.
type Server struct {
	daemon.Process
	URL        string `json:"url"`
	Token      string `json:"token"`
	Kubeconfig string `json:"kubeconfig"` // admin kubeconfig, for onc-* and kubectl
	Netns      string `json:"netns,omitempty"`
}

// ServiceCIDR is the Services' range Start gives the server by default;
// ServiceCIDR6 the IPv6 one a dual-stack cluster adds.
const (
	ServiceCIDR  = "10.96.0.0/16"
	ServiceCIDR6 = "fd00:10:96::/112"
)

// Start runs bin in netns ("" = here) on ip:port with its state in
// dir, backed by the etcd at etcdURL, and waits until it is ready. Its
// Services get cluster IPs from serviceCIDRs (one per family, the primary
// first), ServiceCIDR if none.
func Start(ctx context.Context, netns, dir, bin, etcdURL string, ip netip.Addr, port int, serviceCIDRs ...string) (*Server, error) {
	if len(serviceCIDRs) == 0 {
		serviceCIDRs = []string{ServiceCIDR}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	a := &Server{URL: fmt.Sprintf("https://%s", netip.AddrPortFrom(ip, uint16(port))), Token: hex.EncodeToString(tok),
		Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), Netns: netns}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(a.Token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return nil, err
	}
	if err := a.writeKubeconfig(); err != nil {
		return nil, err
	}
	p, err := daemon.Start(netns, filepath.Join(dir, "kube-apiserver.log"), bin,
		"--etcd-servers", etcdURL,
		"--bind-address", ip.String(), "--advertise-address", ip.String(), "--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokens,
		"--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", strings.Join(serviceCIDRs, ","),
		"--enable-priority-and-fairness=false")
	a.Process = p
	if err != nil {
		return nil, err
	}
	if err := a.waitReady(ctx); err != nil {
		a.Stop()
		return nil, err
	}
	return a, nil
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der := x509.MarshalPKCS1PrivateKey(key)
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der}), 0o600)
}

func (a *Server) writeKubeconfig() error { return a.WriteKubeconfig(a.Kubeconfig, "", "") }

// WriteKubeconfig writes a kubeconfig for the admin or, with sa
// ("namespace:name"), for that service account: the admin token
// impersonating it, so its RBAC applies as it would to a pod. With node,
// it also carries the node claim a token bound to a pod on that node has
// (ServiceAccountOnNode).
func (a *Server) WriteKubeconfig(path, sa, node string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: a.URL, InsecureSkipTLSVerify: true}
	user := &clientcmdapi.AuthInfo{Token: a.Token}
	if sa != "" {
		as := serviceAccount(sa, node)
		user.Impersonate, user.ImpersonateGroups, user.ImpersonateUserExtra = as.UserName, as.Groups, as.Extra
	}
	cfg.AuthInfos["user"] = user
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "user"}
	cfg.CurrentContext = "lab"
	return clientcmd.WriteToFile(*cfg, path)
}

// NodeClaim is the user extra a service account token bound to a pod
// carries: the pod's node (ONC's admission policy reads it).
const NodeClaim = "authentication.kubernetes.io/node-name"

func serviceAccount(sa, node string) rest.ImpersonationConfig {
	ns, _, _ := strings.Cut(sa, ":")
	c := rest.ImpersonationConfig{UserName: "system:serviceaccount:" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	if node != "" {
		c.Extra = map[string][]string{NodeClaim: {node}}
	}
	return c
}

// RESTConfig is an admin client config. For a server in a namespace it
// opens its connections inside that namespace, from any thread.
func (a *Server) RESTConfig() *rest.Config {
	c := &rest.Config{Host: a.URL, BearerToken: a.Token, TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS: 200, Burst: 400}
	if a.Netns != "" {
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := inNetns(a.Netns, func() (err error) {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}
	}
	return c
}

// ServiceAccountConfig acts as service account sa ("namespace:name").
func (a *Server) ServiceAccountConfig(sa string) *rest.Config { return a.ServiceAccountOnNode(sa, "") }

// ServiceAccountOnNode acts as service account sa in a pod on node, as the
// pod's bound token does: with the node claim (NodeClaim).
func (a *Server) ServiceAccountOnNode(sa, node string) *rest.Config {
	c := a.RESTConfig()
	c.Impersonate = serviceAccount(sa, node)
	return c
}

func (a *Server) waitReady(ctx context.Context) error {
	cli, err := rest.HTTPClientFor(a.RESTConfig())
	if err != nil {
		return err
	}
	cli.Timeout = 2 * time.Second
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL+"/readyz", nil)
		if resp, err := cli.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !a.Alive() {
			return fmt.Errorf("kube-apiserver exited; log %s:\n%s", a.Log, daemon.Tail(a.Log, 30))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kube-apiserver not ready in 90s; log %s:\n%s", a.Log, daemon.Tail(a.Log, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// inNetns runs fn inside the named namespace (sockets made there stay there).
func inNetns(name string, fn func() error) error {
	ns, err := netns.Open("/run/netns/" + name)
	if err != nil {
		return err
	}
	defer ns.Close()
	return netns.Do(ns, fn)
}
