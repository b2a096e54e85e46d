// Package bypass is the agent's door to the intra-node bypass: its state
// for onctl status, the connections it carries and its switch (onctl
// bypass), and its housekeeping on every resync.
package bypass

import (
	"log/slog"
	"net/netip"

	"github.com/onc-net/onc/agent/report"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Datapath is what the agent needs of the bypass; *datapath/bypass.Node
// implements it.
type Datapath interface {
	// Controls are the loaded bypass's, nil when it is not loaded; Status
	// then says why.
	Controls() bypass.Controls
	Status() string
	// KeepConntrack keeps bypassed connections' conntrack entries from
	// expiring; called on every resync.
	KeepConntrack() error
}

// State is the bypass's setting, or why the node has none (onctl status
// and bypass).
func State(dp Datapath) *apiv1.BypassState { return state(dp, dp.Controls()) }

func state(dp Datapath, bp bypass.Controls) *apiv1.BypassState {
	if bp == nil {
		return &apiv1.BypassState{Status: dp.Status()}
	}
	c := bp.Config()
	return &apiv1.BypassState{Mode: string(c.Mode), MinSize: c.MinSize, Cgroup: bp.Cgroup()}
}

// List answers onctl bypass: the setting, the connections between this
// node's pods it carries (named by podNames, by address) and its counters.
func List(dp Datapath, podNames map[netip.Addr]string) (*apiv1.ListBypassResponse, error) {
	bp := dp.Controls() // once: the answer is of one moment
	resp := &apiv1.ListBypassResponse{State: state(dp, bp)}
	if bp == nil {
		return resp, nil
	}
	conns, err := bp.Conns()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the bypass map: %v", err)
	}
	for _, c := range conns {
		resp.Conns = append(resp.Conns, &apiv1.BypassConn{Client: c.Client.String(), Server: c.Server.String(),
			ClientPod: podNames[c.Client.Addr()], ServerPod: podNames[c.Server.Addr()], Paired: c.Paired(), AgeSeconds: c.Age.Seconds()})
	}
	stats, err := bp.Stats()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the bypass counters: %v", err)
	}
	resp.Counters = report.Counters("bypass", stats)
	return resp, nil
}

// Set switches the bypass until the agent restarts: the flags are the
// node's setting, this is an operator's experiment.
func Set(dp Datapath, req *apiv1.SetBypassRequest) error {
	cfg, err := bypass.ParseConfig(req.Mode, req.MinSize)
	if err != nil {
		field := "mode"
		if bypass.Mode(req.Mode) == bypass.Size {
			field = "min_size" // the only thing size can lack
		}
		return status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	// The flags may carry a minimum for any mode; a request means it.
	if cfg.Mode != bypass.Size && req.MinSize != 0 {
		return status.Errorf(codes.InvalidArgument, "min_size: %d is only for mode size, not %s", req.MinSize, cfg.Mode)
	}
	bp := dp.Controls()
	if bp == nil {
		return status.Error(codes.FailedPrecondition, "the intra-node bypass is unavailable: "+dp.Status())
	}
	if err := bp.SetConfig(cfg); err != nil {
		return status.Errorf(codes.Internal, "switch the bypass: %v", err)
	}
	slog.Info("intra-node bypass switched until the agent restarts", "setting", cfg)
	return nil
}

// KeepConntrack is the resync's housekeeping; a failure is logged, and
// retried on the next resync (well within conntrack's timeout).
func KeepConntrack(dp Datapath) {
	if err := dp.KeepConntrack(); err != nil {
		slog.Warn("intra-node bypass: refreshing conntrack entries failed; retried on the next resync", "err", err)
	}
}
