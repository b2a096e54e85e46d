package lab

import (
	"fmt"
	"hash/fnv"
	"net/netip"
)

// AddOutsider puts a host that is no node on the lab's underlay: a network
// namespace called name, its eth0 on the underlay bridge at ip. Tests use
// it as an attacker who can reach every node's address. cleanup removes it
// (and is safe to call on an error path too).
func (l *Lab) AddOutsider(name string, ip netip.Addr) (netns string, cleanup func(), err error) {
	h := fnv.New32a()
	h.Write([]byte(name))
	port := fmt.Sprintf("o%08x", h.Sum32()) // the bridge's end, unique per name
	cleanup = func() { _ = delNetns(name) } // its veth pair goes with it
	if err := l.attach(name, port, "eth0", ip); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("outside host %s at %s: %w", name, ip, err)
	}
	return name, cleanup, nil
}
