// Package etcdtest starts real etcd servers for tests: the embedded one
// (datastore/etcdserver), plain or as the controller runs it, and Debian's
// as a separate process; and connects to them with a node's or the
// controller's credentials. It is here, not in internal/testutil, so that
// testutil depends on no datastore backend.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore/etcdserver"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Embedded starts an in-process etcd on loopback serving plain HTTP; data
// lives in dir (a new temporary one when empty). It is stopped when the
// test ends.
func Embedded(t testing.TB, dir string) *etcdserver.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	return onFreePort(t, func(port int) (*etcdserver.Server, error) {
		return etcdserver.Start(dir, fmt.Sprintf("http://127.0.0.1:%d", port))
	})
}

// Secure starts an in-process etcd as the controller runs it (mutual TLS,
// authentication; its PKI in a new temporary directory) on loopback. It is
// stopped when the test ends.
func Secure(t testing.TB) *etcdserver.Server {
	t.Helper()
	dir := t.TempDir()
	return onFreePort(t, func(port int) (*etcdserver.Server, error) {
		return etcdserver.StartTLS(dir, fmt.Sprintf("https://127.0.0.1:%d", port))
	})
}

// onFreePort starts a server with start on a port FreePort found free,
// and again on another while a process that ran at the same time (the
// unit tier runs four packages at once) took the port in between; it is
// stopped when the test ends.
func onFreePort(t testing.TB, start func(port int) (*etcdserver.Server, error)) *etcdserver.Server {
	t.Helper()
	for attempt := 1; ; attempt++ {
		e, err := start(testutil.FreePort(t))
		if err == nil {
			t.Cleanup(e.Close)
			return e
		}
		if attempt == 5 || !(errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			t.Fatal(err)
		}
	}
}

// Store opens ONC's store on e with files' credentials; it is closed when
// the test ends.
func Store(t testing.TB, e *etcdserver.Server, files etcdstore.TLSFiles) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}, TLSFiles: files})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Node makes node name's etcd user and role on e, as the controller does
// (onc-controller node-cert), and returns its agent's credentials.
func Node(t testing.TB, e *etcdserver.Server, name string) etcdstore.TLSFiles {
	t.Helper()
	if err := Store(t, e, e.PKI.Controller()).AuthorizeNode(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	files, err := e.PKI.IssueNode(name, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Client is a raw etcd client of e with files' credentials, closed when
// the test ends. It does not wait for the connection: the calls say
// whether it works.
func Client(t testing.TB, e *etcdserver.Server, files etcdstore.TLSFiles) *clientv3.Client {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.ClientURL}, TLS: cfg, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Process starts Debian's etcd (package etcd-server) as a separate process
// on loopback and returns its client URL. It is killed (by PID) when the
// test ends.
func Process(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	testutil.Require(t, err == nil, "etcd binary not installed (apt-get install etcd-server; make prereqs)")
	client := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	log := filepath.Join(t.TempDir(), "etcd.log")
	testutil.Start(t, log, bin, "--name", "onc-test", "--data-dir", t.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "onc-test="+peer, "--log-level", "error")
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", strings.TrimPrefix(client, "http://"))
		if err == nil {
			c.Close()
			return client
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			t.Fatalf("etcd did not listen on %s in 20s:\n%s", client, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
