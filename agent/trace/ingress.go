package trace

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/policy"
)

// Ingress is this node's own answer to another node's trace (agent/peer
// has checked that the asker speaks for the source): the ingress hop of a
// pod of this node as its enforcer compiled it — what a trace from this
// node's own pods reports — how this node delivers the packet from the
// overlay and, with a source port and a time, this node's flow records of
// it since then.
func Ingress(st State, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
	var r request
	var err error
	if r.proto, r.port, err = parseL4(req.Protocol, req.Port); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	src, err := netip.ParseAddr(req.Source)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "source %q: %v", req.Source, err)
	}
	dst, err := netip.ParseAddr(req.Destination)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "destination %q: %v", req.Destination, err)
	}
	if req.SourcePort > 65535 {
		return nil, status.Errorf(codes.InvalidArgument, "source port %d: must be 0-65535", req.SourcePort)
	}
	src, dst = src.Unmap(), dst.Unmap()
	t := &tracer{State: st, rules: st.Rules(), request: r}
	p := t.localPod(dst)
	if p == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "destination %s is no pod of node %s", dst, st.Node)
	}
	resp := &apiv1.TraceIngressResponse{Node: st.Node,
		Ingress:    t.judge(StepIngress, st.Node, BasisEnforced, p.Ingress, p.AuditIngress, src, r.port),
		Forwarding: t.delivery(src, dst, p)}
	if req.SourcePort != 0 && req.RecordsSinceUnixNano > 0 {
		// A probe lasts a second: a peer gets no older records.
		since := time.Unix(0, req.RecordsSinceUnixNano)
		if oldest := time.Now().Add(-maxRecordsAge); since.Before(oldest) {
			since = oldest
		}
		resp.Records = t.recordsOf(since, netip.AddrPortFrom(src, uint16(req.SourcePort)))
	}
	return resp, nil
}

// maxRecordsAge bounds how far back a peer's question about a probe
// looks: a probe's records are a few seconds old at most.
const maxRecordsAge = time.Minute

// delivery is how this node's kernel forwards a packet from src, out of
// the overlay, to its pod p at dst.
func (t *tracer) delivery(src, dst netip.Addr, p *policy.Pod) *apiv1.TraceHop {
	hop := &apiv1.TraceHop{Node: t.Node, Step: StepForwarding, Rule: -1, Basis: BasisEnforced}
	f, err := t.Lookup(overlay.DeviceName, src, dst)
	switch {
	case err != nil:
		hop.Verdict, hop.Detail = "broken", err.Error()
	case f.Dev != p.Iface:
		hop.Verdict = "broken"
		hop.Detail = fmt.Sprintf("from the overlay (%s), the kernel routes %s to %s, not to %s's veth %s", overlay.DeviceName, dst, f.Dev, p.Key, p.Iface)
	default:
		hop.Verdict = "delivered"
		hop.Detail = fmt.Sprintf("from the overlay (%s) through the node's stack to %s's veth %s", overlay.DeviceName, p.Key, p.Iface)
	}
	return hop
}

// recordsOf are this node's flow records since a time of packets of the
// traced protocol from the address and port from.
func (t *tracer) recordsOf(since time.Time, from netip.AddrPort) []*apiv1.FlowRecord {
	var out []*apiv1.FlowRecord
	for _, r := range t.Records(since, from) {
		if strings.EqualFold(r.Protocol, t.proto.String()) {
			out = append(out, r)
		}
	}
	return out
}
