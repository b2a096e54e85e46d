package bypass

import (
	"fmt"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
)

// OwnPod makes a pod's connections with the node's other pods eligible:
// its address and its network namespace (path, as the runtime gave it,
// and cookie, from pods.NetnsCookie) are recorded. Sockets of any other
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
	var ip uint32
	var cookie uint64
	var gone []uint32
	it := b.maps.OncBpPods.Iterate()
	for it.Next(&ip, &cookie) {
		if !keep(bpf.IPv4(ip)) {
			gone = append(gone, ip)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bypass pods: %w", err)
	}
	for _, ip := range gone {
		if err := b.maps.OncBpPods.Delete(ip); err != nil && !isNotExist(err) {
			return fmt.Errorf("bypass: forget pod %s: %w", bpf.IPv4(ip), err)
		}
		delete(b.netns, bpf.IPv4(ip))
	}
	return nil
}
