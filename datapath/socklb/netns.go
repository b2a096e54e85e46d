package socklb

import (
	"fmt"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/podnet"
	"golang.org/x/sys/unix"
)

// NetnsCookie is the kernel's cookie of the network namespace at path
// ("" for the caller's own), as the programs read it from a socket.
func NetnsCookie(path string) (uint64, error) {
	if path == "" {
		return socketNetnsCookie()
	}
	ns, err := podnet.OpenNetns(path)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	var cookie uint64
	err = podnet.InNetns(ns, func() (err error) {
		cookie, err = socketNetnsCookie()
		return err
	})
	return cookie, err
}

func socketNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return v, nil
}

// OwnHost makes the programs balance the sockets of the host's network
// namespace (cookie from NetnsCookie("") in the agent's).
func (lb *LB) OwnHost(cookie uint64) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.maps.OncLbNetns.Put(cookie, uint32(0))
}

// OwnPod makes the programs balance the sockets of a pod's network
// namespace; the pod's address names the entry for ForgetPod.
func (lb *LB) OwnPod(cookie uint64, pod netip.Addr) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.maps.OncLbNetns.Put(cookie, bpf.NetIPv4(pod))
}

// ForgetPods removes the namespaces of pods whose address keep rejects
// (and never the host's); a cookie is never reused, so an entry left
// behind is only garbage.
func (lb *LB) ForgetPods(keep func(netip.Addr) bool) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	var cookie uint64
	var ip uint32
	var gone []uint64
	it := lb.maps.OncLbNetns.Iterate()
	for it.Next(&cookie, &ip) {
		if ip != 0 && !keep(bpf.IPv4(ip)) {
			gone = append(gone, cookie)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, c := range gone {
		if err := lb.maps.OncLbNetns.Delete(c); err != nil && !isNotExist(err) {
			return err
		}
	}
	return nil
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
