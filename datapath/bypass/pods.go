package bypass

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// OwnPod makes a pod's connections with the node's other pods eligible:
// its address (IPv4 or IPv6: a dual-stack pod is registered by each) and
// its network namespace (path, as the runtime gave it, and cookie, from
// netns.Cookie) are recorded. Sockets of any other namespace using that
// address (the host, a hostNetwork pod, another agent's pod) are never
// recorded.
func (b *Bypass) OwnPod(ip netip.Addr, netns string, cookie uint64) error {
	if !ip.IsValid() {
		return fmt.Errorf("bypass: record pod in %s: no address", netns)
	}
	ip = ip.Unmap()
	b.mu.Lock()
	defer b.mu.Unlock()
	var err error
	if ip.Is4() {
		err = b.maps.OncBpPods.Put(bpf.NetIPv4(ip), cookie)
	} else {
		err = b.maps.OncBpPods6.Put(bpf.BypassBpIn6{Addr: ip.As16()}, cookie)
	}
	if err != nil {
		return fmt.Errorf("bypass: record pod %s: %w", ip, err)
	}
	b.netns[ip] = netns
	return nil
}

// ForgetPods removes the pods whose address keep rejects, in both
// families. Their open connections stay as they are until they close;
// new ones with their address are not bypassed.
func (b *Bypass) ForgetPods(keep func(netip.Addr) bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err4 := forget(b, b.maps.OncBpPods, bpf.IPv4, keep)
	err6 := forget(b, b.maps.OncBpPods6, func(k bpf.BypassBpIn6) netip.Addr { return netip.AddrFrom16(k.Addr) }, keep)
	if err := errors.Join(err4, err6); err != nil {
		return fmt.Errorf("bypass: forget pods: %w", err)
	}
	return nil
}

// forget deletes the entries of one family's pods whose address keep
// rejects, and their namespaces; b.mu is held.
func forget[K any](b *Bypass, pods *ebpf.Map, addr func(K) netip.Addr, keep func(netip.Addr) bool) error {
	gone, err := bpf.DeleteIf(pods, func(k K, _ uint64) bool { return !keep(addr(k)) })
	for _, k := range gone {
		delete(b.netns, addr(k))
	}
	return err
}
