package apiv1

import (
	"fmt"
	"net"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
)

// Summary is the record on one line without its time, as onctl flows
// prints it and the OTLP export's log body carries it: node, verdict
// (and what audited policies would have done, "DENIED (audit:
// would-allow)"), then the direction of the policy table's records, else the event and
// the path (the eBPF programs');
// protocol, the ends (and a third: the backend chosen, or the node that
// sent a dropped frame), why, and how many like it went unrecorded.
func (x *FlowRecord) Summary() string {
	if x.Event == "lost" {
		return fmt.Sprintf("%s LOST %s", x.Node, x.Reason)
	}
	how := x.Direction // the policy table's records: of the local pod
	if how == "" {
		how = x.Event + " " + x.Path // the eBPF programs'
	}
	verdict := strings.ToUpper(x.Verdict)
	if x.Audit != "" {
		verdict += " (audit: " + x.Audit + ")"
	}
	line := fmt.Sprintf("%s %s %s %s %s → %s", x.Node, verdict, how, x.Protocol, x.Source.Summary(), x.Destination.Summary())
	if x.Translated != nil {
		via := " ⇒ "
		if x.Event == "drop" {
			via = " from " // the node that sent the frame
		}
		line += via + x.Translated.Summary()
	}
	if x.Reason != "" {
		line += ": " + x.Reason
	}
	if x.Suppressed > 0 {
		line += fmt.Sprintf(" (+%d suppressed)", x.Suppressed)
	}
	return line
}

// Summary is the end as onctl prints it: "namespace/pod (address:port)"
// for a pod, "service namespace/name (...)" and "node name (...)", the
// address otherwise.
func (x *FlowEndpoint) Summary() string {
	addr := x.GetIp()
	if x.GetPort() != 0 {
		addr = net.JoinHostPort(x.Ip, fmt.Sprint(x.Port))
	}
	switch x.GetKind() {
	case "pod":
		return fmt.Sprintf("%s/%s (%s)", x.Namespace, x.Name, addr)
	case "service":
		return fmt.Sprintf("service %s/%s (%s)", x.Namespace, x.Name, addr)
	case "unknown":
		return x.Name // "netns <cookie>": a socket call's namespace the agent does not know
	case "node":
		if x.Ip == "" {
			return "node " + x.Name // a socket call from the node's host
		}
		return fmt.Sprintf("node %s (%s)", x.Name, addr)
	}
	return addr
}

// JSON is the record as one line of JSON (protojson, with the proto's
// field names), as onctl flows -o json prints it and the JSON-lines export
// writes it.
func (x *FlowRecord) JSON() ([]byte, error) {
	return protojson.MarshalOptions{UseProtoNames: true}.Marshal(x)
}
