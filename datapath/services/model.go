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

// Service is one ClusterIP:port/proto as the socket programs balance it.
type Service struct {
	Name     string     // namespace/name:port-name (port-name empty for an unnamed port)
	VIP      netip.Addr // the ClusterIP
	Port     uint16
	Proto    Proto
	Affinity time.Duration // sessionAffinity ClientIP timeout; 0 = none
	// Backends receive new connections, chosen uniformly. None: connect()
	// and sendmsg() to the Service fail at once with ECONNREFUSED.
	Backends []Backend
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

// Key identifies a Service in the socket programs' service map.
type Key struct {
	VIP   netip.Addr
	Port  uint16
	Proto Proto
}

func (s Service) Key() Key { return Key{s.VIP, s.Port, s.Proto} }

func (k Key) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.VIP, k.Port), k.Proto)
}

// Compare orders keys by address, port, then protocol.
func (k Key) Compare(o Key) int {
	if c := k.VIP.Compare(o.VIP); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(k.Proto, o.Proto)
}

// SortServices orders services by key and each one's backends by address,
// the order onctl shows and tests compare.
func SortServices(svcs []Service) {
	slices.SortFunc(svcs, func(a, b Service) int { return a.Key().Compare(b.Key()) })
	for _, s := range svcs {
		slices.SortFunc(s.Backends, func(a, b Backend) int { return a.Addr.Compare(b.Addr) })
	}
}
