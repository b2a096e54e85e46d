package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datastore"
)

// Client asks other nodes' agents, as the agent of identity id. It keeps
// one connection per node it asked, while that node's record keeps its
// address and pin: a loop of traces costs one handshake per node, not one
// per question (the server closes a connection idle for 30 s; the next
// question opens it again).
type Client struct {
	id     Identity
	nodes  *Nodes
	port   int // every node's peer port
	counts *Counts
	dial   func(ctx context.Context, addr string) (net.Conn, error)

	mu    sync.Mutex
	conns map[string]*nodeConn // by node name
}

// nodeConn is a connection to a node at the address and with the pin its
// record had when it was made.
type nodeConn struct {
	ip   netip.Addr
	pin  string
	conn *grpc.ClientConn
}

// NewClient is a client of the peer API on port of the nodes in nodes,
// counting its questions in counts.
func NewClient(id Identity, nodes *Nodes, port int, counts *Counts) *Client {
	return &Client{id: id, nodes: nodes, port: port, counts: counts, conns: map[string]*nodeConn{}}
}

// WithDialer makes c connect by dial (the lab's tests dial from a node's
// network namespace).
func (c *Client) WithDialer(dial func(ctx context.Context, addr string) (net.Conn, error)) *Client {
	c.dial = dial
	return c
}

// Close closes c's connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for name, nc := range c.conns {
		errs = append(errs, nc.conn.Close())
		delete(c.conns, name)
	}
	return errors.Join(errs...)
}

// TraceIngress asks node's agent about a packet to one of its pods. The
// answer is node's own only if its key is the one its record pins; any
// other is refused at the handshake.
func (c *Client) TraceIngress(ctx context.Context, node string, req *apiv1.TraceIngressRequest) (resp *apiv1.TraceIngressResponse, err error) {
	defer func() { c.counts.note(sideAsked, err) }()
	n, ok := c.nodes.Node(node)
	switch {
	case !ok:
		return nil, fmt.Errorf("no record of node %s", node)
	case n.PeerPin == "":
		return nil, fmt.Errorf("node %s's record pins no peer key (its agent predates the peer API, or serves none: peer-port 0)", node)
	}
	conn, err := c.conn(n)
	if err != nil {
		return nil, err
	}
	return apiv1.NewPeerAgentClient(conn).TraceIngress(ctx, req)
}

// conn is the connection to n as its record is now: a connection made
// for another address or pin is closed, as are those to nodes whose
// record is gone.
func (c *Client) conn(n datastore.Node) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, nc := range c.conns {
		if rec, ok := c.nodes.Node(name); !ok || rec.IP != nc.ip || rec.PeerPin != nc.pin {
			_ = nc.conn.Close()
			delete(c.conns, name)
		}
	}
	if nc := c.conns[n.Name]; nc != nil {
		return nc.conn, nil
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.id.Cert},
		// No CA and no names: the key must be the one node's record pins,
		// which VerifyPeerCertificate checks.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no server certificate")
			}
			cert, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			if pin := PinOf(cert); pin != n.PeerPin {
				return fmt.Errorf("node %s answered with key %s; its record pins %s", n.Name, pin, n.PeerPin)
			}
			return nil
		},
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if c.dial != nil {
		opts = append(opts, grpc.WithContextDialer(c.dial))
	}
	conn, err := grpc.NewClient(net.JoinHostPort(n.IP.String(), strconv.Itoa(c.port)), opts...)
	if err != nil {
		return nil, err
	}
	c.conns[n.Name] = &nodeConn{ip: n.IP, pin: n.PeerPin, conn: conn}
	return conn, nil
}
