package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/onc-net/onc/agent/bypass"
	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/agent/peer"
	"github.com/onc-net/onc/agent/trace"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/overlay"
)

// servePeers serves the peer API on the node's address: the other nodes'
// agents ask it for this node's side of their traces.
func (a *Agent) servePeers() (*grpc.Server, error) {
	l, err := peer.Listen(a.up.NodeIP, a.cfg.PeerPort)
	if err != nil {
		return nil, err
	}
	srv := peer.NewServer(a.peerID, &a.peerNodes, func(_ context.Context, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
		if a.policy == nil {
			return nil, status.Error(codes.FailedPrecondition, "this node enforces no NetworkPolicy (no Kubernetes datastore)")
		}
		return trace.Ingress(a.traceState(), req)
	}, a.peerCounts)
	go func() { _ = srv.Serve(l) }()
	slog.Info("peer API serving", "addr", l.Addr(), "pin", a.peerID.Pin)
	return srv, nil
}

// traceState is what a trace reads of this agent (a.policy is not nil).
func (a *Agent) traceState() trace.State {
	st := trace.State{Node: a.cfg.NodeName, Rules: a.policy.Enforced, Cluster: a.cfg.Policy.Snapshot,
		Bypass: func() *apiv1.BypassState { return bypass.State(a.dp.Bypass) }, Lookup: overlay.Lookup,
		FastPath: func() trace.FastPath {
			if fp := a.dp.Node.FastPath(); fp != nil {
				return fp
			}
			return nil
		}}
	if a.svcs != nil {
		st.Services = a.svcs.List
	}
	st.Netns = func(key string) string {
		for _, att := range a.attachments() {
			if att.K8sNamespace+"/"+att.K8sName == key {
				return att.Netns
			}
		}
		return ""
	}
	st.Records = func(since time.Time, from netip.AddrPort) []*apiv1.FlowRecord {
		if a.flows == nil {
			return nil
		}
		return flows.Records(a.flows, flows.Filter{Since: since, Source: from})
	}
	if a.peerClient != nil {
		st.Peer = a.peerClient.TraceIngress
	}
	return st
}
