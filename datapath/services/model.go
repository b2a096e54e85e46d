package services

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/onc-net/onc/datapath/l4"
)

// Proto is a Service port's transport; the socket programs balance TCP and
// UDP (SCTP stays with kube-proxy).
type Proto = l4.Proto

const (
	TCP = l4.TCP
	UDP = l4.UDP
)

// Frontend is the kind of address a Service is reached by.
type Frontend uint8

const (
	ClusterIP    Frontend = iota // spec.clusterIPs
	NodePort                     // a node address and spec.ports[].nodePort
	ExternalIP                   // spec.externalIPs
	LoadBalancer                 // status.loadBalancer.ingress[].ip
	HostPort                     // a pod's hostPort (CNI portMappings)
)

var frontendNames = [...]string{"ClusterIP", "NodePort", "ExternalIP", "LoadBalancer", "HostPort"}

func (f Frontend) String() string {
	if int(f) < len(frontendNames) {
		return frontendNames[f]
	}
	return fmt.Sprintf("Frontend(%d)", uint8(f))
}

// Scope is who a table entry serves: sockets of this node's host and pods,
// translated at connect() and sendmsg(), or packets from outside the
// cluster, translated on the uplink. A frontend usually has one entry of
// each (a ClusterIP only the socket one), as the two may pick from
// different backends (externalTrafficPolicy applies to the uplink only).
type Scope uint8

const (
	Socket Scope = iota // LB_SCOPE_SOCKET
	Uplink              // LB_SCOPE_UPLINK
)

func (s Scope) String() string {
	if s == Uplink {
		return "uplink"
	}
	return "socket"
}

// Service is one frontend address:port/proto of a Service, as the socket
// or the uplink programs balance it.
type Service struct {
	Name     string // namespace/name:port-name (port-name empty for an unnamed port)
	Frontend Frontend
	Scope    Scope
	VIP      netip.Addr // the frontend's address
	Port     uint16
	Proto    Proto
	Affinity time.Duration // sessionAffinity ClientIP timeout; 0 = none
	// Backends receive new connections, chosen uniformly. None: connect()
	// and sendmsg() to the Service fail at once with ECONNREFUSED, and
	// packets from outside are refused (TCP RST, ICMP port unreachable).
	Backends []Backend
	// DropWhenEmpty drops packets from outside instead of refusing them
	// when there are no backends: externalTrafficPolicy Local on a node
	// without local endpoints, which a load balancer's health check
	// (healthCheckNodePort) steers away from.
	DropWhenEmpty bool
	// KeepClient (externalTrafficPolicy Local, uplink scope): the backend
	// sees the client's address; otherwise a backend on another node sees
	// this node's.
	KeepClient bool
	// DSR (uplink scope, without KeepClient): a backend pod on another node
	// gets the client's packets with the client's address, from this node
	// directly over the overlay, and answers the client itself from the
	// frontend's address (direct server return); otherwise it sees this
	// node's address and answers through it. In either family; an IPv6
	// frontend in ::/32 (reserved) is served as without.
	DSR bool
	// SourceRanges (loadBalancerSourceRanges, uplink scope): the clients
	// allowed, each of the frontend's family; empty allows all.
	SourceRanges []netip.Prefix
}

// Backend is an endpoint a Service's connections may be sent to.
type Backend struct {
	Addr netip.AddrPort
	Pod  string // namespace/name of the endpoint's targetRef, "" if none
	Node string // the endpoint's nodeName, "" if unknown
	// Ready is false for a serving, terminating endpoint, used only
	// because the Service has no ready one (as kube-proxy does).
	Ready bool
}

// Key identifies a Service in the programs' service map.
type Key struct {
	VIP   netip.Addr
	Port  uint16
	Proto Proto
	Scope Scope
}

func (s Service) Key() Key { return Key{s.VIP, s.Port, s.Proto, s.Scope} }

func (k Key) String() string {
	s := fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.VIP, k.Port), k.Proto)
	if k.Scope != Socket {
		s += " (" + k.Scope.String() + ")"
	}
	return s
}

// Compare orders keys by address, port, protocol, then scope.
func (k Key) Compare(o Key) int {
	if c := k.VIP.Compare(o.VIP); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Proto, o.Proto); c != 0 {
		return c
	}
	return cmp.Compare(k.Scope, o.Scope)
}

// SortServices orders services by key and each one's backends by address,
// the order onctl shows and tests compare.
func SortServices(svcs []Service) {
	slices.SortFunc(svcs, func(a, b Service) int { return a.Key().Compare(b.Key()) })
	for _, s := range svcs {
		slices.SortFunc(s.Backends, func(a, b Backend) int { return a.Addr.Compare(b.Addr) })
	}
}
