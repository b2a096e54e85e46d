package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// decapFlagIPv6 is bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_IPV6
// (Linux 6.3), as include/fastpath.h names it ONC_ADJ_ROOM_DECAP_L3_IPV6.
const decapFlagIPv6 = 1 << 8

// DecapSetsIPv6 reports whether this kernel's bpf_skb_adjust_room takes
// the flag that gives a decapsulated IPv6 packet IPv6's skb protocol.
// Without it the ingress program hands a peer's IPv6 packets to the pod's
// veth (bpf_redirect), whose crossing sets the protocol, instead of
// straight into the pod (bpf_redirect_peer). Probed once: a tc program
// shrinks a frame with the flag, which an older kernel refuses (EINVAL).
var DecapSetsIPv6 = sync.OnceValues(probeDecapIPv6)

// decapProbe is what Open asks; tests stand in for an older kernel.
var decapProbe = DecapSetsIPv6

func probeDecapIPv6() (bool, error) {
	const fixedGSO, adjRoomMAC, encapLen = 1, 1, 50
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			// r1 holds the skb already.
			asm.Mov.Imm(asm.R2, -encapLen),
			asm.Mov.Imm(asm.R3, adjRoomMAC),
			asm.Mov.Imm(asm.R4, fixedGSO|decapFlagIPv6),
			asm.FnSkbAdjustRoom.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return false, fmt.Errorf("probe bpf_skb_adjust_room's IPv6 decapsulation: %w", err)
	}
	defer prog.Close()
	// Ethernet, IPv4 (20 bytes), then room for what the shrink removes
	// and an inner IPv6 header.
	frame := make([]byte, 14+20+encapLen+40)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	frame[14] = 0x45
	binary.BigEndian.PutUint16(frame[16:], uint16(len(frame)-14))
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		return false, fmt.Errorf("probe bpf_skb_adjust_room's IPv6 decapsulation: %w", err)
	}
	const einval = -22
	switch int32(ret) {
	case 0:
		return true, nil
	case einval:
		return false, nil
	}
	return false, errors.New("probe bpf_skb_adjust_room's IPv6 decapsulation: unexpected result " + fmt.Sprint(int32(ret)))
}
