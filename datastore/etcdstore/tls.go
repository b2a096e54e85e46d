package etcdstore

import (
	"crypto/tls"
	"fmt"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TLSFiles are a client's TLS credentials: the CA bundle that verifies the
// server, and the client's certificate and key. All empty is plain HTTP.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// Config is the client TLS configuration of f, nil when f is empty.
func (f TLSFiles) Config() (*tls.Config, error) {
	if f == (TLSFiles{}) {
		return nil, nil
	}
	cfg, err := transport.TLSInfo{TrustedCAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd TLS: %w", err)
	}
	return cfg, nil
}
