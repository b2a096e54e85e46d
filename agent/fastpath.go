package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/controller/datastore"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// openFastPath loads the flow cache (adopting pinned maps and links) and
// attaches it to the uplink. Without it the node runs the slow path only.
func (a *Agent) openFastPath() *fastpath.Datapath {
	fp, err := fastpath.Open(fastpath.Options{PinDir: a.cfg.BPFFS, VNI: a.cfg.VNI, Port: a.cfg.Port,
		Mark: a.cfg.FastPathMark, Mode: fastpath.Mode(a.cfg.AttachMode)})
	if err == nil {
		err = fp.AttachUplink(a.up.Name)
	}
	if err == nil {
		err = fp.Configure(a.cfg.FastPath)
	}
	if err != nil {
		slog.Error("fast path unavailable; this node runs the slow path only", "err", err)
		if fp != nil {
			fp.Close()
		}
		return nil
	}
	slog.Info("fast path loaded", "enabled", a.cfg.FastPath, "attach", fp.Mode(), "pins", a.cfg.BPFFS)
	return fp
}

// fpAddPod lets the fast path deliver to a pod and see its traffic.
func (a *Agent) fpAddPod(att ipam.Attachment) error {
	if a.fp == nil {
		return nil
	}
	host, err := netlink.LinkByName(att.HostIface)
	if err != nil {
		return err
	}
	podMAC, err := net.ParseMAC(att.MAC)
	if err != nil {
		return fmt.Errorf("pod MAC %q: %w", att.MAC, err)
	}
	if err := a.fp.SetLocalPod(att.IP, host.Attrs().Index, podMAC, host.Attrs().HardwareAddr); err != nil {
		return err
	}
	return a.fp.AttachPod(att.HostIface)
}

// fpDelPod forgets a pod and evicts its flows before its address can be reused.
func (a *Agent) fpDelPod(att ipam.Attachment) error {
	if a.fp == nil {
		return nil
	}
	if err := a.fp.DeleteLocalPod(att.IP); err != nil {
		return err
	}
	return a.fp.DetachPod(att.HostIface)
}

// fpSyncPeers feeds the fast path the peers that run it and every node and
// gateway address (host traffic stays on the slow path).
func (a *Agent) fpSyncPeers(nodes []datastore.Node) error {
	if a.fp == nil {
		return nil
	}
	var peers []fastpath.Peer
	var hosts []netip.Addr
	for _, n := range nodes {
		hosts = append(hosts, n.IP)
		if !n.PodCIDR.IsValid() {
			continue
		}
		hosts = append(hosts, overlay.Gateway(n.PodCIDR))
		if n.Name != a.cfg.NodeName && n.FastPath {
			peers = append(peers, fastpath.Peer{PodCIDR: n.PodCIDR, NodeIP: n.IP})
		}
	}
	if err := a.fp.SetHosts(hosts); err != nil {
		return err
	}
	return a.fp.SyncPeers(peers)
}

func (s *agentServer) fastPath() (*fastpath.Datapath, error) {
	s.a.mu.Lock()
	fp := s.a.fp
	s.a.mu.Unlock()
	if fp == nil {
		return nil, status.Error(codes.FailedPrecondition, "the fast path is not loaded on this node (see the agent log)")
	}
	return fp, nil
}

func (s *agentServer) SetFastPath(ctx context.Context, req *apiv1.SetFastPathRequest) (*apiv1.NodeStatus, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	if req.Enabled && !fp.Enabled() {
		// Verdicts learned while off may be stale: start from a clean epoch.
		if err := fp.Flush(); err != nil {
			return nil, status.Errorf(codes.Internal, "flush: %v", err)
		}
	}
	if err := fp.Configure(req.Enabled); err != nil {
		return nil, status.Errorf(codes.Internal, "configure: %v", err)
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

func (s *agentServer) FlushCache(ctx context.Context, _ *apiv1.FlushCacheRequest) (*apiv1.FlushCacheResponse, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	if err := fp.Flush(); err != nil {
		return nil, status.Errorf(codes.Internal, "flush: %v", err)
	}
	return &apiv1.FlushCacheResponse{}, nil
}

func (s *agentServer) GetStats(ctx context.Context, _ *apiv1.GetStatsRequest) (*apiv1.GetStatsResponse, error) {
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
		out.Counters = append(out.Counters, &apiv1.Counter{Program: prog, Name: name, Value: c.Value})
	}
	return &out, nil
}

func ifname(index int) string {
	if l, err := net.InterfaceByIndex(index); err == nil {
		return l.Name
	}
	return fmt.Sprintf("ifindex %d", index)
}

func (s *agentServer) ListCache(ctx context.Context, req *apiv1.ListCacheRequest) (*apiv1.ListCacheResponse, error) {
	fp, err := s.fastPath()
	if err != nil {
		return nil, err
	}
	switch req.Table {
	case "", "egress", "ingress", "filter":
	default:
		return nil, status.Errorf(codes.InvalidArgument, "table %q: must be egress, ingress or filter", req.Table)
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
				Egress: f.Egress, Ingress: f.Ingress, Live: f.Live})
		}
	}
	return &out, nil
}
