// Package peer is the agents' API to each other (docs/security.md, "The
// peer API"): a gRPC server on the node's address that answers another
// node's agent, and its client. Mutual TLS without a CA: each agent has a
// key of its own, publishes its pin (the SHA-256 of its public key) in its
// node record, which only the node itself may write, and accepts a peer's
// key only when a node record pins it, which names the asker.
package peer

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/onc-net/onc/internal/atomicfile"
)

// KeyFile is the name of the agent's peer key in its state directory.
const KeyFile = "peer.key"

// Identity is an agent's key, its self-signed certificate and the pin
// other agents know the key by.
type Identity struct {
	Cert tls.Certificate
	Pin  string
}

// LoadIdentity reads the key in dir, making one (Ed25519, mode 0600) on
// first start, and certifies it itself. The key survives restarts, so its
// pin in the node record stays valid; a reinstalled node makes a new key,
// whose pin replaces the old when the node registers.
func LoadIdentity(dir string) (Identity, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := readKey(path)
	if errors.Is(err, os.ErrNotExist) {
		key, err = newKey(path)
	}
	if err != nil {
		return Identity{}, err
	}
	// The certificate only carries the key: nobody checks its names or
	// dates, only the pin of its key.
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "onc-agent"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return Identity{}, fmt.Errorf("peer certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Identity{}, err
	}
	return Identity{Cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, Pin: PinOf(cert)}, nil
}

func readKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T, not an Ed25519 key", path, k)
	}
	return key, nil
}

func newKey(path string) (ed25519.PrivateKey, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, fmt.Errorf("persist the peer key: %w", err)
	}
	return key, nil
}

// PinOf is the pin of cert's key: the SHA-256 of its
// SubjectPublicKeyInfo, base64.
func PinOf(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}
