package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	apiv1 "github.com/onc-net/onc/api/v1"
)

// Client asks other nodes' agents, as the agent of identity id.
type Client struct {
	id    Identity
	nodes *Nodes
	port  int // every node's peer port
	dial  func(ctx context.Context, addr string) (net.Conn, error)
}

// NewClient is a client of the peer API on port of the nodes in nodes.
func NewClient(id Identity, nodes *Nodes, port int) *Client {
	return &Client{id: id, nodes: nodes, port: port}
}

// WithDialer makes c connect by dial (the lab's tests dial from a node's
// network namespace).
func (c *Client) WithDialer(dial func(ctx context.Context, addr string) (net.Conn, error)) *Client {
	c.dial = dial
	return c
}

// TraceIngress asks node's agent about a packet to one of its pods. The
// answer is node's own only if its key is the one its record pins; any
// other is refused at the handshake.
func (c *Client) TraceIngress(ctx context.Context, node string, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
	n, ok := c.nodes.Node(node)
	switch {
	case !ok:
		return nil, fmt.Errorf("no record of node %s", node)
	case n.PeerPin == "":
		return nil, fmt.Errorf("node %s's record pins no peer key (its agent predates the peer API, or serves none: peer-port 0)", node)
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
				return fmt.Errorf("node %s answered with key %s; its record pins %s", node, pin, n.PeerPin)
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
	defer conn.Close()
	return apiv1.NewPeerAgentClient(conn).TraceIngress(ctx, req)
}
