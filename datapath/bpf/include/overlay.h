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
 * speak for (onc_senders). And no pod may send to the port at all: its
 * frame would leave masqueraded as its node, a trusted sender.
 */
#ifndef __ONC_OVERLAY_H
#define __ONC_OVERLAY_H

#include "onc.h"
#include "parse.h"

/* The UDP header of an IPv4 packet at ip when it is the first (or only)
 * fragment of a UDP datagram to the VXLAN port, else NULL. */
static __always_inline struct udphdr *to_vxlan_port(struct iphdr *ip, void *end,
						    const struct onc_config *cfg)
{
	struct udphdr *udp;

	if ((void *)(ip + 1) > end || ip->version != 4 || ip->protocol != IPPROTO_UDP)
		return NULL;
	/* A later fragment has no port to read; its datagram is judged by
	 * its first fragment, and without that it never reassembles. */
	if (ip->frag_off & bpf_htons(0x1fff))
		return NULL;
	udp = (void *)ip + ip->ihl * 4;
	if (ip->ihl < 5 || (void *)(udp + 1) > end)
		return NULL;
	return udp->dest == cfg->vxlan_port ? udp : NULL;
}

/*
 * overlay_guard judges a packet arriving on the uplink: 0 to let it on
 * (not for the VXLAN port, or a frame a peer may send), else the counter
 * of the reason to drop it.
 */
static __always_inline int overlay_guard(void *data, void *end, const struct onc_config *cfg)
{
	struct iphdr *outer = data + sizeof(struct ethhdr);
	struct sender_key key = { .prefixlen = 64 };
	struct sender_val *sender;
	struct vxlanhdr *vx;
	struct iphdr *inner;

	if (!is_ipv4(data, end) || !to_vxlan_port(outer, end, cfg))
		return 0;
	/* ONC's peers send whole frames without IP options, to our endpoint. */
	if (outer->ihl != 5 || outer->frag_off & bpf_htons(0x2000) || outer->daddr != cfg->node_ip)
		return STAT_OVERLAY_DROP_MALFORMED;
	/* At fixed offsets now (the verifier follows those, not ihl's). */
	vx = data + sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr);
	inner = data + ONC_HDR_LEN;
	if ((void *)(inner + 1) > end || vx->vni != bpf_htonl(cfg->vni << 8) ||
	    !is_ipv4(data + ONC_ENCAP_LEN, end))
		return STAT_OVERLAY_DROP_MALFORMED;
	key.peer = outer->saddr;
	key.inner = inner->saddr;
	sender = bpf_map_lookup_elem(&onc_senders, &key);
	if (!sender)
		return STAT_OVERLAY_DROP_UNKNOWN_SENDER;
	if (!sender->may_send)
		return STAT_OVERLAY_DROP_INNER_SOURCE;
	return 0;
}

/* from_pod_to_vxlan says whether a packet a pod sends is for a VXLAN port. */
static __always_inline int from_pod_to_vxlan(void *data, void *end, const struct onc_config *cfg)
{
	return is_ipv4(data, end) && to_vxlan_port(data + sizeof(struct ethhdr), end, cfg);
}

#endif /* __ONC_OVERLAY_H */
