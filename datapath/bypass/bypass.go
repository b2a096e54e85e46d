// Package bypass loads and drives the intra-node TCP bypass: a sockops
// program records each ESTABLISHED TCP socket whose two ends are pods of
// this node in a SOCKHASH (one per address family), and an sk_msg program
// on those maps queues each send straight onto the peer socket's receive
// queue, skipping both TCP/IP stacks (datapath/bpf/bypass.c).
//
// Everything is pinned: an agent restart, or the bypass switched off,
// changes nothing for connections already open except that their next
// sends may take the stack. The agent never deletes a live entry: the
// kernel would drop the receiver's unread bypassed bytes with it.
package bypass

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
)

// Mode says which connections between two pods of the node are bypassed.
type Mode string

const (
	// Off bypasses nothing: every byte takes the TCP/IP stack.
	Off Mode = "off"
	// On bypasses every TCP connection between two pods of the node.
	On Mode = "on"
	// Size bypasses one direction of such a connection when its first
	// message is at least MinSize bytes; small messages are cheaper by
	// the stack (docs/bypass.md).
	Size Mode = "size"
)

// Config is the bypass's runtime setting.
type Config struct {
	Mode    Mode
	MinSize uint32 // for Size
}

// ParseConfig reads a setting: "off", "on", or "size" with a minimum of
// at least 1 byte.
func ParseConfig(mode string, minSize uint32) (Config, error) {
	switch m := Mode(mode); m {
	case Off, On:
		return Config{Mode: m}, nil
	case Size:
		if minSize == 0 {
			return Config{}, errors.New("bypass mode size: the minimum size must be at least 1 byte")
		}
		return Config{Mode: m, MinSize: minSize}, nil
	}
	return Config{}, fmt.Errorf("bypass mode %q: must be off, on or size", mode)
}

func (c Config) String() string {
	if c.Mode == Size {
		return "size ≥ " + strconv.FormatUint(uint64(c.MinSize), 10) + " B"
	}
	return string(c.Mode)
}

// Options of the bypass.
type Options struct {
	// PinDir is a directory on a bpffs (the fast path's).
	PinDir string
	// Cgroup is the cgroup v2 directory the sockops program attaches to
	// (the socket LB's, see bpf.ResolveCgroup).
	Cgroup string
	// Events is the fast path's flow cache, whose flow events' ring and
	// budget the programs share (bpf.FlowCache.ShareEvents) to report a
	// connection paired and a direction that fell back; nil: none.
	Events *bpf.FlowCache
}

// Bypass is the loaded bypass.
type Bypass struct {
	opts     Options
	objs     bpf.BypassObjects
	maps     *bpf.BypassMaps
	counters *bpf.Counters

	mu    sync.Mutex
	cfg   Config
	netns map[netip.Addr]string // pod → network namespace path, for Destroy
}

// Open loads the programs, creating or adopting the pinned maps; Attach
// puts them in place. It fails, saying why, on a kernel that lacks what
// the bypass needs to be correct, not only what it needs to load.
func Open(o Options) (*Bypass, error) {
	if err := kernelSupports(); err != nil {
		return nil, err
	}
	if err := bpf.EnsurePinDir(o.PinDir); err != nil {
		return nil, err
	}
	b := &Bypass{opts: o, netns: map[netip.Addr]string{}}
	spec, shared, err := loadSpec(o.Events)
	if err != nil {
		return nil, err
	}
	// An upgrade that changed a map's layout starts afresh. Connections
	// already bypassed keep the old maps through their programs; the old
	// setting goes to off first, so they send by the stack from their next
	// message rather than by a setting nobody controls.
	if err := bpf.LoadPinned("bypass", spec, o.PinDir, &b.objs, shared, func() error { return switchOffPinned(o.PinDir) }); err != nil {
		return nil, err
	}
	b.maps = &b.objs.BypassMaps
	b.counters, err = bpf.NewCounters(b.maps.OncBpStats, spec.Maps[bpf.BypassMapOncBpStats])
	// Only this agent sets the pinned config: a pause an earlier agent
	// left, dying in the middle of a policy change, ends here.
	var cfg Config
	if err == nil {
		cfg, err = b.readConfig()
	}
	if err == nil {
		err = b.setPaused(false)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	b.cfg = cfg
	return b, nil
}

// Cgroup is where the sockops program attaches.
func (b *Bypass) Cgroup() string { return b.opts.Cgroup }

// Attach puts the sockops program on the cgroup and the sk_msg program on
// the map, replacing an earlier agent's. Sockets already in the map keep
// the program they were recorded with.
func (b *Bypass) Attach() error {
	if err := bpf.AttachCgroup(sockopsPin(b.opts.PinDir), b.opts.Cgroup, ebpf.AttachCGroupSockOps, b.objs.OncSockOps); err != nil {
		return fmt.Errorf("bypass sockops: %w", err)
	}
	// Attached to a map, the program lives as long as the map does;
	// attaching again replaces it. One program serves both families'.
	for _, m := range []*ebpf.Map{b.maps.OncBpSock, b.maps.OncBpSock6} {
		err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.FD(), Program: b.objs.OncSkMsg,
			Attach: ebpf.AttachSkMsgVerdict})
		if err != nil {
			return fmt.Errorf("attach the bypass sk_msg program to its map %s: %w", m, err)
		}
	}
	return nil
}

// SetConfig switches the bypass at runtime. Connections opened afterwards
// follow it; switched off, open ones send by the stack from their next
// message on (always safe: the receiver reads bypassed bytes first).
func (b *Bypass) SetConfig(c Config) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, err := b.rawConfig()
	if err != nil {
		return err
	}
	cur.Mode = modeValue[c.Mode]
	cur.MinSize = c.MinSize
	if cur.MaxQueued, err = maxQueued(); err != nil {
		return err
	}
	if err := b.maps.OncBpCfg.Put(uint32(0), cur); err != nil {
		return fmt.Errorf("bypass config: %w", err)
	}
	b.cfg = c
	return nil
}

// Config is the current setting.
func (b *Bypass) Config() Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

// Paused runs fn with recording paused: no socket reaching ESTABLISHED
// meanwhile is bypassed, so a connection judged under old rules cannot
// slip into the map while fn revokes (it stays on the stack, where
// netfilter judges it).
//
// If pausing fails, fn runs all the same (what it does matters more) and
// the error is returned with fn's.
func (b *Bypass) Paused(fn func() error) error {
	if perr := b.setPaused(true); perr != nil {
		return errors.Join(fn(), fmt.Errorf("pause the bypass: %w", perr))
	}
	ferr := fn()
	return errors.Join(ferr, b.setPaused(false))
}

func (b *Bypass) setPaused(p bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, err := b.rawConfig()
	if err != nil {
		return err
	}
	cur.Paused = 0
	if p {
		cur.Paused = 1
	}
	return b.maps.OncBpCfg.Put(uint32(0), cur)
}

// maxQueued bounds what a bypassed receiver may hold unread: as much as
// TCP's receive buffer may grow to (net.ipv4.tcp_rmem's maximum), so the
// bypass never holds more per connection than TCP itself would.
func maxQueued() (uint32, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, fmt.Errorf("net.ipv4.tcp_rmem %q: want three numbers", b)
	}
	v, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("net.ipv4.tcp_rmem: %w", err)
	}
	return uint32(v), nil
}

var modeValue = map[Mode]uint8{Off: 0, On: 1, Size: 2}

func (b *Bypass) rawConfig() (bpf.BypassBpCfg, error) {
	var c bpf.BypassBpCfg
	if err := b.maps.OncBpCfg.Lookup(uint32(0), &c); err != nil {
		return c, fmt.Errorf("bypass config: %w", err)
	}
	return c, nil
}

func (b *Bypass) readConfig() (Config, error) {
	c, err := b.rawConfig()
	if err != nil {
		return Config{}, err
	}
	for m, v := range modeValue {
		if v == c.Mode {
			return Config{Mode: m, MinSize: c.MinSize}, nil
		}
	}
	return Config{Mode: Off}, nil
}

// Remove takes the bypass away from the pins alone (nothing is loaded):
// the pinned setting goes to off first, so connections already bypassed
// send by the stack from their next message, then the sockops link and
// the maps are unpinned. The map lives on, through the programs of the
// sockets in it, until the last of them closes: no unread byte is lost.
// Idempotent.
func Remove(pinDir string) error {
	if err := switchOffPinned(pinDir); err != nil {
		return err
	}
	if err := os.Remove(sockopsPin(pinDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	spec, _, err := loadSpec(nil)
	if err != nil {
		return err
	}
	return bpf.RemoveMapPins(pinDir, spec)
}

// loadSpec is the bypass object's spec with the flow events' maps
// unpinned (the fast path's, never ours to pin or remove) and the
// replacements that share events's.
func loadSpec(events *bpf.FlowCache) (*ebpf.CollectionSpec, map[string]*ebpf.Map, error) {
	spec, err := bpf.LoadBypass()
	if err != nil {
		return nil, nil, err
	}
	shared, err := events.ShareEvents(spec)
	if err != nil {
		return nil, nil, err
	}
	return spec, shared, nil
}

// switchOffPinned zeroes the pinned config, whatever its layout: the mode
// is its first byte in every version, and 0 is off.
func switchOffPinned(pinDir string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpf.BypassMapOncBpCfg), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pinned bypass config: %w", err)
	}
	defer m.Close()
	if err := m.Put(uint32(0), make([]byte, m.ValueSize())); err != nil {
		return fmt.Errorf("switch the pinned bypass off: %w", err)
	}
	return nil
}

func sockopsPin(pinDir string) string { return filepath.Join(pinDir, "link_cgroup_sockops") }

// Close releases this process's handles; pinned maps and links stay.
func (b *Bypass) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.objs.Close()
}
