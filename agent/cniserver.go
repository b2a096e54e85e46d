package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
)

// ONC's own CNI error codes (the spec leaves 100+ to plugins).
const (
	// ErrAttachmentExists: ADD for a (container, interface) that is already
	// attached, or whose interface already exists in the pod.
	ErrAttachmentExists uint32 = 100
	// ErrPoolExhausted: the node's pod CIDR has no free address.
	ErrPoolExhausted uint32 = 101
	// ErrCheckFailed: CHECK found the pod's network not as ADD made it.
	ErrCheckFailed uint32 = 102
	// ErrInternal: anything else; the message says what.
	ErrInternal uint32 = 999
)

// Spec codes used here.
const (
	errUnknownContainer uint32 = 3
	errDecoding         uint32 = 6
	errInvalidConfig    uint32 = 7
	errTryAgainLater    uint32 = 11
	errNotAvailable     uint32 = 50
)

type cniServer struct {
	apiv1.UnimplementedCNIServer
	a *Agent
}

type netConf struct {
	types.NetConf
	ValidAttachments []ipam.Key `json:"cni.dev/valid-attachments,omitempty"`
}

func fail(code uint32, msg string, details ...string) (*apiv1.CNIResponse, error) {
	return &apiv1.CNIResponse{Error: &apiv1.CNIError{Code: code, Msg: msg, Details: strings.Join(details, "; ")}}, nil
}

func parseConf(raw []byte) (*netConf, *apiv1.CNIResponse) {
	var c netConf
	if err := json.Unmarshal(raw, &c); err != nil {
		r, _ := fail(errDecoding, "cannot decode the network configuration", err.Error())
		return nil, r
	}
	if c.CNIVersion == "" {
		r, _ := fail(errInvalidConfig, "network configuration: cniVersion is missing")
		return nil, r
	}
	return &c, nil
}

// k8sArgs picks the pod identity out of CNI_ARGS ("K=V;K=V").
func k8sArgs(args string) (ns, name string) {
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			ns = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return ns, name
}

// ready parses the configuration and returns the pod pool if the agent
// can serve pods; otherwise the response to send.
func (s *cniServer) ready(req *apiv1.CNIRequest) (*netConf, *ipam.Pool, *apiv1.CNIResponse) {
	conf, bad := parseConf(req.Config)
	if bad != nil {
		return nil, nil, bad
	}
	pool, reason := s.a.readyPool()
	if pool == nil || reason != "" {
		r, _ := fail(errTryAgainLater, "onc-agent is not ready", reason)
		return nil, nil, r
	}
	return conf, pool, nil
}

func (s *cniServer) Add(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	conf, pool, bad := s.ready(req)
	if bad != nil {
		return bad, nil
	}
	key := ipam.Key{ContainerID: req.ContainerId, IfName: req.Ifname}
	defer s.a.locks.lock(key)()

	kns, kname := k8sArgs(req.Args)
	att, err := pool.Allocate(ipam.Attachment{Key: key, Netns: req.Netns,
		HostIface: datapath.HostIfaceName(key.ContainerID, key.IfName), K8sNamespace: kns, K8sName: kname})
	switch {
	case errors.Is(err, ipam.ErrExists):
		return fail(ErrAttachmentExists, fmt.Sprintf("container %s already has interface %s on this network", key.ContainerID, key.IfName),
			err.Error(), "DEL it before adding it again")
	case errors.Is(err, ipam.ErrExhausted):
		return fail(ErrPoolExhausted, "no free pod address on this node", err.Error())
	case err != nil:
		return fail(ErrInternal, "cannot record the pod's address", err.Error())
	}
	pod := s.a.podOf(att)
	link, err := s.a.dp.AttachPod(pod)
	if err == nil {
		att.MAC = link.PodMAC.String()
		err = pool.Update(att)
	}
	if err == nil && s.a.policy != nil && kname != "" {
		err = s.a.policy.await(ctx, kns, kname)
	}
	if err != nil {
		// Roll back: nothing of this ADD may stay behind.
		if derr := s.a.dp.DetachPod(pod); derr != nil {
			slog.Error("rollback could not remove the pod's interface", "pod", key, "err", derr)
		}
		if _, _, rerr := pool.Release(key); rerr != nil {
			slog.Error("rollback could not free the pod's address", "pod", key, "ip", att.IP, "err", rerr)
		}
		if s.a.policy != nil {
			s.a.policy.signal() // the rules it may have got go
		}
		switch {
		case errors.Is(err, datapath.ErrNoNetns):
			return fail(errUnknownContainer, "the container's network namespace does not exist", err.Error())
		case errors.Is(err, datapath.ErrIfaceExists):
			return fail(ErrAttachmentExists, "the interface already exists in the container", err.Error())
		case errors.Is(err, errPolicyPending):
			return fail(errTryAgainLater, "the pod's network policy is not enforced yet", err.Error())
		}
		return fail(ErrInternal, "cannot set up the pod's interface", err.Error())
	}
	res, err := s.result(att, link, conf.CNIVersion)
	if err != nil {
		return fail(ErrInternal, "cannot encode the result", err.Error())
	}
	slog.Info("pod added", "pod", key, "ip", att.IP, "k8s", kns+"/"+kname)
	return &apiv1.CNIResponse{Result: res}, nil
}

// result renders the ADD result in the configuration's CNI version.
func (s *cniServer) result(att ipam.Attachment, link datapath.PodLink, cniVersion string) ([]byte, error) {
	gw := s.a.gateway()
	podIdx := 1
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: att.HostIface, Mac: link.HostMAC.String()},
			{Name: att.IfName, Mac: link.PodMAC.String(), Sandbox: att.Netns, Mtu: s.a.podMTU},
		},
		IPs: []*current.IPConfig{{
			Interface: &podIdx,
			Address:   net.IPNet{IP: att.IP.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Gateway:   gw.AsSlice(),
		}},
		Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: gw.AsSlice()}},
	}
	out, err := r.GetAsVersion(cniVersion)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func (s *cniServer) Del(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	if _, bad := parseConf(req.Config); bad != nil {
		return bad, nil
	}
	pool, _ := s.a.readyPool()
	if pool == nil {
		return fail(errTryAgainLater, "onc-agent has not loaded its pod state yet")
	}
	key := ipam.Key{ContainerID: req.ContainerId, IfName: req.Ifname}
	defer s.a.locks.lock(key)()
	if err := s.release(pool, key); err != nil {
		return fail(ErrInternal, "cannot remove the pod's interface", err.Error())
	}
	return &apiv1.CNIResponse{}, nil
}

// release removes an attachment's interface, then its address. Missing
// parts are fine (DEL is idempotent); the address is kept if the interface
// cannot be removed, so a retry finds everything again.
func (s *cniServer) release(pool *ipam.Pool, key ipam.Key) error {
	pod := datapath.Pod{HostIface: datapath.HostIfaceName(key.ContainerID, key.IfName)}
	if att, ok := pool.Get(key); ok {
		pod = s.a.podOf(att)
	}
	if err := s.a.dp.DetachPod(pod); err != nil {
		return err
	}
	att, had, err := pool.Release(key)
	if err != nil {
		return err
	}
	if had {
		slog.Info("pod deleted", "pod", key, "ip", att.IP)
		if s.a.policy != nil {
			s.a.policy.signal() // its rules go
		}
	}
	return nil
}

func (s *cniServer) Check(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	conf, pool, bad := s.ready(req)
	if bad != nil {
		return bad, nil
	}
	key := ipam.Key{ContainerID: req.ContainerId, IfName: req.Ifname}
	defer s.a.locks.lock(key)()
	att, ok := pool.Get(key)
	if !ok {
		return fail(ErrCheckFailed, fmt.Sprintf("container %s has no interface %s on this network", key.ContainerID, key.IfName))
	}
	if err := version.ParsePrevResult(&conf.NetConf); err != nil {
		return fail(errDecoding, "cannot decode prevResult", err.Error())
	}
	if conf.PrevResult == nil {
		return fail(errInvalidConfig, "CHECK needs prevResult in the network configuration")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return fail(errDecoding, "cannot convert prevResult", err.Error())
	}
	found := false
	for _, ip := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap() == att.IP {
			found = true
		}
	}
	if !found {
		return fail(ErrCheckFailed, fmt.Sprintf("prevResult does not hold the pod's address %s", att.IP))
	}
	pod := s.a.podOf(att)
	pod.Netns, pod.IfName = req.Netns, req.Ifname // CHECK asks about the runtime's view
	if err := s.a.dp.CheckPod(pod); err != nil {
		if errors.Is(err, datapath.ErrNoNetns) {
			return fail(errUnknownContainer, "the container's network namespace does not exist", err.Error())
		}
		return fail(ErrCheckFailed, "the pod's network is not as ADD left it", err.Error())
	}
	return &apiv1.CNIResponse{}, nil
}

func (s *cniServer) Status(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	if _, bad := parseConf(req.Config); bad != nil {
		return bad, nil
	}
	if pool, reason := s.a.readyPool(); pool == nil || reason != "" {
		return fail(errNotAvailable, "onc-agent cannot add pods yet", reason)
	}
	return &apiv1.CNIResponse{}, nil
}

// GC removes every attachment the runtime no longer lists as valid. It
// carries on past failures and reports them all.
func (s *cniServer) GC(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	conf, bad := parseConf(req.Config)
	if bad != nil {
		return bad, nil
	}
	pool, _ := s.a.readyPool()
	if pool == nil {
		return fail(errTryAgainLater, "onc-agent has not loaded its pod state yet")
	}
	valid := map[ipam.Key]bool{}
	for _, k := range conf.ValidAttachments {
		valid[k] = true
	}
	var errs []string
	for _, att := range pool.List() {
		if valid[att.Key] {
			continue
		}
		unlock := s.a.locks.lock(att.Key)
		if err := s.release(pool, att.Key); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", att.Key, err))
		} else {
			slog.Info("garbage-collected a stale pod attachment", "pod", att.Key, "ip", att.IP)
		}
		unlock()
	}
	if len(errs) > 0 {
		return fail(ErrInternal, fmt.Sprintf("GC could not remove %d attachments", len(errs)), errs...)
	}
	return &apiv1.CNIResponse{}, nil
}
