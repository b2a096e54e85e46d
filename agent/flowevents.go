package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/datapath/bpf"
	dpflows "github.com/onc-net/onc/datapath/flows"
	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/netns"
)

// flowResolver names the ends of the eBPF programs' flow events: local
// pods by network namespace (the socket LB's), pods by address (this
// node's attachments, then the policy informers' cluster pods), nodes by
// address (the datastore's), Services by frontend (the socket LB's
// tables). None of them waits for a change of what it reads.
func (a *Agent) flowResolver() flows.Resolver {
	host, err := netns.Cookie("")
	if err != nil {
		slog.Warn("flow records: this node's network namespace cookie; socket calls of unknown namespaces will be named as the node's", "err", err)
	}
	res := flows.Resolver{
		HostNetns: host,
		PodOfNetns: func(cookie uint64) (netip.Addr, bool) {
			if t := a.dp.Services.Tables(); t != nil {
				return t.PodOfNetns(cookie)
			}
			return netip.Addr{}, false
		},
		Pod: a.localPod,
		Node: func(ip netip.Addr) (string, bool) {
			if m := a.nodeAddrs.Load(); m != nil {
				name, ok := (*m)[ip]
				return name, ok
			}
			return "", false
		},
		Service: func(uplink bool, vip netip.AddrPort, proto uint8) (string, string, bool) {
			t := a.dp.Services.Tables()
			if t == nil {
				return "", "", false
			}
			scope := dpservices.Socket
			if uplink {
				scope = dpservices.Uplink
			}
			name, ok := t.ServiceAt(scope, vip, dpservices.Proto(proto))
			ns, name, _ := strings.Cut(name, "/")
			return ns, name, ok
		},
	}
	if r := a.recorder; r != nil {
		res.Pod = func(ip netip.Addr) (flows.Endpoint, bool) {
			// This node's pod first: the API may still show another
			// node's terminating pod at an address it gave again.
			if e, ok := a.localPod(ip); ok {
				return e, true
			}
			return r.ClusterPod(ip)
		}
	}
	return res
}

// localPod names a pod of this node by address, from its attachment.
func (a *Agent) localPod(ip netip.Addr) (flows.Endpoint, bool) {
	pool, _ := a.readyPool()
	if pool == nil {
		return flows.Endpoint{}, false
	}
	att, ok := pool.At(ip)
	if !ok || att.K8sName == "" {
		return flows.Endpoint{}, false
	}
	return flows.Endpoint{Kind: flows.KindPod, Namespace: att.K8sNamespace, Name: att.K8sName, Node: a.cfg.NodeName}, true
}

// keepDrops forgets the drops of pods no longer attached here.
func (a *Agent) keepDrops() {
	if a.drops == nil {
		return
	}
	attached := map[string]bool{}
	for _, att := range a.attachments() {
		attached[att.K8sNamespace+"/"+att.K8sName] = true
	}
	a.drops.Keep(func(ns, name string) bool { return attached[ns+"/"+name] })
}

// noteNodes keeps the nodes' addresses for the flow records.
func (a *Agent) noteNodes(nodes []datastore.Node) {
	m := make(map[netip.Addr]string, len(nodes))
	for _, n := range nodes {
		m[n.IP] = n.Name
	}
	a.nodeAddrs.Store(&m)
}

// recordEvents reads the eBPF programs' flow events into records until
// ctx ends, from when the fast path's object (which owns their ring) is
// loaded; from then on, the fast path's evictions are recorded too.
func (a *Agent) recordEvents(ctx context.Context) {
	names, err := bpf.LoadEventNames()
	if err != nil {
		slog.Error("flow records: the eBPF events' names", "err", err)
		return
	}
	go a.events.RecordEvictions(ctx)
	for ctx.Err() == nil {
		if fp := a.dp.Node.FastPath(); fp != nil {
			fp.OnEvict(a.events.Evicted)
			rd, err := dpflows.OpenEvents(fp.Events(), names)
			if err == nil {
				err = a.events.Run(ctx, rd)
			}
			if err != nil && ctx.Err() == nil {
				slog.Error("flow records: reading the eBPF programs' events", "err", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
