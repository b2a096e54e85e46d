package fastpath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Mode is how programs are attached to interfaces.
type Mode string

const (
	// ModeAuto uses tcx and falls back to clsact if the kernel lacks it.
	ModeAuto Mode = "auto"
	// ModeTCX attaches tcx links (Linux 6.6+), pinned so they outlive the agent.
	ModeTCX Mode = "tcx"
	// ModeClsact attaches direct-action filters to a clsact qdisc; they
	// outlive the agent by themselves.
	ModeClsact Mode = "clsact"
)

func resolveMode(m Mode) (Mode, error) {
	switch m {
	case "", ModeAuto, ModeTCX:
		return ModeTCX, nil
	case ModeClsact:
		return ModeClsact, nil
	}
	return "", fmt.Errorf("attach mode %q: must be auto, tcx or clsact", m)
}

type direction struct {
	name   string
	attach ebpf.AttachType
	parent uint32
}

var (
	ingress = direction{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS}
	egress  = direction{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS}
)

// AttachUplink puts the ingress fast path and egress learning on the uplink.
func (d *Datapath) AttachUplink(ifname string) error {
	if err := d.attach(ifname, ingress, d.progs.OncIngressFast); err != nil {
		return err
	}
	return d.attach(ifname, egress, d.progs.OncLearnEgress)
}

// AttachPod puts the egress fast path and ingress learning on a pod's host veth.
func (d *Datapath) AttachPod(hostIface string) error {
	if err := d.attach(hostIface, ingress, d.progs.OncEgressFast); err != nil {
		return err
	}
	return d.attach(hostIface, egress, d.progs.OncLearnIngress)
}

// DetachPod forgets a pod's links. The kernel detaches them when the veth
// goes; this removes the pins.
func (d *Datapath) DetachPod(hostIface string) error {
	var errs []error
	for _, dir := range []direction{ingress, egress} {
		if err := os.Remove(d.linkPin(hostIface, dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// linkPin is flat in the pin directory: the kernel refuses pins in
// subdirectories made with mkdir(2) on this bpffs.
func (d *Datapath) linkPin(ifname string, dir direction) string {
	return filepath.Join(d.opts.PinDir, "link_"+ifname+"_"+dir.name)
}

func (d *Datapath) attach(ifname string, dir direction, prog *ebpf.Program) error {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attach to %s: %w", ifname, err)
	}
	if d.mode == ModeTCX {
		err := d.attachTCX(l.Attrs().Index, d.linkPin(ifname, dir), dir, prog)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		slog.Warn("kernel has no tcx; attaching with clsact instead")
		d.mode = ModeClsact
	}
	return attachClsact(l, dir, prog)
}

// attachTCX adopts the pinned link (swapping in the new program, which is
// atomic: no packet misses a program) or attaches and pins a new one.
func (d *Datapath) attachTCX(ifindex int, pin string, dir direction, prog *ebpf.Program) error {
	// An error only leaves a stale pin (of an interface that is gone),
	// which the new link's pin replaces.
	if adopted, _ := bpf.AdoptPinnedLink(pin, func(info *link.Info) bool {
		return info.TCX() != nil && int(info.TCX().Ifindex) == ifindex
	}, prog); adopted {
		return nil
	}
	// First in line: a program before ours returning TCX_PASS would let a
	// frame skip the overlay guard.
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: dir.attach, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("tcx %s on ifindex %d: %w", dir.name, ifindex, err)
	}
	defer l.Close()
	_ = os.Remove(pin)
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	return nil
}

func attachClsact(l netlink.Link, dir direction, prog *ebpf.Program) error {
	qdisc := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("clsact on %s: %w", l.Attrs().Name, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: dir.parent, Handle: 1,
			Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd: prog.FD(), Name: "onc-" + dir.name, DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("clsact %s filter on %s: %w", dir.name, l.Attrs().Name, err)
	}
	return nil
}
