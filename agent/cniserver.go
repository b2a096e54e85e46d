package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"k8s.io/apimachinery/pkg/util/validation"
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
	errIncompatibleVersion uint32 = 1
	errUnknownContainer    uint32 = 3
	errInvalidEnv          uint32 = 4
	errDecoding            uint32 = 6
	errInvalidConfig       uint32 = 7
	errTryAgainLater       uint32 = 11
	errNotAvailable        uint32 = 50
)

// The CNI verbs, as the spec names them.
const (
	verbAdd    = "ADD"
	verbDel    = "DEL"
	verbCheck  = "CHECK"
	verbStatus = "STATUS"
	verbGC     = "GC"
)

// minVersion is the first cniVersion that has a verb (ADD and DEL: all).
var minVersion = map[string]string{verbCheck: "0.4.0", verbStatus: "1.1.0", verbGC: "1.1.0"}

type cniServer struct {
	apiv1.UnimplementedCNIServer
	a *Agent
}

type netConf struct {
	types.NetConf
	ValidAttachments validAttachments `json:"cni.dev/valid-attachments"`
	RuntimeConfig    struct {
		PortMappings []portMapping `json:"portMappings"`
	} `json:"runtimeConfig"`
}

// portMapping is an entry of the portMappings capability, as runtimes
// send it (the portmap plugin's format).
type portMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP"`
}

// portMappings checks the pod's hostPorts: each a TCP or UDP port pair,
// on one host address of either family, all of one family (0.0.0.0,
// ::) or all of both (none given); a host address of a family the pod has
// no address of serves it nowhere, as portmap. SCTP is refused rather than
// left unserved: the pod would start with a hostPort nobody serves.
func portMappings(in []portMapping) ([]ipam.PortMapping, error) {
	var out []ipam.PortMapping
	for i, m := range in {
		field := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
		if m.HostPort < 1 || m.HostPort > 65535 || m.ContainerPort < 1 || m.ContainerPort > 65535 {
			return nil, fmt.Errorf("%s: hostPort %d and containerPort %d must be 1-65535", field, m.HostPort, m.ContainerPort)
		}
		proto := strings.ToLower(m.Protocol)
		switch proto {
		case "":
			proto = "tcp" // the portmap plugin's default
		case "tcp", "udp":
		default:
			return nil, fmt.Errorf("%s: protocol %q: ONC serves hostPorts over TCP and UDP only", field, m.Protocol)
		}
		pm := ipam.PortMapping{HostPort: uint16(m.HostPort), ContainerPort: uint16(m.ContainerPort), Protocol: proto}
		if m.HostIP != "" {
			// 0.0.0.0 and :: stand for every host address of their family
			// (as portmap reads them); "" for every one of both.
			ip, err := netip.ParseAddr(m.HostIP)
			if err != nil {
				return nil, fmt.Errorf("%s: hostIP %q: %v", field, m.HostIP, err)
			}
			pm.HostIP = ip.Unmap()
		}
		out = append(out, pm)
	}
	return out, nil
}

// validAttachments is GC's cni.dev/valid-attachments. GC needs it given
// (null, as libcni sends for none, is an empty list): without it every
// attachment would count as stale.
type validAttachments struct {
	given bool
	keys  []ipam.Key
}

func (v *validAttachments) UnmarshalJSON(b []byte) error {
	v.given = true
	return json.Unmarshal(b, &v.keys)
}

// request is a CNI request checked for its verb: what the verb reads of
// it is well-formed.
type request struct {
	conf *netConf
	key  ipam.Key
	// The pod CNI_ARGS name (ADD); both empty for none.
	k8sNamespace, k8sName string
	ports                 []ipam.PortMapping // ADD's hostPorts
	prev                  *current.Result    // CHECK's prevResult
}

func failure(code uint32, msg string, details ...string) *apiv1.CNIResponse {
	return &apiv1.CNIResponse{Error: &apiv1.CNIError{Code: code, Msg: msg, Details: strings.Join(details, "; ")}}
}

// fail is failure as a handler returns it.
func fail(code uint32, msg string, details ...string) (*apiv1.CNIResponse, error) {
	return failure(code, msg, details...), nil
}

// parse checks req for verb before anything is looked up or changed, so
// malformed input gets its own CNI error (naming the variable or field)
// whatever the agent's state, and nothing of it is ever half done.
func parse(verb string, req *apiv1.CNIRequest) (request, *apiv1.CNIResponse) {
	conf, bad := parseConf(req.Config)
	if bad != nil {
		return request{}, bad
	}
	r := request{conf: conf, key: ipam.Key{ContainerID: req.ContainerId, IfName: req.Ifname}}
	if since := minVersion[verb]; since != "" {
		if ok, _ := version.GreaterThanOrEqualTo(conf.CNIVersion, since); !ok {
			return request{}, failure(errIncompatibleVersion, fmt.Sprintf("network configuration: cniVersion %s has no %s (it came in %s)", conf.CNIVersion, verb, since))
		}
	}
	switch verb {
	case verbAdd, verbCheck, verbDel:
		if bad := checkAttachment(req, verb != verbDel); bad != nil {
			return request{}, bad
		}
	}
	switch verb {
	case verbAdd:
		var err error
		if r.k8sNamespace, r.k8sName, err = k8sArgs(req.Args); err != nil {
			return request{}, failure(errInvalidEnv, err.Error())
		}
		if r.ports, err = portMappings(conf.RuntimeConfig.PortMappings); err != nil {
			return request{}, failure(errInvalidConfig, "network configuration: "+err.Error())
		}
	case verbCheck:
		if err := version.ParsePrevResult(&conf.NetConf); err != nil {
			return request{}, failure(errDecoding, "network configuration: cannot decode prevResult", err.Error())
		}
		if conf.PrevResult == nil {
			return request{}, failure(errInvalidConfig, "network configuration: CHECK needs prevResult")
		}
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return request{}, failure(errDecoding, "network configuration: cannot convert prevResult", err.Error())
		}
		r.prev = prev
	case verbGC:
		if !conf.ValidAttachments.given {
			return request{}, failure(errInvalidConfig, "network configuration: GC needs cni.dev/valid-attachments (an empty list to remove every attachment)")
		}
		for i, k := range conf.ValidAttachments.keys {
			if k.ContainerID == "" || k.IfName == "" {
				return request{}, failure(errInvalidConfig, fmt.Sprintf("network configuration: cni.dev/valid-attachments[%d] needs containerID and ifname", i))
			}
		}
	}
	return r, nil
}

func parseConf(raw []byte) (*netConf, *apiv1.CNIResponse) {
	var c netConf
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, failure(errDecoding, "cannot decode the network configuration", err.Error())
	}
	if c.CNIVersion == "" {
		return nil, failure(errInvalidConfig, "network configuration: cniVersion is missing")
	}
	// The result is rendered in this version: one it cannot be rendered in
	// must fail before the pod is made.
	if supported := version.All.SupportedVersions(); !slices.Contains(supported, c.CNIVersion) {
		return nil, failure(errIncompatibleVersion, fmt.Sprintf("network configuration: cniVersion %q is not supported", c.CNIVersion),
			"supported: "+strings.Join(supported, ", "))
	}
	return &c, nil
}

// checkAttachment checks the attachment's identity as the spec (and the
// plugin's skel) does; the agent is also reachable without the plugin.
func checkAttachment(req *apiv1.CNIRequest, needNetns bool) *apiv1.CNIResponse {
	if req.ContainerId == "" {
		return failure(errInvalidEnv, "CNI_CONTAINERID is missing")
	}
	if e := utils.ValidateContainerID(req.ContainerId); e != nil {
		return failure(errInvalidEnv, "CNI_CONTAINERID: "+e.Msg, e.Details)
	}
	if e := utils.ValidateInterfaceName(req.Ifname); e != nil {
		return failure(errInvalidEnv, "CNI_IFNAME: "+e.Msg, e.Details)
	}
	// The agent opens the namespace: a relative path would be the agent's.
	if needNetns && !filepath.IsAbs(req.Netns) {
		return failure(errInvalidEnv, fmt.Sprintf("CNI_NETNS %q: need the absolute path of the container's network namespace", req.Netns))
	}
	return nil
}

// k8sArgs picks the pod out of CNI_ARGS ("K=V;K=V"; other keys are the
// runtime's). Its namespace/name keys the pod's policy and names it to
// onctl, so both or neither, and each a valid Kubernetes name: a
// malformed one could alias another pod's, or name a pod that never
// appears, for which ADD would wait on policy in vain.
func k8sArgs(args string) (ns, name string, err error) {
	if args == "" {
		return "", "", nil
	}
	given := map[string]bool{}
	for _, kv := range strings.Split(args, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", "", fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		var check func(string) []string
		switch k {
		case "K8S_POD_NAMESPACE":
			ns, check = v, validation.IsDNS1123Label
		case "K8S_POD_NAME":
			name, check = v, validation.IsDNS1123Subdomain
		default:
			continue
		}
		if given[k] {
			return "", "", fmt.Errorf("CNI_ARGS: %s is given twice", k)
		}
		given[k] = true
		if errs := check(v); len(errs) > 0 {
			return "", "", fmt.Errorf("CNI_ARGS: %s %q: %s", k, v, strings.Join(errs, "; "))
		}
	}
	if given["K8S_POD_NAMESPACE"] != given["K8S_POD_NAME"] {
		return "", "", errors.New("CNI_ARGS: K8S_POD_NAMESPACE and K8S_POD_NAME go together")
	}
	return ns, name, nil
}

// begin is ADD's and CHECK's preamble: it parses req for verb, then
// takes the pod pool if the agent can serve pods and locks the
// attachment. It returns the request, the pool and the unlock, or the
// response to send.
func (s *cniServer) begin(verb string, req *apiv1.CNIRequest) (request, *ipam.Pool, func(), *apiv1.CNIResponse) {
	r, bad := parse(verb, req)
	if bad != nil {
		return request{}, nil, nil, bad
	}
	pool, reason := s.a.readyPool()
	if pool == nil || reason != "" {
		return request{}, nil, nil, failure(errTryAgainLater, "onc-agent is not ready", reason)
	}
	return r, pool, s.a.locks.lock(r.key), nil
}

func (s *cniServer) Add(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	r, pool, unlock, bad := s.begin(verbAdd, req)
	if bad != nil {
		return bad, nil
	}
	defer unlock()
	key := r.key

	kns, kname := r.k8sNamespace, r.k8sName
	att, err := pool.Allocate(ipam.Attachment{Key: key, Netns: req.Netns,
		HostIface: datapath.HostIfaceName(key.ContainerID, key.IfName), K8sNamespace: kns, K8sName: kname, PortMappings: r.ports})
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
	link, err := s.a.dp.Pods.AttachPod(pod)
	if err == nil {
		att.MAC = link.PodMAC.String()
		err = pool.Update(att)
	}
	if err == nil && s.a.policy != nil && kname != "" {
		err = s.a.policy.AwaitPod(ctx, kns, kname)
	}
	var res []byte
	if err == nil {
		if res, err = s.result(att, link, r.conf.CNIVersion); err != nil {
			err = fmt.Errorf("encode the result: %w", err)
		}
	}
	if err != nil {
		// Roll back: nothing of this ADD may stay behind.
		if derr := s.a.dp.Pods.DetachPod(pod); derr != nil {
			slog.Error("rollback could not remove the pod's interface", "pod", key, "err", derr)
		}
		if _, _, rerr := pool.Release(key); rerr != nil {
			slog.Error("rollback could not free the pod's addresses", "pod", key, "ips", att.IPs, "err", rerr)
		}
		if s.a.policy != nil {
			s.a.policy.Signal() // the rules it may have got go
		}
		s.a.hostPortsChanged(att)
		switch {
		case errors.Is(err, datapath.ErrNoNetns):
			return fail(errUnknownContainer, "the container's network namespace does not exist", err.Error())
		case errors.Is(err, datapath.ErrIfaceExists):
			return fail(ErrAttachmentExists, "the interface already exists in the container", err.Error())
		case errors.Is(err, policy.ErrPending):
			return fail(errTryAgainLater, "the pod's network policy is not enforced yet", err.Error())
		}
		return fail(ErrInternal, "cannot set up the pod's interface", err.Error())
	}
	s.a.hostPortsChanged(att)
	slog.Info("pod added", "pod", key, "ips", att.IPs, "k8s", kns+"/"+kname)
	return &apiv1.CNIResponse{Result: res}, nil
}

// result renders the ADD result in the configuration's CNI version: per
// address (one per family, in the node's order), the address as a host
// prefix, its gateway, and a default route.
func (s *cniServer) result(att ipam.Attachment, link datapath.PodLink, cniVersion string) ([]byte, error) {
	podIdx := 1
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: att.HostIface, Mac: link.HostMAC.String()},
			{Name: att.IfName, Mac: link.PodMAC.String(), Sandbox: att.Netns, Mtu: s.a.podMTU},
		},
	}
	for _, ip := range att.IPs {
		gw := s.a.gatewayOf(ip)
		bits := ip.BitLen()
		r.IPs = append(r.IPs, &current.IPConfig{
			Interface: &podIdx,
			Address:   net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, bits)},
			Gateway:   gw.AsSlice(),
		})
		r.Routes = append(r.Routes, &types.Route{Dst: net.IPNet{IP: make(net.IP, bits/8), Mask: net.CIDRMask(0, bits)}, GW: gw.AsSlice()})
	}
	out, err := r.GetAsVersion(cniVersion)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

func (s *cniServer) Del(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	r, bad := parse(verbDel, req)
	if bad != nil {
		return bad, nil
	}
	pool, _ := s.a.readyPool()
	if pool == nil {
		return fail(errTryAgainLater, "onc-agent has not loaded its pod state yet")
	}
	defer s.a.locks.lock(r.key)()
	if err := s.release(pool, r.key); err != nil {
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
	if err := s.a.dp.Pods.DetachPod(pod); err != nil {
		return err
	}
	att, had, err := pool.Release(key)
	if err != nil {
		return err
	}
	if had {
		slog.Info("pod deleted", "pod", key, "ips", att.IPs)
		s.a.keepDrops()
		if s.a.policy != nil {
			s.a.policy.Signal() // its rules go
		}
		s.a.hostPortsChanged(att)
	}
	return nil
}

func (s *cniServer) Check(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	r, pool, unlock, bad := s.begin(verbCheck, req)
	if bad != nil {
		return bad, nil
	}
	defer unlock()
	key := r.key
	att, ok := pool.Get(key)
	if !ok {
		return fail(ErrCheckFailed, fmt.Sprintf("container %s has no interface %s on this network", key.ContainerID, key.IfName))
	}
	for _, want := range att.IPs {
		if !slices.ContainsFunc(r.prev.IPs, func(ip *current.IPConfig) bool {
			a, ok := netip.AddrFromSlice(ip.Address.IP)
			return ok && a.Unmap() == want
		}) {
			return fail(ErrCheckFailed, fmt.Sprintf("prevResult does not hold the pod's address %s", want))
		}
	}
	pod := s.a.podOf(att)
	pod.Netns, pod.IfName = req.Netns, req.Ifname // CHECK asks about the runtime's view
	if err := s.a.dp.Pods.CheckPod(pod); err != nil {
		if errors.Is(err, datapath.ErrNoNetns) {
			return fail(errUnknownContainer, "the container's network namespace does not exist", err.Error())
		}
		return fail(ErrCheckFailed, "the pod's network is not as ADD left it", err.Error())
	}
	return &apiv1.CNIResponse{}, nil
}

func (s *cniServer) Status(ctx context.Context, req *apiv1.CNIRequest) (*apiv1.CNIResponse, error) {
	if _, bad := parse(verbStatus, req); bad != nil {
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
	r, bad := parse(verbGC, req)
	if bad != nil {
		return bad, nil
	}
	pool, _ := s.a.readyPool()
	if pool == nil {
		return fail(errTryAgainLater, "onc-agent has not loaded its pod state yet")
	}
	valid := map[ipam.Key]bool{}
	for _, k := range r.conf.ValidAttachments.keys {
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
			slog.Info("garbage-collected a stale pod attachment", "pod", att.Key, "ips", att.IPs)
		}
		unlock()
	}
	if len(errs) > 0 {
		return fail(ErrInternal, fmt.Sprintf("GC could not remove %d attachments", len(errs)), errs...)
	}
	return &apiv1.CNIResponse{}, nil
}
