package apiv1

import (
	"fmt"
	"net"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
)

// Summary is the record on one line without its time, as onctl flows
// prints it and the OTLP export's log body carries it: node, verdict,
// direction, protocol, the ends, why.
func (x *FlowRecord) Summary() string {
	if x.Event == "lost" {
		return fmt.Sprintf("%s LOST %s", x.Node, x.Reason)
	}
	return fmt.Sprintf("%s %s %s %s %s → %s: %s", x.Node, strings.ToUpper(x.Verdict), x.Direction, x.Protocol,
		x.Source.Summary(), x.Destination.Summary(), x.Reason)
}

// Summary is the end as onctl prints it: "namespace/pod (address:port)"
// for a pod, the address otherwise.
func (x *FlowEndpoint) Summary() string {
	addr := x.GetIp()
	if x.GetPort() != 0 {
		addr = net.JoinHostPort(x.Ip, fmt.Sprint(x.Port))
	}
	if x.GetKind() == "pod" {
		return fmt.Sprintf("%s/%s (%s)", x.Namespace, x.Name, addr)
	}
	return addr
}

// JSON is the record as one line of JSON (protojson, with the proto's
// field names), as onctl flows -o json prints it and the JSON-lines export
// writes it.
func (x *FlowRecord) JSON() ([]byte, error) {
	return protojson.MarshalOptions{UseProtoNames: true}.Marshal(x)
}
