package agent

import (
	"context"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/overlay"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// agentServer answers onctl.
type agentServer struct {
	apiv1.UnimplementedAgentServer
	a *Agent
}

func (s *agentServer) GetStatus(ctx context.Context, _ *apiv1.GetStatusRequest) (*apiv1.NodeStatus, error) {
	a := s.a
	a.mu.Lock()
	st := &apiv1.NodeStatus{
		NodeName: a.cfg.NodeName, NodeIp: a.up.NodeIP.String(), Uplink: a.up.Name,
		VxlanDevice: overlay.DeviceName, VtepMac: a.vtepMAC.String(), Vni: uint32(a.cfg.VNI), VxlanPort: uint32(a.cfg.Port),
		PodMtu: uint32(a.podMTU), Ready: a.notReady == "", NotReadyReason: a.notReady,
		Datastore: a.store.Describe(), Version: Version, StartedUnix: a.started.Unix(),
	}
	if a.podCIDR.IsValid() {
		st.PodCidr, st.Gateway, st.ClusterCidr = a.podCIDR.String(), overlay.Gateway(a.podCIDR).String(), a.clusterCIDR.String()
	}
	pool, ovl, fp := a.pool, a.ovl, a.fp
	a.mu.Unlock()
	if fp != nil {
		st.FastPathLoaded, st.FastPath, st.FastPathMode = true, fp.Enabled(), string(fp.Mode())
	}
	if pool != nil {
		st.Pods = uint32(len(pool.List()))
	}
	if ovl != nil {
		st.Peers = uint32(len(ovl.Programmed()))
	}
	return st, nil
}

func (s *agentServer) ListPods(ctx context.Context, _ *apiv1.ListPodsRequest) (*apiv1.ListPodsResponse, error) {
	pool, _ := s.a.readyPool()
	if pool == nil {
		return &apiv1.ListPodsResponse{}, nil
	}
	var out apiv1.ListPodsResponse
	for _, att := range pool.List() {
		pod := &apiv1.Pod{
			ContainerId: att.ContainerID, Ifname: att.IfName, Netns: att.Netns, Ip: att.IP.String(), Mac: att.MAC,
			HostIface: att.HostIface, K8SNamespace: att.K8sNamespace, K8SName: att.K8sName, CreatedUnix: att.Created.Unix(),
		}
		if s.a.cfg.Pods != nil && att.K8sName != "" {
			pod.K8SPhase = s.a.cfg.Pods.Phase(att.K8sNamespace, att.K8sName)
		}
		out.Pods = append(out.Pods, pod)
	}
	return &out, nil
}

func (s *agentServer) ListPeers(ctx context.Context, _ *apiv1.ListPeersRequest) (*apiv1.ListPeersResponse, error) {
	nodes, err := s.a.store.Nodes(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "datastore (%s): %v", s.a.store.Describe(), err)
	}
	s.a.mu.Lock()
	ovl := s.a.ovl
	s.a.mu.Unlock()
	programmed := map[string]overlay.Peer{}
	if ovl != nil {
		programmed = ovl.Programmed()
	}
	var out apiv1.ListPeersResponse
	for _, n := range nodes {
		if n.Name == s.a.cfg.NodeName {
			continue
		}
		p := &apiv1.Peer{NodeName: n.Name, NodeIp: n.IP.String(), VtepMac: n.VTEPMAC.String(), FastPath: n.FastPath, Alive: n.Alive}
		if n.PodCIDR.IsValid() {
			p.PodCidr, p.Gateway = n.PodCIDR.String(), overlay.Gateway(n.PodCIDR).String()
			_, p.Programmed = programmed[n.Name]
		}
		out.Peers = append(out.Peers, p)
	}
	return &out, nil
}
