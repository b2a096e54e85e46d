package services

import (
	"maps"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
)

// OwnHost makes the programs balance the sockets of the host's network
// namespace (cookie from netns.Cookie("") in the agent's).
func (lb *LB) OwnHost(cookie uint64) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if err := lb.maps.OncLbNetns.Put(cookie, uint32(0)); err != nil {
		return err
	}
	lb.netns[cookie] = "" // the agent's own
	return nil
}

// OwnPod makes the programs balance the sockets of a pod's network
// namespace, at path (as the runtime gave it: sockets are ended there,
// destroy.go); the pod's address (its IPv4 one, if it has one) names the
// entry for ForgetPod.
func (lb *LB) OwnPod(cookie uint64, pod netip.Addr, path string) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if err := lb.maps.OncLbNetns.Put(cookie, podName(pod)); err != nil {
		return err
	}
	lb.netns[cookie], lb.pods[cookie] = path, pod
	lb.publishPods()
	return nil
}

// podName is what onc_lb_netns holds for a pod: its IPv4 address, or the
// low 32 bits of an IPv6-only pod's (unique within the node's block, and
// never 0, the host's: a block's first address is the gateway).
func podName(pod netip.Addr) uint32 {
	if pod.Is4() {
		return bpf.NetIPv4(pod)
	}
	a := pod.As16()
	return bpf.NetIPv4(netip.AddrFrom4([4]byte(a[12:])))
}

// podOf is the address of the pod whose namespace has cookie and name in
// onc_lb_netns: as OwnPod was given it, or, for an entry of an earlier
// run that no pod took again, the name as IPv4.
func (lb *LB) podOf(cookie uint64, name uint32) netip.Addr {
	if a, ok := lb.pods[cookie]; ok {
		return a
	}
	return bpf.IPv4(name)
}

// ForgetPods removes the namespaces of pods but those of keep (by their
// names, podName: an entry of an earlier run that no pod took again yet
// is known by its name alone), and never the host's; a cookie is never
// reused, so an entry left behind is only garbage.
func (lb *LB) ForgetPods(keep ...netip.Addr) error {
	names := make(map[uint32]bool, len(keep))
	for _, a := range keep {
		names[podName(a)] = true
	}
	return lb.forget(func(name uint32) bool { return !names[name] })
}

// ForgetPod removes the namespace of the pod at ip.
func (lb *LB) ForgetPod(ip netip.Addr) error {
	name := podName(ip)
	return lb.forget(func(n uint32) bool { return n == name })
}

// forget removes the pods' namespaces whose name gone says, never the
// host's (name 0).
func (lb *LB) forget(gone func(name uint32) bool) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	cookies, err := bpf.DeleteIf(lb.maps.OncLbNetns, func(_ uint64, name uint32) bool { return name != 0 && gone(name) })
	for _, cookie := range cookies {
		delete(lb.netns, cookie)
		delete(lb.pods, cookie)
	}
	lb.publishPods()
	return err
}

// Owned lists the namespaces the programs act for: cookie → pod address,
// the zero Addr for the host.
func (lb *LB) Owned() (map[uint64]netip.Addr, error) {
	out := map[uint64]netip.Addr{}
	var cookie uint64
	var name uint32
	lb.mu.Lock()
	defer lb.mu.Unlock()
	it := lb.maps.OncLbNetns.Iterate()
	for it.Next(&cookie, &name) {
		if name == 0 {
			out[cookie] = netip.Addr{}
		} else {
			out[cookie] = lb.podOf(cookie, name)
		}
	}
	return out, it.Err()
}

// The pods' namespaces and the Services' names as the last change of
// each left them, for the flow records (PodOfNetns, ServiceAt): their
// readers never wait for a Sync, which holds lb.mu throughout. Apart, so
// that a pod's start copies no Service and a Sync no pod.

// publishPods renews the pods' (lb.mu held).
func (lb *LB) publishPods() {
	pods := maps.Clone(lb.pods)
	lb.podNames.Store(&pods)
}

// publishServices renews the Services' (lb.mu held).
func (lb *LB) publishServices() {
	svcs := make(map[Key]string, len(lb.services))
	for k, p := range lb.services {
		svcs[k] = p.svc.Name
	}
	lb.svcNames.Store(&svcs)
}

// PodOfNetns is the address of the pod whose network namespace has
// cookie, as OwnPod was given it; false for the host's or one unknown.
func (lb *LB) PodOfNetns(cookie uint64) (netip.Addr, bool) {
	pods := lb.podNames.Load()
	if pods == nil {
		return netip.Addr{}, false
	}
	a, ok := (*pods)[cookie]
	return a, ok
}

// ServiceAt names (namespace/name:port-name) the Service programmed at
// vip:port for proto, in scope.
func (lb *LB) ServiceAt(scope Scope, vip netip.AddrPort, proto Proto) (string, bool) {
	svcs := lb.svcNames.Load()
	if svcs == nil {
		return "", false
	}
	name, ok := (*svcs)[Key{vip.Addr(), vip.Port(), proto, scope}]
	return name, ok
}
