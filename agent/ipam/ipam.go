// Package ipam gives pods addresses from their node's CIDRs, one address
// per CIDR (IPv4, IPv6, or both), and remembers every attachment
// (container, interface, addresses, host veth) in one file, written
// atomically on each change, so allocations survive agent restarts.
package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onc-net/onc/internal/atomicfile"
	"github.com/onc-net/onc/internal/netaddr"
)

// ErrExhausted: no free address is left in a node CIDR.
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
	// IPs are the pod's addresses, one from each of the node's CIDRs when
	// it was made, in their order. The file also keeps the IPv4 one as
	// "ip", all that agents before IPv6 read.
	IPs          []netip.Addr `json:"ips"`
	Netns        string       `json:"netns"`
	HostIface    string       `json:"hostIface"`
	MAC          string       `json:"mac,omitempty"`
	K8sNamespace string       `json:"k8sNamespace,omitempty"`
	K8sName      string       `json:"k8sName,omitempty"`
	Created      time.Time    `json:"created"`
	// PortMappings are the pod's hostPorts (the CNI portMappings
	// capability), served by the Service programs.
	PortMappings []PortMapping `json:"portMappings,omitempty"`
}

// IPv4 is the pod's IPv4 address; invalid when it has none.
func (a Attachment) IPv4() netip.Addr { return netaddr.IPv4(a.IPs) }

// MarshalJSON writes a's IPv4 address also as "ip".
func (a Attachment) MarshalJSON() ([]byte, error) {
	type plain Attachment // without these methods
	return json.Marshal(struct {
		IP netip.Addr `json:"ip,omitzero"`
		plain
	}{a.IPv4(), plain(a)})
}

// UnmarshalJSON reads an attachment an agent before IPv6 wrote, which has
// only "ip", too.
func (a *Attachment) UnmarshalJSON(data []byte) error {
	type plain Attachment
	var f struct {
		IP netip.Addr `json:"ip,omitzero"`
		plain
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return err
	}
	*a = Attachment(f.plain)
	if len(a.IPs) == 0 && f.IP.IsValid() {
		a.IPs = []netip.Addr{f.IP}
	}
	return nil
}

// PortMapping is one hostPort: the node's HostIP:HostPort (every node
// address when HostIP is unset) forwarded to the pod's ContainerPort.
type PortMapping struct {
	HostPort      uint16     `json:"hostPort"`
	ContainerPort uint16     `json:"containerPort"`
	Protocol      string     `json:"protocol"` // "tcp" or "udp"
	HostIP        netip.Addr `json:"hostIP,omitzero"`
}

// state is the file. CIDR and Last are the IPv4 CIDR's, as agents before
// IPv6 wrote and read them; CIDRs and Lasts have one entry per CIDR.
type state struct {
	CIDR        netip.Prefix   `json:"cidr"`
	Last        netip.Addr     `json:"last"`
	CIDRs       []netip.Prefix `json:"cidrs"`
	Lasts       []netip.Addr   `json:"lasts"`
	Attachments []*Attachment  `json:"attachments"`
}

// Pool allocates from a node's CIDRs, at most one per family. Safe for
// concurrent use.
type Pool struct {
	mu       sync.Mutex
	path     string
	cidrs    []netip.Prefix
	reserved map[netip.Addr]bool
	last     []netip.Addr // per CIDR: allocation continues after it, so a freed address is reused last
	byKey    map[Key]*Attachment
	byIP     map[netip.Addr]*Attachment
	// at is byIP as the last change left it, for readers that must not
	// wait for a change's write of the file (At).
	at atomic.Pointer[map[netip.Addr]Attachment]
}

// Open loads the pool stored at path (a missing file is an empty pool).
// Each attachment gets one address from each of cidrs (an IPv4 prefix of
// /30 or larger, an IPv6 one of /120 or larger, at most one of each).
// Addresses in reserved (the node gateways) are never handed out. If the
// stored CIDRs differ from cidrs, the stored attachments with an address
// outside cidrs are dropped and returned so the caller can clean them up;
// one that lacks a family of cidrs stays as it is.
func Open(path string, cidrs []netip.Prefix, reserved ...netip.Addr) (*Pool, []Attachment, error) {
	if len(cidrs) == 0 {
		return nil, nil, errors.New("no pod CIDR")
	}
	p := &Pool{path: path, reserved: map[netip.Addr]bool{}, byKey: map[Key]*Attachment{}, byIP: map[netip.Addr]*Attachment{}}
	for _, cidr := range cidrs {
		switch {
		case !cidr.IsValid() || cidr.Addr().Is4In6():
			return nil, nil, fmt.Errorf("pod CIDR %s: not an IP prefix", cidr)
		case cidr.Addr().Is4() && cidr.Bits() > 30:
			return nil, nil, fmt.Errorf("pod CIDR %s: need an IPv4 prefix of /30 or larger", cidr)
		case cidr.Addr().Is6() && cidr.Bits() > 120:
			return nil, nil, fmt.Errorf("pod CIDR %s: need an IPv6 prefix of /120 or larger", cidr)
		case slices.ContainsFunc(p.cidrs, func(c netip.Prefix) bool { return c.Addr().Is4() == cidr.Addr().Is4() }):
			return nil, nil, fmt.Errorf("pod CIDRs %v: two of one family", cidrs)
		}
		p.cidrs = append(p.cidrs, cidr.Masked())
	}
	p.last = make([]netip.Addr, len(p.cidrs))
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
		if !p.fits(a) {
			dropped = append(dropped, *a)
			continue
		}
		p.byKey[a.Key] = a
		for _, ip := range a.IPs {
			p.byIP[ip] = a
		}
	}
	for _, last := range append(st.Lasts, st.Last) {
		if i := p.index(last); i >= 0 && !p.last[i].IsValid() {
			p.last[i] = last
		}
	}
	if len(dropped) > 0 {
		if err := p.save(); err != nil {
			return nil, nil, err
		}
	}
	p.publish()
	return p, dropped, nil
}

// CIDRs are the pool's prefixes.
func (p *Pool) CIDRs() []netip.Prefix { return p.cidrs }

// index is the position of the CIDR that holds ip; -1 if none.
func (p *Pool) index(ip netip.Addr) int {
	return slices.IndexFunc(p.cidrs, func(c netip.Prefix) bool { return c.Contains(ip) })
}

// fits reports whether a stored attachment can stay: each address usable
// in a CIDR of its own family, no two of one family, none taken.
func (p *Pool) fits(a *Attachment) bool {
	seen := make([]bool, len(p.cidrs))
	for _, ip := range a.IPs {
		i := p.index(ip)
		if i < 0 || seen[i] || !p.usable(ip, p.cidrs[i]) || p.byIP[ip] != nil {
			return false
		}
		seen[i] = true
	}
	return len(a.IPs) > 0
}

// usable excludes the network and (IPv4) broadcast addresses and reserved
// ones.
func (p *Pool) usable(ip netip.Addr, cidr netip.Prefix) bool {
	if ip == cidr.Addr() || ip.Is4() && ip == netaddr.Last(cidr) {
		return false
	}
	return !p.reserved[ip]
}

// Allocate records a new attachment with the next free address of each
// CIDR and returns it (with IPs and Created filled in).
func (p *Pool) Allocate(a Attachment) (Attachment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.byKey[a.Key]; old != nil {
		return *old, fmt.Errorf("%w: %s has %v", ErrExists, a.Key, old.IPs)
	}
	a.IPs = make([]netip.Addr, len(p.cidrs))
	for i, cidr := range p.cidrs {
		ip, ok := p.next(i)
		if !ok {
			return Attachment{}, fmt.Errorf("%w in %s (%d attachments)", ErrExhausted, cidr, len(p.byKey))
		}
		a.IPs[i] = ip
	}
	a.Created = time.Now().UTC().Truncate(time.Second)
	stored := a
	p.byKey[a.Key] = &stored
	for _, ip := range a.IPs {
		p.byIP[ip] = &stored
	}
	prevLast := slices.Clone(p.last)
	copy(p.last, a.IPs)
	if err := p.save(); err != nil {
		delete(p.byKey, a.Key)
		for _, ip := range a.IPs {
			delete(p.byIP, ip)
		}
		p.last = prevLast
		return Attachment{}, err
	}
	p.publish()
	return a, nil
}

// next is the next free address of the CIDR at index i. It looks at most
// a million addresses on from the last one (2^20: every address of an
// IPv4 CIDR up to /12, and an IPv6 /64 never wraps anyway); a CIDR so
// large and that full is exhausted in practice.
func (p *Pool) next(i int) (netip.Addr, bool) {
	cidr := p.cidrs[i]
	start := p.last[i]
	if !start.IsValid() {
		start = cidr.Addr()
	}
	ip := start
	for range 1 << 20 {
		ip = ip.Next()
		if !cidr.Contains(ip) {
			ip = cidr.Addr()
		}
		if p.usable(ip, cidr) && p.byIP[ip] == nil {
			return ip, true
		}
		if ip == start {
			break
		}
	}
	return netip.Addr{}, false
}

// Update changes a stored attachment's details (not its key or address).
func (p *Pool) Update(a Attachment) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.byKey[a.Key]
	if old == nil || !slices.Equal(old.IPs, a.IPs) {
		return fmt.Errorf("attachment %s with %v not found", a.Key, a.IPs)
	}
	prev := *old
	*old = a
	if err := p.save(); err != nil {
		*old = prev
		return err
	}
	p.publish()
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
	for _, ip := range a.IPs {
		delete(p.byIP, ip)
	}
	if err := p.save(); err != nil {
		p.byKey[k] = a
		for _, ip := range a.IPs {
			p.byIP[ip] = a
		}
		return Attachment{}, false, err
	}
	p.publish()
	return *a, true, nil
}

// publish renews what At reads (p.mu held, or p not yet shared).
func (p *Pool) publish() {
	at := make(map[netip.Addr]Attachment, len(p.byIP))
	for ip, a := range p.byIP {
		at[ip] = *a
	}
	p.at.Store(&at)
}

// At is the attachment with address ip, as the last change left it: it
// never waits for a change under way.
func (p *Pool) At(ip netip.Addr) (Attachment, bool) {
	a, ok := (*p.at.Load())[ip]
	return a, ok
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

// List returns every attachment, ordered by first address; never nil.
func (p *Pool) List() []Attachment {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Attachment, 0, len(p.byKey))
	for _, a := range p.sorted() {
		out = append(out, *a)
	}
	return out
}

// sorted is every attachment, by first address.
func (p *Pool) sorted() []*Attachment {
	out := make([]*Attachment, 0, len(p.byKey))
	for _, a := range p.byKey {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IPs[0].Less(out[j].IPs[0]) })
	return out
}

// save writes the state to a temporary file, syncs it and renames it over
// the old one, so a crash leaves either the old or the new state.
func (p *Pool) save() error {
	st := state{CIDRs: p.cidrs, Lasts: p.last, Attachments: p.sorted()}
	if i := slices.IndexFunc(p.cidrs, func(c netip.Prefix) bool { return c.Addr().Is4() }); i >= 0 {
		st.CIDR, st.Last = p.cidrs[i], p.last[i]
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p.path, data, 0o600)
}
