package etcdserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/atomicfile"
)

// The embedded etcd's PKI: one directory with the CA, the server's
// certificate and the controller's client certificate. Client certificates
// name etcd users in their common name.
const (
	caCert, caKey                 = "ca.crt", "ca.key"
	serverCert, serverKey         = "server.crt", "server.key"
	controllerCert, controllerKey = "controller.crt", "controller.key"
	// A node's files, as node-cert writes them for its agent.
	nodeCert, nodeKey = "client.crt", "client.key"

	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 5 * 365 * 24 * time.Hour
	// renewBefore: the controller reissues its own certificates this long
	// before they expire.
	renewBefore = 30 * 24 * time.Hour
)

// PKI is the embedded etcd's certificate authority and what it signed.
type PKI struct {
	Dir   string
	ca    *x509.Certificate
	caKey crypto.Signer
}

// PKIDir is where the PKI of an embedded etcd with its data in dataDir
// lives: beside the data, so the two are kept, moved and wiped together.
func PKIDir(dataDir string) string { return filepath.Join(dataDir, "pki") }

// OpenPKI loads the CA in dir, as the controller made it.
func OpenPKI(dir string) (*PKI, error) {
	cert, key, err := loadPair(filepath.Join(dir, caCert), filepath.Join(dir, caKey))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no etcd CA in %s: the controller makes it when it first starts its embedded etcd (its --embedded-etcd-dir)", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("etcd CA in %s: %w", dir, err)
	}
	return &PKI{Dir: dir, ca: cert, caKey: key}, nil
}

// EnsurePKI makes the PKI in dir on first use and keeps it afterwards: the
// CA once, the controller's certificate once and again near its expiry,
// the server's certificate also whenever it does not name all of hosts.
func EnsurePKI(dir string, hosts []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p, err := OpenPKI(dir)
	if err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, caCert)); !errors.Is(statErr, os.ErrNotExist) {
			return nil, err // there is a CA, and it is broken: never replace it silently
		}
		if p, err = newCA(dir); err != nil {
			return nil, err
		}
	}
	if !p.valid(controllerCert, controllerKey, nil) {
		if err := p.issue(controllerCert, controllerKey, dir, clientTemplate(etcdstore.RootUser)); err != nil {
			return nil, err
		}
	}
	if !p.valid(serverCert, serverKey, hosts) {
		if err := p.issue(serverCert, serverKey, dir, serverTemplate(hosts)); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// valid: the pair in p's directory was signed by p's CA, is not near its
// expiry and names every one of hosts.
func (p *PKI) valid(certName, keyName string, hosts []string) bool {
	cert, _, err := loadPair(p.path(certName), p.path(keyName))
	if err != nil || cert.CheckSignatureFrom(p.ca) != nil || time.Until(cert.NotAfter) < renewBefore {
		return false
	}
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func (p *PKI) path(name string) string { return filepath.Join(p.Dir, name) }

// Controller is the controller's credentials: etcd's root user.
func (p *PKI) Controller() etcdstore.TLSFiles { return ControllerFiles(p.Dir) }

// ControllerFiles are the controller's credentials in the PKI in dir.
func ControllerFiles(dir string) etcdstore.TLSFiles {
	return etcdstore.TLSFiles{CAFile: filepath.Join(dir, caCert), CertFile: filepath.Join(dir, controllerCert), KeyFile: filepath.Join(dir, controllerKey)}
}

// NodeFiles are the credentials IssueNode writes into dir.
func NodeFiles(dir string) etcdstore.TLSFiles {
	return etcdstore.TLSFiles{CAFile: filepath.Join(dir, caCert), CertFile: filepath.Join(dir, nodeCert), KeyFile: filepath.Join(dir, nodeKey)}
}

// IssueNode writes node's agent credentials into dir: ca.crt, client.crt
// (etcd user etcdstore.NodeUser(node)) and client.key. It does not make the
// user (etcdstore.Store.AuthorizeNode does).
func (p *PKI) IssueNode(node, dir string) (etcdstore.TLSFiles, error) {
	if err := etcdstore.ValidNodeName(node); err != nil {
		return etcdstore.TLSFiles{}, err
	}
	caPEM, err := os.ReadFile(p.path(caCert))
	if err != nil {
		return etcdstore.TLSFiles{}, err
	}
	f := NodeFiles(dir)
	if err := atomicfile.Write(f.CAFile, caPEM, 0o644); err != nil {
		return etcdstore.TLSFiles{}, err
	}
	if err := p.issue(nodeCert, nodeKey, dir, clientTemplate(etcdstore.NodeUser(node))); err != nil {
		return etcdstore.TLSFiles{}, err
	}
	return f, nil
}

func newCA(dir string) (*PKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := template(pkix.Name{CommonName: "onc-etcd-ca"}, caValidity)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, ca: ca, caKey: key}
	// The key first: a certificate without its key is read as no CA.
	return p, writePair(filepath.Join(dir, caCert), filepath.Join(dir, caKey), der, key)
}

// issue signs tmpl with a new key and writes the pair into dir.
func (p *PKI) issue(certName, keyName, dir string, tmpl *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.caKey)
	if err != nil {
		return err
	}
	return writePair(filepath.Join(dir, certName), filepath.Join(dir, keyName), der, key)
}

func template(subject pkix.Name, validity time.Duration) *x509.Certificate {
	serial := make([]byte, 16)
	_, _ = rand.Read(serial) // never fails (crypto/rand)
	now := time.Now()
	return &x509.Certificate{SerialNumber: new(big.Int).SetBytes(serial), Subject: subject,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity), // an hour of clock skew
		KeyUsage: x509.KeyUsageDigitalSignature}
}

// clientTemplate is a client certificate for etcd user user.
func clientTemplate(user string) *x509.Certificate {
	t := template(pkix.Name{CommonName: user}, certValidity)
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return t
}

// serverTemplate is the server's certificate for hosts (IPs or names).
// Its common name is no etcd user.
func serverTemplate(hosts []string) *x509.Certificate {
	t := template(pkix.Name{CommonName: "onc-etcd-server"}, certValidity)
	t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			t.IPAddresses = append(t.IPAddresses, ip)
		} else {
			t.DNSNames = append(t.DNSNames, h)
		}
	}
	return t
}

// writePair writes the key (0600) and then the certificate.
func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}), 0o600); err != nil {
		return err
	}
	return atomicfile.Write(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func loadPair(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not a signing key", keyPath)
	}
	return cert, key, nil
}
