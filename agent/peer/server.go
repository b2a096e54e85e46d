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
	"time"

	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datastore"
)

// DefaultPort is the peer API's TCP port on every node (--peer-port).
const DefaultPort = 9969

// A node may ask this many questions a second, and Burst at once: a
// trace asks one per destination pod of another node, and an operator's
// loop of traces (or the e2e truth tables') some 60 a second.
const (
	Rate  = 100
	Burst = 200
)

// Answer answers a question a peer is allowed to ask.
type Answer func(ctx context.Context, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error)

type server struct {
	apiv1.UnimplementedPeerAgentServer
	nodes  *Nodes
	answer Answer
	counts *Counts
	rate   rate.Limit
	burst  int

	mu     sync.Mutex
	limits map[string]*rate.Limiter // by asking node
}

// NewServer is the peer API's gRPC server for an agent of identity id:
// it accepts a client whose key a record of nodes pins, and answers it
// with answer what that node may ask, at most Rate questions a second,
// counting each question in counts.
func NewServer(id Identity, nodes *Nodes, answer Answer, counts *Counts) *grpc.Server {
	return newServer(id, nodes, answer, counts, Rate, Burst)
}

func newServer(id Identity, nodes *Nodes, answer Answer, counts *Counts, r rate.Limit, burst int) *grpc.Server {
	s := &server{nodes: nodes, answer: answer, counts: counts, rate: r, burst: burst, limits: map[string]*rate.Limiter{}}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		// No CA: the pin in a node record is the trust, checked at every
		// handshake (no resumed sessions) and again at every question.
		ClientAuth:             tls.RequireAnyClientCert,
		SessionTicketsDisabled: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := s.asker(raw)
			if err != nil {
				s.counts.note(sideAnswered, status.Error(codes.Unauthenticated, err.Error()))
			}
			return err
		},
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)), grpc.MaxRecvMsgSize(4<<10), grpc.MaxConcurrentStreams(16),
		grpc.ConnectionTimeout(2*time.Second),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 30 * time.Second, MaxConnectionAge: 5 * time.Minute}))
	apiv1.RegisterPeerAgentServer(srv, s)
	return srv
}

// MaxConns bounds the peer API's connections at once: the node's address
// is reachable from its pods, whose handshakes fail but cost until they
// do (at most 2 s each).
const MaxConns = 64

// Listen is the peer API's listener on the node's address.
func Listen(ip netip.Addr, port int) (net.Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	return netutil.LimitListener(l, MaxConns), nil
}

// asker is the node whose record pins the key of the certificate chain
// raw's first certificate.
func (s *server) asker(raw [][]byte) (datastore.Node, error) {
	if len(raw) == 0 {
		return datastore.Node{}, errors.New("no client certificate")
	}
	cert, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return datastore.Node{}, err
	}
	n, ok := s.nodes.Pinning(PinOf(cert))
	if !ok {
		return datastore.Node{}, fmt.Errorf("key %s: no node record (alone) pins it", PinOf(cert))
	}
	return n, nil
}

// caller is the node asking in ctx, by the record that pins its key now.
func (s *server) caller(ctx context.Context) (datastore.Node, error) {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return datastore.Node{}, status.Error(codes.Unauthenticated, "no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return datastore.Node{}, status.Error(codes.Unauthenticated, "no client certificate")
	}
	// The record may have changed since the handshake.
	n, err := s.asker([][]byte{info.State.PeerCertificates[0].Raw})
	if err != nil {
		return datastore.Node{}, status.Error(codes.Unauthenticated, err.Error())
	}
	return n, nil
}

func (s *server) allow(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limits[node]
	if l == nil {
		l = rate.NewLimiter(s.rate, s.burst)
		s.limits[node] = l
	}
	return l.Allow()
}

func (s *server) TraceIngress(ctx context.Context, req *apiv1.TraceIngressRequest) (resp *apiv1.TraceIngressResponse, err error) {
	defer func() { s.counts.note(sideAnswered, err) }()
	asker, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if !s.allow(asker.Name) {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s: more than %d questions a second", asker.Name, Rate)
	}
	src, err := netip.ParseAddr(req.Source)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "source %q: %v", req.Source, err)
	}
	if !s.nodes.SpeaksFor(asker, src) {
		return nil, status.Errorf(codes.PermissionDenied, "node %s asks about a packet from %s, which is neither its address (%s) nor in its pod CIDRs %v: a node asks only about its own pods' packets",
			asker.Name, src, asker.IP, asker.PodCIDRs)
	}
	return s.answer(ctx, req)
}
