package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/onc-net/onc/agent/bypass"
	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/agent/policy"
	"github.com/onc-net/onc/agent/services"
	"github.com/onc-net/onc/agent/trace"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/internal/netaddr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// onctlServer answers onctl on agent.sock.
type onctlServer struct {
	apiv1.UnimplementedAgentServer
	a *Agent
}

func (s *onctlServer) GetStatus(ctx context.Context, _ *apiv1.GetStatusRequest) (*apiv1.NodeStatus, error) {
	a := s.a
	a.mu.Lock()
	st := &apiv1.NodeStatus{
		NodeName: a.cfg.NodeName, NodeIp: a.up.NodeIP.String(), Uplink: a.up.Name,
		VxlanDevice: datapath.DeviceName, VtepMac: a.vtepMAC.String(), Vni: uint32(a.cfg.Datapath.VNI), VxlanPort: uint32(a.cfg.Datapath.Port),
		PodMtu: uint32(a.podMTU), Ready: a.notReady == "", NotReadyReason: a.notReady,
		Datastore: a.store.Describe(), Version: Version, StartedUnix: a.started.Unix(), MetricsAddr: a.metrics.address(),
	}
	for i, cidr := range a.podCIDRs {
		st.PodCidrs = append(st.PodCidrs, cidr.String())
		st.Gateways = append(st.Gateways, datapath.Gateway(cidr).String())
		st.ClusterCidrs = append(st.ClusterCidrs, a.clusterCIDRs[i].String())
	}
	if len(a.podCIDRs) > 0 {
		st.PodCidr, st.Gateway, st.ClusterCidr = st.PodCidrs[0], st.Gateways[0], st.ClusterCidrs[0]
	}
	pool := a.pool
	a.mu.Unlock()
	if fp := a.dp.Node.FastPath(); fp != nil {
		st.FastPathLoaded, st.FastPath, st.FastPathMode = true, fp.Enabled(), string(fp.Mode())
		st.FastPathConnectionSetup = fp.ConnSetup().String()
	}
	if pool != nil {
		st.Pods = uint32(len(pool.List()))
	}
	st.Peers = uint32(len(a.dp.Node.ProgrammedPeers()))
	st.PeerKernelWrites = a.dp.Node.KernelWrites()
	st.Policy = "enforced"
	if a.policy == nil {
		st.Policy = policy.NeedsKubernetes
	}
	st.SocketLb = services.NeedsKubernetes
	if a.svcs != nil {
		st.SocketLb = services.Status(a.dp.Services)
	}
	if lb := a.dp.Services.Tables(); lb != nil {
		st.SocketLbCgroup = lb.Cgroup()
	}
	st.KubeProxy = services.KubeProxy(a.dp.Services, services.Proxying{Replace: a.cfg.Datapath.KubeProxyReplacement, DSR: a.cfg.Datapath.DSR})
	st.Bypass = bypass.State(a.dp.Bypass)
	for _, w := range a.watchers() {
		ws := w.Status()
		pw := &apiv1.Watcher{Name: ws.Name, Seen: ws.Seen, Applied: ws.Applied, LastError: ws.LastError}
		if !ws.LastApplied.IsZero() {
			pw.LastAppliedUnix = ws.LastApplied.Unix()
		}
		st.Watchers = append(st.Watchers, pw)
	}
	return st, nil
}

func (s *onctlServer) ListPods(ctx context.Context, _ *apiv1.ListPodsRequest) (*apiv1.ListPodsResponse, error) {
	pool, _ := s.a.readyPool()
	if pool == nil {
		return &apiv1.ListPodsResponse{}, nil
	}
	var out apiv1.ListPodsResponse
	for _, att := range pool.List() {
		pod := &apiv1.Pod{
			ContainerId: att.ContainerID, Ifname: att.IfName, Netns: att.Netns, Ip: netaddr.First(att.IPs), Ips: netaddr.Strings(att.IPs), Mac: att.MAC,
			HostIface: att.HostIface, K8SNamespace: att.K8sNamespace, K8SName: att.K8sName, CreatedUnix: att.Created.Unix(),
		}
		if s.a.cfg.Pods != nil && att.K8sName != "" {
			pod.K8SPhase = s.a.cfg.Pods.Phase(att.K8sNamespace, att.K8sName)
		}
		out.Pods = append(out.Pods, pod)
	}
	return &out, nil
}

func (s *onctlServer) ListPeers(ctx context.Context, _ *apiv1.ListPeersRequest) (*apiv1.ListPeersResponse, error) {
	nodes, err := s.a.store.Nodes(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "datastore (%s): %v", s.a.store.Describe(), err)
	}
	alive, err := s.a.store.Liveness(ctx) // read now: liveness is never watched
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "datastore (%s): liveness: %v", s.a.store.Describe(), err)
	}
	programmed := s.a.dp.Node.ProgrammedPeers()
	var out apiv1.ListPeersResponse
	for _, n := range nodes {
		if n.Name == s.a.cfg.NodeName {
			continue
		}
		p := &apiv1.Peer{NodeName: n.Name, NodeIp: n.IP.String(), VtepMac: n.VTEPMAC.String(), FastPath: n.FastPath, Alive: alive[n.Name]}
		for _, cidr := range nodeBlocks(&n) {
			p.PodCidrs = append(p.PodCidrs, cidr.String())
			p.Gateways = append(p.Gateways, datapath.Gateway(cidr).String())
		}
		if len(p.PodCidrs) > 0 {
			p.PodCidr, p.Gateway, p.Programmed = p.PodCidrs[0], p.Gateways[0], programmed[n.Name]
		}
		out.Peers = append(out.Peers, p)
	}
	return &out, nil
}

func (s *onctlServer) fastPath() (datapath.FastPath, error) {
	fp := s.a.dp.Node.FastPath()
	if fp == nil {
		return nil, status.Error(codes.FailedPrecondition, "the fast path is not loaded on this node (see the agent log)")
	}
	return fp, nil
}

func (s *onctlServer) SetFastPath(ctx context.Context, req *apiv1.SetFastPathRequest) (*apiv1.NodeStatus, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	if err := fp.Switch(req.Enabled); err != nil {
		return nil, status.Errorf(codes.Internal, "switch the fast path: %v", err)
	}
	s.a.mu.Lock()
	s.a.spec.FastPath = req.Enabled
	spec := s.a.spec
	s.a.mu.Unlock()
	if err := s.a.store.RegisterNode(ctx, spec); err != nil {
		return nil, status.Errorf(codes.Unavailable, "publish the fast-path flag: %v", err)
	}
	slog.Info("fast path switched", "enabled", req.Enabled)
	return s.GetStatus(ctx, nil)
}

func (s *onctlServer) FlushCache(ctx context.Context, _ *apiv1.FlushCacheRequest) (*apiv1.FlushCacheResponse, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	if err := fp.Flush(); err != nil {
		return nil, status.Errorf(codes.Internal, "flush: %v", err)
	}
	return &apiv1.FlushCacheResponse{}, nil
}

func (s *onctlServer) GetStats(ctx context.Context, _ *apiv1.GetStatsRequest) (*apiv1.GetStatsResponse, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	st, err := fp.Stats()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read counters: %v", err)
	}
	var out apiv1.GetStatsResponse
	for _, c := range st {
		prog, name, _ := strings.Cut(c.Name, "_")
		out.Counters = append(out.Counters, &apiv1.Counter{Program: prog, Name: name, Value: c.Value, Family: c.Family})
	}
	return &out, nil
}

func ifname(index int) string {
	if l, err := net.InterfaceByIndex(index); err == nil {
		return l.Name
	}
	return fmt.Sprintf("ifindex %d", index)
}

func (s *onctlServer) ListCache(ctx context.Context, req *apiv1.ListCacheRequest) (*apiv1.ListCacheResponse, error) {
	// A bad argument is one whatever the node's state.
	switch req.Table {
	case "", "egress", "ingress", "filter":
	default:
		return nil, status.Errorf(codes.InvalidArgument, "table %q: must be egress, ingress or filter", req.Table)
	}
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	var out apiv1.ListCacheResponse
	if req.Table == "" || req.Table == "egress" {
		dests, err := fp.Dests()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		for _, d := range dests {
			out.Egress = append(out.Egress, &apiv1.EgressEntry{PodIp: d.Pod.String(), NodeIp: d.Node.String()})
		}
		encaps, err := fp.Encaps()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		for _, e := range encaps {
			out.Encap = append(out.Encap, &apiv1.EncapEntry{NodeIp: e.Node.String(), OuterSrcIp: e.OuterSrcIP.String(),
				OuterDstMac: e.OuterDst.String(), OuterSrcMac: e.OuterSrc.String(),
				InnerDstMac: e.InnerDst.String(), InnerSrcMac: e.InnerSrc.String(), Uplink: ifname(e.Ifindex)})
		}
	}
	if req.Table == "" || req.Table == "ingress" {
		locals, err := fp.Locals()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		for _, l := range locals {
			out.Ingress = append(out.Ingress, &apiv1.IngressEntry{PodIp: l.Pod.String(), HostIface: ifname(l.Ifindex),
				PodMac: l.PodMAC.String(), HostMac: l.HostMAC.String()})
		}
	}
	if req.Table == "" || req.Table == "filter" {
		flows, err := fp.Flows()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		for _, f := range flows {
			out.Filter = append(out.Filter, &apiv1.FlowEntry{Proto: f.Proto, Local: f.Local.String(), Remote: f.Remote.String(),
				Egress: f.Egress, Ingress: f.Ingress, Live: f.Live, OpenedBy: f.Opener.String(), Closing: f.Closing})
		}
	}
	return &out, nil
}

func (s *onctlServer) ListPolicy(ctx context.Context, req *apiv1.ListPolicyRequest) (*apiv1.ListPolicyResponse, error) {
	if s.a.policy == nil {
		return nil, status.Error(codes.FailedPrecondition, "network policy "+policy.NeedsKubernetes)
	}
	q, err := flows.ParsePeerQuery(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := s.a.policy.List(req)
	if err != nil || q == nil {
		return resp, err
	}
	// Judged by the rules enforced now, which List has just shown unless
	// a change came in between.
	rs := s.a.policy.Enforced()
	for _, pp := range resp.Pods {
		if p := rs.Pod(pp.Key); p != nil {
			q.Decide(p, pp)
		}
	}
	return resp, nil
}

func (s *onctlServer) ListServices(ctx context.Context, _ *apiv1.ListServicesRequest) (*apiv1.ListServicesResponse, error) {
	if s.a.svcs == nil {
		return nil, status.Error(codes.FailedPrecondition, "socket load balancing: "+services.NeedsKubernetes)
	}
	return s.a.svcs.List()
}

func (s *onctlServer) ListBypass(ctx context.Context, _ *apiv1.ListBypassRequest) (*apiv1.ListBypassResponse, error) {
	return bypass.List(s.a.dp.Bypass, s.a.podNames())
}

func (s *onctlServer) SetBypass(ctx context.Context, req *apiv1.SetBypassRequest) (*apiv1.ListBypassResponse, error) {
	if err := bypass.Set(s.a.dp.Bypass, req); err != nil {
		return nil, err
	}
	return s.ListBypass(ctx, nil)
}

func (s *onctlServer) GetFlows(req *apiv1.GetFlowsRequest, stream grpc.ServerStreamingServer[apiv1.FlowRecord]) error {
	return flows.Serve(s.a.flows, req, stream)
}

func (s *onctlServer) Trace(ctx context.Context, req *apiv1.TraceRequest) (*apiv1.TraceResponse, error) {
	a := s.a
	if a.policy == nil {
		return nil, status.Error(codes.FailedPrecondition, "trace names pods and judges NetworkPolicy: it needs the Kubernetes datastore (--datastore=kubernetes)")
	}
	return trace.Trace(ctx, a.traceState(), req)
}

// podNames names this node's pods (namespace/name) by address, from
// their attachments; attachments without a pod name are left out.
func (a *Agent) podNames() map[netip.Addr]string {
	names := map[netip.Addr]string{}
	for _, att := range a.attachments() {
		if att.K8sName != "" {
			for _, ip := range att.IPs {
				names[ip] = att.K8sNamespace + "/" + att.K8sName
			}
		}
	}
	return names
}
