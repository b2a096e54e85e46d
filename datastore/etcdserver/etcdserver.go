// Package etcdserver is the etcd ONC embeds: a single-member server in the
// calling process, and the PKI that makes the controller's answer only the
// cluster (a CA, the server's and the controller's certificates, each
// node's agent's; etcd's authentication on). It is the etcd datastore's
// server half; datastore/etcdstore is the client half, the only one an
// agent links, so onc-agent carries no etcd server. It sits beside
// etcdstore rather than under controller/ because it is etcd's, not the
// controller's: the lab serves the stores of its kube-apiserver and of
// Flannel with it, and tests start it.
package etcdserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/onc-net/onc/datastore/etcdstore"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is an etcd server running inside this process: the controller's
// store, and the lab's default, so that trying ONC needs nothing installed.
type Server struct {
	etcd      *embed.Etcd
	closeOnce sync.Once
	// ClientURL is where agents reach it.
	ClientURL string
	// PKI signed its certificate and its clients' (StartTLS); nil
	// when it serves plain HTTP.
	PKI *PKI
}

// Start starts a single-member etcd with its data in dir, serving
// plain HTTP without authentication on clientURL (e.g.
// http://127.0.0.1:2379): for tests, and the lab's stores of other programs
// (Flannel's, kube-apiserver's). ONC's controller uses StartTLS.
// The data survives a restart with the same dir.
func Start(dir, clientURL string) (*Server, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", clientURL, err)
	}
	return start(dir, cu, nil)
}

// StartTLS starts the controller's etcd: it serves https on
// clientURL (e.g. https://192.0.2.1:2379) and only to clients with a
// certificate of its own CA, and runs etcd's authentication with the
// certificate's common name as the user. On first start it makes its PKI
// (PKIDir(dir)): a CA, a server certificate for clientURL's address and
// loopback, and the controller's client certificate, etcd's root user.
// Agents get theirs from PKI.IssueNode, their users from
// etcdstore.Store.AuthorizeNode.
func StartTLS(dir, clientURL string) (*Server, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", clientURL, err)
	}
	if cu.Scheme != "https" {
		return nil, fmt.Errorf("embedded etcd client URL %q: it serves only https (mutual TLS), e.g. https://%s", clientURL, cu.Host)
	}
	host := cu.Hostname()
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("embedded etcd client URL %q: name the address agents reach it on, not a wildcard: its certificate names it", clientURL)
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if !slices.Contains(hosts, host) {
		hosts = append(hosts, host)
	}
	pki, err := EnsurePKI(PKIDir(dir), hosts)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd PKI: %w", err)
	}
	e, err := start(dir, cu, &transport.TLSInfo{CertFile: pki.path(serverCert), KeyFile: pki.path(serverKey),
		TrustedCAFile: pki.path(caCert), ClientCertAuth: true})
	if err != nil {
		return nil, err
	}
	e.PKI = pki
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := enableAuth(ctx, e.ClientURL, pki.Controller()); err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded etcd authentication: %w", err)
	}
	return e, nil
}

// start runs the server; tls, if not nil, is its client side's.
func start(dir string, cu *url.URL, tls *transport.TLSInfo) (*Server, error) {
	// The peer URL is only for members, of which there is one: loopback, port 0 is not allowed.
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "onc"
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	if tls != nil {
		cfg.ClientTLSInfo = *tls
		// The HTTP/JSON gateway would reach the server with the server's
		// certificate, which names no user: nothing would pass it.
		cfg.EnableGRPCGateway = false
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s did not become ready in 30s", dir)
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	return &Server{etcd: e, ClientURL: cu.Scheme + "://" + e.Clients[0].Addr().String()}, nil
}

// Close stops the server; calling it again does nothing.
func (e *Server) Close() { e.closeOnce.Do(e.etcd.Close) }

// enableAuth turns on etcd's authentication with the controller's
// certificate as root, once; again it changes nothing.
func enableAuth(ctx context.Context, endpoint string, files etcdstore.TLSFiles) error {
	tlsCfg, err := files.Config()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	// No password: the only way to be root is the controller's certificate.
	if _, err := cli.UserAddWithOptions(ctx, etcdstore.RootUser, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("add user %s: %w", etcdstore.RootUser, err)
	}
	if _, err := cli.UserGrantRole(ctx, etcdstore.RootUser, "root"); err != nil {
		return fmt.Errorf("grant user %s the root role: %w", etcdstore.RootUser, err)
	}
	_, err = cli.AuthEnable(ctx)
	return err
}
