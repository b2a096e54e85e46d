//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Egress learning: tc egress of the uplink, after the kernel's VXLAN device
 * encapsulated a packet. If the slow path marked its inner packet as part of
 * an ESTABLISHED flow from a local pod to a fast-path peer, remember the
 * destination's node and the headers, and that the flow may leave.
 */
#include "include/onc.h"
#include "include/parse.h"

SEC("tc")
int onc_learn_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct onc_config *cfg = config();
	struct egress_val dst = {};
	struct encap_val encap = {};
	struct flow_key key = {};
	struct cidr_val *peer;
	struct iphdr *outer;
	struct l4 p;

	if (!cfg || !(skb->mark & cfg->mark))
		return TC_ACT_OK;
	skb->mark &= ~cfg->mark; /* ONC's bit never leaves the node */
	outer = parse_vxlan(data, end, cfg);
	if (!outer || !is_ipv4(data + ONC_ENCAP_LEN, end) || parse_l4(data, end, ONC_HDR_LEN, &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(STAT_LEARN_PAUSED);
		return TC_ACT_OK;
	}
	if (p.tcp_flags)
		return TC_ACT_OK;
	/* Only pod-to-pod flows to a fast-path peer, sent to its owner. */
	if (!bpf_map_lookup_elem(&onc_local, &p.ip->saddr) || is_host(p.ip->daddr))
		return TC_ACT_OK;
	peer = peer_of(p.ip->daddr);
	if (!peer || peer->node_ip != outer->daddr)
		return TC_ACT_OK;

	dst.node_ip = outer->daddr;
	if (bpf_skb_load_bytes(skb, 0, encap.hdr, ONC_HDR_LEN))
		return TC_ACT_OK;
	encap.ifindex = skb->ifindex;
	bpf_map_update_elem(&onc_encap, &dst.node_ip, &encap, BPF_ANY);
	bpf_map_update_elem(&onc_egress, &p.ip->daddr, &dst, BPF_ANY);

	flow_out(&key, &p);
	flow_learn(&key, cfg->epoch, 1);
	count(STAT_LEARN_EGRESS);
	return TC_ACT_OK;
}
