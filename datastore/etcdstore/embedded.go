package etcdstore

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Embedded is an etcd server running inside this process: the lab's default,
// so that trying ONC needs nothing installed.
type Embedded struct {
	etcd      *embed.Etcd
	closeOnce sync.Once
	// ClientURL is where agents reach it.
	ClientURL string
	// PKI signed its certificate and its clients' (StartEmbeddedTLS); nil
	// when it serves plain HTTP.
	PKI *PKI
}

// StartEmbedded starts a single-member etcd with its data in dir, serving
// plain HTTP without authentication on clientURL (e.g.
// http://127.0.0.1:2379): for tests, and the lab's stores of other programs
// (Flannel's, kube-apiserver's). ONC's controller uses StartEmbeddedTLS.
// The data survives a restart with the same dir.
func StartEmbedded(dir, clientURL string) (*Embedded, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", clientURL, err)
	}
	return start(dir, cu, nil)
}

// StartEmbeddedTLS starts the controller's etcd: it serves https on
// clientURL (e.g. https://192.0.2.1:2379) and only to clients with a
// certificate of its own CA, and runs etcd's authentication with the
// certificate's common name as the user. On first start it makes its PKI
// (PKIDir(dir)): a CA, a server certificate for clientURL's address and
// loopback, and the controller's client certificate, etcd's root user.
// Agents get theirs from PKI.IssueNode, their users from
// Store.AuthorizeNode.
func StartEmbeddedTLS(dir, clientURL string) (*Embedded, error) {
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
func start(dir string, cu *url.URL, tls *transport.TLSInfo) (*Embedded, error) {
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
	return &Embedded{etcd: e, ClientURL: cu.Scheme + "://" + e.Clients[0].Addr().String()}, nil
}

// Close stops the server; calling it again does nothing.
func (e *Embedded) Close() { e.closeOnce.Do(e.etcd.Close) }
