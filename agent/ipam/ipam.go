// Package ipam gives pods addresses from their node's CIDR and remembers
// every attachment (container, interface, address, host veth) in one file,
// written atomically on each change, so allocations survive agent restarts.
package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/onc-net/onc/internal/atomicfile"
)

// ErrExhausted: no free address is left in the node CIDR.
var ErrExhausted = errors.New("no free pod address left")

// ErrExists: the (container, interface) attachment already has an address.
var ErrExists = errors.New("attachment already exists")

// Key names an attachment as the CNI spec does.
type Key struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func (k Key) String() string { return k.ContainerID + "/" + k.IfName }

// Attachment is one pod interface of this node.
type Attachment struct {
	Key
	IP           netip.Addr `json:"ip"`
	Netns        string     `json:"netns"`
	HostIface    string     `json:"hostIface"`
	MAC          string     `json:"mac,omitempty"`
	K8sNamespace string     `json:"k8sNamespace,omitempty"`
	K8sName      string     `json:"k8sName,omitempty"`
	Created      time.Time  `json:"created"`
	// PortMappings are the pod's hostPorts (the CNI portMappings
	// capability), served by the Service programs.
	PortMappings []PortMapping `json:"portMappings,omitempty"`
}

// PortMapping is one hostPort: the node's HostIP:HostPort (every node
// address when HostIP is unset) forwarded to the pod's ContainerPort.
type PortMapping struct {
	HostPort      uint16     `json:"hostPort"`
	ContainerPort uint16     `json:"containerPort"`
	Protocol      string     `json:"protocol"` // "tcp" or "udp"
	HostIP        netip.Addr `json:"hostIP,omitzero"`
}

type state struct {
	CIDR        netip.Prefix  `json:"cidr"`
	Last        netip.Addr    `json:"last"`
	Attachments []*Attachment `json:"attachments"`
}

// Pool allocates from one node CIDR. Safe for concurrent use.
type Pool struct {
	mu       sync.Mutex
	path     string
	cidr     netip.Prefix
	reserved map[netip.Addr]bool
	last     netip.Addr // allocation continues after it, so a freed address is reused last
	byKey    map[Key]*Attachment
	byIP     map[netip.Addr]*Attachment
}

// Open loads the pool stored at path (a missing file is an empty pool).
// Addresses in reserved (the node gateway) are never handed out. If the
// stored CIDR differs from cidr, the stored attachments that fall outside
// cidr are dropped and returned so the caller can clean them up.
func Open(path string, cidr netip.Prefix, reserved ...netip.Addr) (*Pool, []Attachment, error) {
	if !cidr.IsValid() || !cidr.Addr().Is4() || cidr.Bits() > 30 {
		return nil, nil, fmt.Errorf("pod CIDR %s: need an IPv4 prefix of /30 or larger", cidr)
	}
	p := &Pool{path: path, cidr: cidr.Masked(), reserved: map[netip.Addr]bool{}, byKey: map[Key]*Attachment{}, byIP: map[netip.Addr]*Attachment{}}
	for _, r := range reserved {
		p.reserved[r] = true
	}
	var st state
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, nil, err
	default:
		if err := json.Unmarshal(data, &st); err != nil {
			return nil, nil, fmt.Errorf("%s is corrupt: %w", path, err)
		}
	}
	var dropped []Attachment
	for _, a := range st.Attachments {
		if !p.cidr.Contains(a.IP) || !p.usable(a.IP) || p.byIP[a.IP] != nil {
			dropped = append(dropped, *a)
			continue
		}
		p.byKey[a.Key], p.byIP[a.IP] = a, a
	}
	if p.cidr.Contains(st.Last) {
		p.last = st.Last
	}
	if len(dropped) > 0 {
		if err := p.save(); err != nil {
			return nil, nil, err
		}
	}
	return p, dropped, nil
}

// CIDR is the pool's prefix.
func (p *Pool) CIDR() netip.Prefix { return p.cidr }

// usable excludes the network and broadcast addresses and reserved ones.
func (p *Pool) usable(ip netip.Addr) bool {
	if ip == p.cidr.Addr() || ip == broadcast(p.cidr) {
		return false
	}
	return !p.reserved[ip]
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= (1 << (32 - p.Bits())) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Allocate records a new attachment with the next free address and returns
// it (with IP and Created filled in).
func (p *Pool) Allocate(a Attachment) (Attachment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.byKey[a.Key]; old != nil {
		return *old, fmt.Errorf("%w: %s has %s", ErrExists, a.Key, old.IP)
	}
	ip, ok := p.next()
	if !ok {
		return Attachment{}, fmt.Errorf("%w in %s (%d in use)", ErrExhausted, p.cidr, len(p.byIP))
	}
	a.IP, a.Created = ip, time.Now().UTC().Truncate(time.Second)
	stored := a
	p.byKey[a.Key], p.byIP[ip] = &stored, &stored
	prevLast := p.last
	p.last = ip
	if err := p.save(); err != nil {
		delete(p.byKey, a.Key)
		delete(p.byIP, ip)
		p.last = prevLast
		return Attachment{}, err
	}
	return a, nil
}

func (p *Pool) next() (netip.Addr, bool) {
	start := p.last
	if !start.IsValid() {
		start = p.cidr.Addr()
	}
	ip := start
	for {
		ip = ip.Next()
		if !p.cidr.Contains(ip) {
			ip = p.cidr.Addr()
		}
		if p.usable(ip) && p.byIP[ip] == nil {
			return ip, true
		}
		if ip == start {
			return netip.Addr{}, false
		}
	}
}

// Update changes a stored attachment's details (not its key or address).
func (p *Pool) Update(a Attachment) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.byKey[a.Key]
	if old == nil || old.IP != a.IP {
		return fmt.Errorf("attachment %s with %s not found", a.Key, a.IP)
	}
	prev := *old
	*old = a
	if err := p.save(); err != nil {
		*old = prev
		return err
	}
	return nil
}

// Release forgets the attachment and frees its address. It reports whether
// there was one; releasing an unknown key is not an error.
func (p *Pool) Release(k Key) (Attachment, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.byKey[k]
	if a == nil {
		return Attachment{}, false, nil
	}
	delete(p.byKey, k)
	delete(p.byIP, a.IP)
	if err := p.save(); err != nil {
		p.byKey[k], p.byIP[a.IP] = a, a
		return Attachment{}, false, err
	}
	return *a, true, nil
}

// Get returns one attachment.
func (p *Pool) Get(k Key) (Attachment, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a := p.byKey[k]; a != nil {
		return *a, true
	}
	return Attachment{}, false
}

// List returns every attachment, ordered by address; never nil.
func (p *Pool) List() []Attachment {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Attachment, 0, len(p.byIP))
	for _, a := range p.byIP {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out
}

// save writes the state to a temporary file, syncs it and renames it over
// the old one, so a crash leaves either the old or the new state.
func (p *Pool) save() error {
	st := state{CIDR: p.cidr, Last: p.last, Attachments: make([]*Attachment, 0, len(p.byIP))}
	for _, a := range p.byIP {
		st.Attachments = append(st.Attachments, a)
	}
	sort.Slice(st.Attachments, func(i, j int) bool { return st.Attachments[i].IP.Less(st.Attachments[j].IP) })
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p.path, data, 0o600)
}
