//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Egress fast path: tc ingress of a pod's host-side veth (packets leaving
 * the pod). On a hit the packet gets the outer headers the kernel's VXLAN
 * device put on earlier packets of the same destination and is redirected
 * to the uplink: no routing, no netfilter, no VXLAN device. Whatever the
 * fast path's state, a packet for a VXLAN port is dropped here, before
 * masquerade could make it its node's (overlay.h).
 */
#include "include/onc.h"
#include "include/overlay.h"
#include "include/parse.h"

#define ENCAP_FLAGS (BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | \
		     BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH | \
		     BPF_F_ADJ_ROOM_ENCAP_L2(14))

static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * The hash that picks the outer UDP source port. A TCP socket stamps one
 * on each packet it sends; for anything else (UDP) hash the addresses and
 * ports already parsed, where bpf_get_hash_recalc would run the kernel's
 * flow dissector over the packet again on every hit.
 */
static __always_inline __u32 flow_hash(const struct __sk_buff *skb, const struct l4 *p)
{
	__u32 h = skb->hash;

	if (h)
		return h;
	h = p->ip->saddr * 0x9e3779b1;
	h ^= p->ip->daddr;
	h ^= ((__u32)p->sport << 16 | p->dport) * 0x85ebca6b;
	h ^= h >> 15; /* murmur3's finaliser: every input bit reaches the low bits */
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

SEC("tc")
int onc_egress_fast(struct __sk_buff *skb)
{
	void *data, *end;
	struct onc_config *cfg = config();
	struct encap_val *encap;
	struct egress_val *dst;
	struct local_pod *src;
	struct cidr_val *peer;
	struct flow_key key = {};
	struct iphdr *oip;
	struct udphdr *oudp;
	struct l4 p;
	__u32 hash, sum = 0;
	__u8 ecn;
	__u16 *w;

	if (!cfg)
		return TC_ACT_OK;
	if (from_pod_to_vxlan(skb, cfg)) {
		count(STAT_OVERLAY_DROP_FROM_POD);
		return TC_ACT_SHOT;
	}
	/* After the guard, which may have pulled data. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (!is_ipv4(data, end) || parse_l4(data, end, sizeof(struct ethhdr), &p)) {
		count(STAT_EGRESS_MISS_NOT_IP);
		return TC_ACT_OK;
	}
	if (p.tcp_flags) {
		if (p.tcp_flags & TCP_SYN) {
			flow_out(&key, &p);
			flow_forget(&key);
		}
		count(STAT_EGRESS_MISS_TCP_FLAGS);
		return TC_ACT_OK;
	}
	if (!cfg->enabled) {
		count(STAT_EGRESS_MISS_DISABLED);
		return TC_ACT_OK;
	}
	/* Only the pod behind this veth may use its address: another pod
	 * sending with it would ride that pod's cached flows past policy.
	 * The slow path drops such packets. */
	src = bpf_map_lookup_elem(&onc_local, &p.ip->saddr);
	if (!src || src->ifindex != skb->ifindex) {
		count(STAT_EGRESS_MISS_SPOOF);
		return TC_ACT_OK;
	}
	if (is_host(p.ip->daddr)) {
		count(STAT_EGRESS_MISS_HOST);
		return TC_ACT_OK;
	}
	peer = peer_of(p.ip->daddr);
	if (!peer) {
		count(STAT_EGRESS_MISS_NO_PEER);
		return TC_ACT_OK;
	}
	flow_out(&key, &p);
	if (!flow_allowed(&key, cfg->epoch)) {
		count(STAT_EGRESS_MISS_FLOW);
		return TC_ACT_OK;
	}
	/* The learned node must still own the destination's CIDR: a pod IP
	 * that moved to another node is never sent to the old one. */
	dst = bpf_map_lookup_elem(&onc_egress, &p.ip->daddr);
	if (!dst || dst->node_ip != peer->node_ip) {
		count(STAT_EGRESS_MISS_DEST);
		return TC_ACT_OK;
	}
	encap = bpf_map_lookup_elem(&onc_encap, &dst->node_ip);
	if (!encap) {
		count(STAT_EGRESS_MISS_ENCAP);
		return TC_ACT_OK;
	}
	if (p.ip->ttl <= 1) {
		count(STAT_EGRESS_MISS_TTL); /* the slow path sends time-exceeded */
		return TC_ACT_OK;
	}
	ip_dec_ttl(p.ip);
	/* The outer ECN as the kernel's VXLAN device sets it (RFC 6040): the
	 * inner packet's, with CE sent as ECT(0). */
	ecn = p.ip->tos & ONC_ECN_MASK;
	if (ecn == ONC_ECN_MASK)
		ecn = ONC_ECN_ECT0;

	hash = flow_hash(skb, &p);
	if (bpf_skb_adjust_room(skb, ONC_ENCAP_LEN, BPF_ADJ_ROOM_MAC, ENCAP_FLAGS))
		goto err;
	if (bpf_skb_store_bytes(skb, 0, encap->hdr, ONC_HDR_LEN, 0))
		goto err;

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	oip = data + sizeof(struct ethhdr);
	oudp = (void *)(oip + 1);
	if ((void *)(oudp + 1) > end)
		goto err;
	oip->tot_len = bpf_htons(skb->len - sizeof(struct ethhdr));
	oip->tos = (oip->tos & ~ONC_ECN_MASK) | ecn;
	oip->id = 0;
	oip->check = 0;
	w = (__u16 *)oip;
#pragma unroll
	for (int i = 0; i < (int)sizeof(struct iphdr) / 2; i++)
		sum += w[i];
	oip->check = csum_fold(sum);
	/* Spread flows over the uplink's queues as the kernel does. */
	oudp->source = bpf_htons(49152 + (hash % 16384));
	oudp->len = bpf_htons(skb->len - sizeof(struct ethhdr) - sizeof(struct iphdr));
	oudp->check = 0;

	count(STAT_EGRESS_HIT);
	return bpf_redirect(encap->ifindex, 0);
err:
	count(STAT_EGRESS_ERROR);
	return TC_ACT_SHOT;
}
