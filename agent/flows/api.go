package flows

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/l4"
)

// NotRecording is why a node without a store answers no GetFlows.
const NotRecording = "this node records no flows: it runs with --flows-buffer 0"

// Serve answers GetFlows from s (nil: FAILED_PRECONDITION).
func Serve(s *Store, req *apiv1.GetFlowsRequest, stream grpc.ServerStreamingServer[apiv1.FlowRecord]) error {
	if s == nil {
		return status.Error(codes.FailedPrecondition, NotRecording)
	}
	var since time.Time
	if req.SinceUnixNano != 0 {
		since = time.Unix(0, req.SinceUnixNano)
	}
	f, err := ParseFilter(req.Pod, req.Namespace, req.Verdict, req.Event, since)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	send := func(r Record) error { return stream.Send(toAPI(r)) }
	if req.Follow {
		return s.Follow(stream.Context(), f, send)
	}
	for _, r := range s.List(f) {
		if err := send(r); err != nil {
			return err
		}
	}
	return nil
}

func toAPI(r Record) *apiv1.FlowRecord {
	return &apiv1.FlowRecord{TimeUnixNano: r.Time.UnixNano(), Node: r.Node, Event: r.Event, Verdict: r.Verdict, Direction: r.Direction,
		Protocol: l4.Proto(r.Proto).String(), Source: endpointAPI(r.Src), Destination: endpointAPI(r.Dst),
		Reason: r.Reason, Policies: r.Policies, Rule: ruleAPI(r.Rule), Path: r.Path, Translated: endpointAPI(r.Translated), Suppressed: r.Suppressed,
		Audit: r.Audit, Tier: r.Tier, RuleName: r.RuleName}
}

// ruleAPI is the rule's index as the API sends it: absent for none.
func ruleAPI(rule *int) *int32 {
	if rule == nil {
		return nil
	}
	return proto.Int32(int32(*rule))
}

func endpointAPI(e Endpoint) *apiv1.FlowEndpoint {
	if e.Kind == "" {
		return nil // a lost record has no ends, most records no third
	}
	out := &apiv1.FlowEndpoint{Kind: e.Kind, Namespace: e.Namespace, Name: e.Name, Node: e.Node, Port: uint32(e.Addr.Port())}
	if e.Addr.IsValid() { // not for a node's host calling
		out.Ip = e.Addr.Addr().String()
	}
	return out
}

// Records are the stored records f selects, as the API renders them.
func Records(s *Store, f Filter) []*apiv1.FlowRecord {
	var out []*apiv1.FlowRecord
	for _, r := range s.List(f) {
		out = append(out, toAPI(r))
	}
	return out
}
