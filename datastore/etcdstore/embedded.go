package etcdstore

import (
	"fmt"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Embedded is an etcd server running inside this process: the lab's default,
// so that trying ONC needs nothing installed.
type Embedded struct {
	etcd      *embed.Etcd
	closeOnce sync.Once
	// ClientURL is where agents reach it.
	ClientURL string
}

// StartEmbedded starts a single-member etcd with its data in dir, serving
// clients on clientURL (e.g. http://127.0.0.1:2379). The data survives a
// restart with the same dir.
func StartEmbedded(dir, clientURL string) (*Embedded, error) {
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client URL %q: %w", clientURL, err)
	}
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
