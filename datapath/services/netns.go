package services

import (
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
// destroy.go); the pod's address names the entry for ForgetPod.
func (lb *LB) OwnPod(cookie uint64, pod netip.Addr, path string) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if err := lb.maps.OncLbNetns.Put(cookie, bpf.NetIPv4(pod)); err != nil {
		return err
	}
	lb.netns[cookie] = path
	return nil
}

// ForgetPods removes the namespaces of pods whose address keep rejects
// (and never the host's); a cookie is never reused, so an entry left
// behind is only garbage.
func (lb *LB) ForgetPods(keep func(netip.Addr) bool) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	gone, err := bpf.DeleteIf(lb.maps.OncLbNetns, func(_ uint64, ip uint32) bool { return ip != 0 && !keep(bpf.IPv4(ip)) })
	for _, cookie := range gone {
		delete(lb.netns, cookie)
	}
	return err
}

// Owned lists the namespaces the programs act for: cookie → pod address,
// the zero Addr for the host.
func (lb *LB) Owned() (map[uint64]netip.Addr, error) {
	out := map[uint64]netip.Addr{}
	var cookie uint64
	var ip uint32
	it := lb.maps.OncLbNetns.Iterate()
	for it.Next(&cookie, &ip) {
		if ip == 0 {
			out[cookie] = netip.Addr{}
		} else {
			out[cookie] = bpf.IPv4(ip)
		}
	}
	return out, it.Err()
}
