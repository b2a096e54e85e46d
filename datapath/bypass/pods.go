package bypass

import (
	"fmt"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
)

// OwnPod makes a pod's connections with the node's other pods eligible:
// its address and its network namespace (path, as the runtime gave it,
// and cookie, from netns.Cookie) are recorded. Sockets of any other
// namespace using that address (the host, a hostNetwork pod, another
// agent's pod) are never recorded.
func (b *Bypass) OwnPod(ip netip.Addr, netns string, cookie uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.maps.OncBpPods.Put(bpf.NetIPv4(ip), cookie); err != nil {
		return fmt.Errorf("bypass: record pod %s: %w", ip, err)
	}
	b.netns[ip] = netns
	return nil
}

// ForgetPods removes the pods whose address keep rejects. Their open
// connections stay as they are until they close; new ones with their
// address are not bypassed.
func (b *Bypass) ForgetPods(keep func(netip.Addr) bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	gone, err := bpf.DeleteIf(b.maps.OncBpPods, func(ip uint32, _ uint64) bool { return !keep(bpf.IPv4(ip)) })
	for _, ip := range gone {
		delete(b.netns, bpf.IPv4(ip))
	}
	if err != nil {
		return fmt.Errorf("bypass: forget pods: %w", err)
	}
	return nil
}
