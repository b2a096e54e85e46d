package agent

import (
	"context"
	"log/slog"
	"net/netip"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/bypass"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// bypassState is the intra-node bypass with its setting, or nil and why
// the node has none (onctl status and bypass).
func (a *Agent) bypassState() (datapath.Bypass, *apiv1.BypassState) {
	bp := a.dp.Bypass()
	if bp == nil {
		return nil, &apiv1.BypassState{Status: a.dp.BypassStatus()}
	}
	c := bp.Config()
	return bp, &apiv1.BypassState{Mode: string(c.Mode), MinSize: c.MinSize, Cgroup: bp.Cgroup()}
}

// podNames names this node's pods (namespace/name) by address, from
// their attachments; attachments without a pod name are left out.
func (a *Agent) podNames() map[netip.Addr]string {
	names := map[netip.Addr]string{}
	pool, _ := a.readyPool()
	if pool == nil {
		return names
	}
	for _, att := range pool.List() {
		if att.K8sName != "" {
			names[att.IP] = att.K8sNamespace + "/" + att.K8sName
		}
	}
	return names
}

func (s *onctlServer) ListBypass(ctx context.Context, _ *apiv1.ListBypassRequest) (*apiv1.ListBypassResponse, error) {
	bp, st := s.a.bypassState()
	resp := &apiv1.ListBypassResponse{State: st}
	if bp == nil {
		return resp, nil
	}
	conns, err := bp.Conns()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the bypass map: %v", err)
	}
	pods := s.a.podNames()
	for _, c := range conns {
		resp.Conns = append(resp.Conns, &apiv1.BypassConn{Client: c.Client.String(), Server: c.Server.String(),
			ClientPod: pods[c.Client.Addr()], ServerPod: pods[c.Server.Addr()], Paired: c.Paired(), AgeSeconds: c.Age.Seconds()})
	}
	stats, err := bp.Stats()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the bypass counters: %v", err)
	}
	resp.Counters = counters("bypass", stats)
	return resp, nil
}

// SetBypass switches the bypass until the agent restarts: the flags are
// the node's setting, this is an operator's experiment.
func (s *onctlServer) SetBypass(ctx context.Context, req *apiv1.SetBypassRequest) (*apiv1.ListBypassResponse, error) {
	cfg, err := bypass.ParseConfig(req.Mode, req.MinSize)
	if err != nil {
		field := "mode"
		if bypass.Mode(req.Mode) == bypass.Size {
			field = "min_size" // the only thing size can lack
		}
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	// The flags may carry a minimum for any mode; a request means it.
	if cfg.Mode != bypass.Size && req.MinSize != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "min_size: %d is only for mode size, not %s", req.MinSize, cfg.Mode)
	}
	bp := s.a.dp.Bypass()
	if bp == nil {
		return nil, status.Error(codes.FailedPrecondition, "the intra-node bypass is unavailable: "+s.a.dp.BypassStatus())
	}
	if err := bp.SetConfig(cfg); err != nil {
		return nil, status.Errorf(codes.Internal, "switch the bypass: %v", err)
	}
	slog.Info("intra-node bypass switched until the agent restarts", "setting", cfg)
	return s.ListBypass(ctx, nil)
}
