// Package l4 names the transport protocols ONC's pieces speak of, by their
// IP protocol numbers, as the kernel and the eBPF programs hold them.
package l4

import (
	"fmt"
	"strings"
)

// Proto is an IP protocol number.
type Proto uint8

const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ParseProto reads a protocol's name, in any case: TCP, UDP or SCTP.
func ParseProto(s string) (Proto, bool) {
	for _, p := range []Proto{TCP, UDP, SCTP} {
		if strings.EqualFold(s, p.String()) {
			return p, true
		}
	}
	return 0, false
}
