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

/* The outer header as the egress program uses it: the fields it rewrites
 * per packet (IP length, id, checksum, ECN bits, which the kernel copies
 * from each inner packet; UDP source port, length, checksum) are zeroed,
 * so two packets to one node give the same template. */
static __always_inline void encap_template(struct encap_val *e)
{
	struct iphdr *ip = (void *)(e->hdr + sizeof(struct ethhdr));
	struct udphdr *udp = (void *)(ip + 1);

	ip->tos &= ~ONC_ECN_MASK;
	ip->tot_len = 0;
	ip->id = 0;
	ip->check = 0;
	udp->source = 0;
	udp->len = 0;
	udp->check = 0;
}

static __always_inline int encap_equal(const struct encap_val *a, const struct encap_val *b)
{
	const __u32 *x = (const void *)a->hdr, *y = (const void *)b->hdr;

#pragma unroll
	for (int i = 0; i < ONC_HDR_LEN / 4; i++)
		if (x[i] != y[i])
			return 0;
	return a->ifindex == b->ifindex;
}

SEC("tc")
int onc_learn_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct onc_config *cfg = config();
	struct egress_val dst = {}, *cur_dst;
	struct encap_val encap = {}, *cur_encap;
	struct flow_key key = {};
	struct cidr_val *peer;
	struct iphdr *outer;
	int wrote = 0;
	struct l4 p;

	if (!cfg || !(skb->mark & cfg->mark))
		return TC_ACT_OK;
	skb->mark &= ~cfg->mark; /* ONC's bit never leaves the node */
	/* Off, the fast path learns nothing (it flushes when switched on). */
	if (!cfg->enabled)
		return TC_ACT_OK;
	outer = parse_vxlan(data, end, cfg);
	if (!outer || !is_ipv4(data + ONC_ENCAP_LEN, end) || parse_l4(data, end, ONC_HDR_LEN, &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(STAT_LEARN_PAUSED);
		return TC_ACT_OK;
	}
	if (!learnable(&p))
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
	encap_template(&encap);
	encap.ifindex = skb->ifindex;
	/* Each write only when it changes (see flow_learn). */
	cur_encap = bpf_map_lookup_elem(&onc_encap, &dst.node_ip);
	if (!cur_encap || !encap_equal(cur_encap, &encap)) {
		bpf_map_update_elem(&onc_encap, &dst.node_ip, &encap, BPF_ANY);
		wrote = 1;
	}
	cur_dst = bpf_map_lookup_elem(&onc_egress, &p.ip->daddr);
	if (!cur_dst || cur_dst->node_ip != dst.node_ip) {
		bpf_map_update_elem(&onc_egress, &p.ip->daddr, &dst, BPF_ANY);
		wrote = 1;
	}
	flow_out(&key, &p);
	wrote |= flow_learn(&key, cfg->epoch, 1);
	count(wrote ? STAT_LEARN_EGRESS : STAT_LEARN_KNOWN);
	return TC_ACT_OK;
}
