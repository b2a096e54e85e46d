/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The overlay guard: who may send VXLAN frames to this node.
 *
 * The kernel's VXLAN device decapsulates whatever reaches its UDP port and
 * delivers the inner packet with the source its sender wrote; nothing after
 * it (routing, policy, conntrack) knows who built the frame. So every frame
 * for the port is judged on the uplink before the kernel sees it, with the
 * fast path on or off: it must come whole from a peer's tunnel endpoint to
 * this node's, carry our VNI and an IPv4 packet whose source that peer may
 * speak for (onc_senders) and whose destination is this node's pod CIDR
 * or this node.
 * And no pod may send to the port at all: its frame would leave
 * masqueraded as its node, a trusted sender. (Frames by another interface,
 * and ones address translation sends to the port, netfilter drops:
 * datapath/netfilter.)
 */
#ifndef __ONC_OVERLAY_H
#define __ONC_OVERLAY_H

#include "fastpath.h"
#include "parse.h"

struct vlanhdr {
	__be16 tci;
	__be16 proto;
};

/* What the guard reads: up to two VLAN tags, the outer IPv4 header with
 * options, UDP and VXLAN, the inner Ethernet and IPv4 headers. */
#define ONC_GUARD_LEN (sizeof(struct ethhdr) + 2 * sizeof(struct vlanhdr) + 60 + \
		       sizeof(struct udphdr) + sizeof(struct vxlanhdr) + \
		       sizeof(struct ethhdr) + sizeof(struct iphdr))

/*
 * guard_pull makes the headers the guard reads linear: a driver (or a
 * crafted packet) may leave them in fragments, where direct packet access
 * cannot see them and a frame would pass as not VXLAN. Most packets have
 * them linear already and cost one comparison.
 */
static __always_inline void guard_pull(struct __sk_buff *skb)
{
	__u32 linear = skb->data_end - skb->data;

	if (linear < ONC_GUARD_LEN && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < ONC_GUARD_LEN ? skb->len : ONC_GUARD_LEN);
}

/*
 * frame_ipv4 returns the IPv4 header of an Ethernet frame at data, past up
 * to two VLAN tags left in the data (the kernel takes one tag out of the
 * data before tc, and strips a priority tag of VLAN 0 and a tag under it
 * after), setting *tagged; NULL when it carries no IPv4.
 */
static __always_inline struct iphdr *frame_ipv4(void *data, void *end, int *tagged)
{
	struct ethhdr *eth = data;
	struct vlanhdr *vh;
	void *l3 = eth + 1;
	__be16 proto;

	*tagged = 0;
	if (l3 > end)
		return NULL;
	proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		vh = l3;
		if ((void *)(vh + 1) > end)
			return NULL;
		proto = vh->proto;
		l3 = vh + 1;
		*tagged = 1;
	}
	return proto == bpf_htons(ETH_P_IP) ? l3 : NULL;
}

/* Whether an IPv4 packet at ip is the first (or only) fragment of a UDP
 * datagram to the VXLAN port. */
static __always_inline int to_vxlan_port(struct iphdr *ip, void *end)
{
	struct udphdr *udp;

	if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_UDP)
		return 0;
	/* A later fragment has no port to read; its datagram is judged by
	 * its first fragment, and without that it never reassembles. */
	if (ip->frag_off & bpf_htons(0x1fff))
		return 0;
	udp = (void *)ip + ip->ihl * 4;
	if (ip->ihl < 5 || (void *)(udp + 1) > end)
		return 0;
	return udp->dest == onc_vxlan_port;
}

/*
 * overlay_guard judges a packet arriving on the uplink: 0 to let it on
 * (not for the VXLAN port, or a frame a peer may send), else the counter
 * of the reason to drop it. It may pull data: packet pointers taken before
 * it are void after it.
 */
static __always_inline int overlay_guard(struct __sk_buff *skb)
{
	struct sender_key key = { .prefixlen = 64 };
	struct sender_val *sender;
	struct iphdr *outer, *inner;
	struct vxlanhdr *vx;
	void *data, *end;
	int tagged;

	guard_pull(skb);
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	outer = frame_ipv4(data, end, &tagged);
	if (!outer || !to_vxlan_port(outer, end))
		return 0;
	/* ONC's peers send whole, untagged frames without IP options, to our
	 * endpoint. */
	if (tagged || outer->ihl != 5 || outer->frag_off & bpf_htons(0x2000) ||
	    outer->daddr != onc_node_ip)
		return STAT_OVERLAY_DROP_MALFORMED;
	/* At fixed offsets now (the verifier follows those, not ihl's). */
	vx = data + sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr);
	inner = data + ONC_HDR_LEN;
	if ((void *)(inner + 1) > end || vx->vni != bpf_htonl(onc_vni << 8) ||
	    !is_ipv4(data + ONC_ENCAP_LEN, end))
		return STAT_OVERLAY_DROP_MALFORMED;
	key.peer = outer->saddr;
	key.inner = inner->saddr;
	sender = bpf_map_lookup_elem(&onc_senders, &key);
	if (!sender)
		return STAT_OVERLAY_DROP_UNKNOWN_SENDER;
	if (!sender->may_send)
		return STAT_OVERLAY_DROP_INNER_SOURCE;
	/* Peers send only to our pods (and gateway), and to this node itself
	 * the replies of its host's connections to their pods: anything else
	 * would make this node a relay for them. */
	if ((inner->daddr & onc_pod_mask) != onc_pod_net && inner->daddr != onc_node_ip)
		return STAT_OVERLAY_DROP_INNER_DESTINATION;
	return 0;
}

/* from_pod_to_vxlan says whether a packet a pod sends is for a VXLAN port.
 * It may pull data, as overlay_guard does. */
static __always_inline int from_pod_to_vxlan(struct __sk_buff *skb)
{
	void *data, *end;
	struct iphdr *ip;
	int tagged;

	guard_pull(skb);
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip = frame_ipv4(data, end, &tagged);
	return ip && to_vxlan_port(ip, end);
}

#endif /* __ONC_OVERLAY_H */
