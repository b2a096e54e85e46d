/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The overlay guard: who may send VXLAN frames to this node.
 *
 * The kernel's VXLAN device decapsulates whatever reaches its UDP port and
 * delivers the inner packet with the source its sender wrote; nothing after
 * it (routing, policy, conntrack) knows who built the frame. So every frame
 * for the port is judged on the uplink before the kernel sees it, with the
 * fast path on or off: it must come whole from a peer's tunnel endpoint to
 * this node's, over the underlay's family (IPv4, or IPv6), carry our VNI
 * and an IPv4 packet whose source that peer may speak for (onc_senders,
 * or onc_senders_u6 from an IPv6 endpoint) and whose destination is this
 * node's pod CIDR or this node's IPv4 endpoint, or an IPv6 packet whose
 * source that peer may speak for (onc_senders6, onc_senders6_u6) and whose
 * destination is this node's IPv6 pod CIDR or its IPv6 endpoint.
 * And no pod may send to the port at all, over IPv4 or IPv6: its frame
 * would leave masqueraded as its node, a trusted sender. (Frames by
 * another interface, and ones address translation sends to the port,
 * netfilter drops: datapath/netfilter.)
 */
#ifndef __ONC_OVERLAY_H
#define __ONC_OVERLAY_H

#include <linux/ipv6.h>
#include "encap6.h"
#include "fastpath.h"
#include "parse.h"

struct vlanhdr {
	__be16 tci;
	__be16 proto;
};

/* What the guard reads of an outer IPv4 frame: up to two VLAN tags, the
 * IPv4 header with options, UDP and VXLAN, the inner Ethernet and IPv4 or
 * IPv6 header (the longer). A pod's IPv6 packet is shorter than that up
 * to its UDP header, unless extension headers come first (to_vxlan_port6
 * reads those with bpf_skb_load_bytes). */
#define ONC_GUARD_LEN4 (sizeof(struct ethhdr) + 2 * sizeof(struct vlanhdr) + 60 + \
			sizeof(struct udphdr) + sizeof(struct vxlanhdr) + \
			sizeof(struct ethhdr) + sizeof(struct ipv6hdr))
/* And of an outer IPv6 frame, untagged with UDP right after the fixed
 * header (anything else is dropped before the inner headers are read). */
#define ONC_GUARD_LEN6 (ONC_HDR6_LEN + sizeof(struct ipv6hdr))
#define ONC_GUARD_LEN (ONC_GUARD_LEN4 > ONC_GUARD_LEN6 ? ONC_GUARD_LEN4 : ONC_GUARD_LEN6)

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
 * frame_l3 returns the network header of an Ethernet frame at data, past
 * up to two VLAN tags left in the data (the kernel takes one tag out of
 * the data before tc, and strips a priority tag of VLAN 0 and a tag under
 * it after), setting *proto to its ethertype and *tags to the tags it
 * passed; NULL when the frame is too short for them.
 */
static __always_inline void *frame_l3(void *data, void *end, __be16 *proto, int *tags)
{
	struct ethhdr *eth = data;
	struct vlanhdr *vh;
	void *l3 = eth + 1;

	*tags = 0;
	if (l3 > end)
		return NULL;
	*proto = eth->h_proto;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (*proto != bpf_htons(ETH_P_8021Q) && *proto != bpf_htons(ETH_P_8021AD))
			break;
		vh = l3;
		if ((void *)(vh + 1) > end)
			return NULL;
		*proto = vh->proto;
		l3 = vh + 1;
		(*tags)++;
	}
	return l3;
}

/* guard_frame makes the headers the guard reads linear (guard_pull) and
 * returns the frame's network header as frame_l3 does, setting *data and
 * *end to the skb's data as they are after the pull. */
static __always_inline void *guard_frame(struct __sk_buff *skb, void **data, void **end,
					 __be16 *proto, int *tags)
{
	guard_pull(skb);
	*data = (void *)(long)skb->data;
	*end = (void *)(long)skb->data_end;
	return frame_l3(*data, *end, proto, tags);
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

/* An IPv6 fragment header (RFC 8200 4.5). */
struct ipv6_frag {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset << 3 | M */
	__be32 id;
};

/* The most headers to_vxlan_port6 reads past the fixed header: seven
 * extension headers and UDP (RFC 8200 orders at most six extension
 * headers before the upper layer). */
#define ONC_IPV6_HDRS_MAX 8

/*
 * Whether an IPv6 packet at ip, off bytes into the skb, is the first (or
 * only) fragment of a UDP datagram to the VXLAN port. UDP right after the
 * fixed header is read in place. Otherwise the extension headers the
 * kernel walks before UDP (hop-by-hop, routing, destination options,
 * fragment, AH) are followed with bpf_skb_load_bytes, which reads them
 * wherever they lie in the skb, so none can push the UDP header out of
 * the guard's sight. A datagram whose UDP header cannot be found that way
 * (a first fragment that leaves it to a later one, more headers than
 * ONC_IPV6_HDRS_MAX) counts as for the port: only one whose chain ends in
 * another upper layer is surely not (TCP, ICMPv6, no next header, or ESP,
 * whose sealed payload reaches UDP only through the receiver's key).
 */
static __always_inline int to_vxlan_port6(struct __sk_buff *skb, struct ipv6hdr *ip, void *end,
					  __u32 off)
{
	struct udphdr *udp = (void *)(ip + 1);
	struct ipv6_opt_hdr opt;
	struct ipv6_frag frag;
	__be16 dport;
	__u8 next;

	if ((void *)(ip + 1) > end || ip->version != 6)
		return 0;
	/* Most packets: a datagram too short for its UDP header has no
	 * port, and without a fragment header it is not a fragment. */
	if (ip->nexthdr == IPPROTO_UDP)
		return (void *)(udp + 1) <= end && udp->dest == onc_vxlan_port;
	next = ip->nexthdr;
	off += sizeof(*ip);
	/* A bounded loop the verifier follows: rare, so not unrolled. */
#pragma clang loop unroll(disable)
	for (int i = 0; i < ONC_IPV6_HDRS_MAX; i++) {
		switch (next) {
		case IPPROTO_UDP:
			if (bpf_skb_load_bytes(skb, off + offsetof(struct udphdr, dest), &dport, sizeof(dport)))
				return 1;
			return dport == onc_vxlan_port;
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
		case IPPROTO_AH:
			if (bpf_skb_load_bytes(skb, off, &opt, sizeof(opt)))
				return 1;
			/* AH counts its length in 4-byte words less 2, the
			 * others in 8-byte words less 1. */
			off += next == IPPROTO_AH ? (opt.hdrlen + 2) * 4 : (opt.hdrlen + 1) * 8;
			next = opt.nexthdr;
			break;
		case IPPROTO_FRAGMENT:
			if (bpf_skb_load_bytes(skb, off, &frag, sizeof(frag)))
				return 1;
			/* As for IPv4: a later fragment has no port to read. */
			if (frag.frag_off & bpf_htons(0xfff8))
				return 0;
			next = frag.nexthdr;
			off += sizeof(frag);
			break;
		default:
			return 0;
		}
	}
	return 1;
}

/*
 * This node's IPv6 tunnel endpoint on an IPv6 underlay, all zeros on an
 * IPv4 one (where onc_node_ip, fastpath.h, is set instead, and zero here).
 * The guard reads it, and IPv6's direct server return (services_dsr6.h,
 * which includes this file for it and the IPv6 senders): the objects
 * that declare it are the fast path's and the services one, which gets
 * it with the flow cache's constants.
 */
volatile const __be32 onc_node_ip6[4] = {};

/*
 * The senders of an IPv6 underlay: onc_senders' and onc_senders6's
 * entries keyed by a peer's IPv6 tunnel endpoint, the endpoint alone
 * (prefixlen 128, may_send 0) in both, so that a miss again tells an
 * unknown sender from a known one speaking for others. Maps of their own
 * for the reason onc_senders6 is one (fastpath.h): a pinned map whose
 * layout changed would make an upgrade replace every map.
 */
struct sender_u6_key {
	__u32 prefixlen; /* 128 + the inner prefix's length */
	__u8 peer[16];   /* outer source: the peer's IPv6 tunnel endpoint */
	__be32 inner;    /* inner IPv4 source prefix */
};

struct sender6_u6_key {
	__u32 prefixlen; /* 128 + the inner prefix's length */
	__u8 peer[16];   /* outer source: the peer's IPv6 tunnel endpoint */
	__u8 inner[16];  /* inner IPv6 source prefix */
};

ONC_SENDER_MAP(onc_senders_u6, struct sender_u6_key);

ONC_SENDER_MAP(onc_senders6_u6, struct sender6_u6_key);

/* A frame's outer source: a peer's IPv4 tunnel endpoint ip, or its IPv6
 * one at ip6 (in the frame) when that is not NULL. */
struct guard_peer {
	__be32 ip;
	const struct in6_addr *ip6;
};

/* The sender entry of peer for an inner IPv4 source (NULL: none, not
 * even the endpoint's). */
static __always_inline struct sender_val *sender4_of(const struct guard_peer *peer, __be32 inner)
{
	struct sender_u6_key k6 = { .prefixlen = 128 + 32, .inner = inner };
	struct sender_key k = { .prefixlen = 32 + 32, .peer = peer->ip, .inner = inner };

	if (!peer->ip6)
		return bpf_map_lookup_elem(&onc_senders, &k);
	__builtin_memcpy(k6.peer, peer->ip6, sizeof(k6.peer));
	return bpf_map_lookup_elem(&onc_senders_u6, &k6);
}

/* The same for an inner IPv6 source. */
static __always_inline struct sender_val *sender6_of(const struct guard_peer *peer,
						     const struct in6_addr *inner)
{
	struct sender6_u6_key k6 = { .prefixlen = 128 + 128 };
	struct sender6_key k = { .prefixlen = 32 + 128, .peer = peer->ip };

	if (!peer->ip6) {
		__builtin_memcpy(k.inner, inner, sizeof(k.inner));
		return bpf_map_lookup_elem(&onc_senders6, &k);
	}
	__builtin_memcpy(k6.peer, peer->ip6, sizeof(k6.peer));
	__builtin_memcpy(k6.inner, inner, sizeof(k6.inner));
	return bpf_map_lookup_elem(&onc_senders6_u6, &k6);
}

/* The drop, if any, for a frame whose inner source found sender in a
 * sender map (NULL: no entry, not even the endpoint's). */
static __always_inline int sender_drop(const struct sender_val *sender)
{
	if (!sender)
		return STAT_OVERLAY_DROP_UNKNOWN_SENDER;
	if (!sender->may_send)
		return STAT_OVERLAY_DROP_INNER_SOURCE;
	return 0;
}

/*
 * Whether an inner IPv4 destination is this node's: in its pod CIDR or
 * its IPv4 tunnel endpoint. Peers send only to our pods (and gateway),
 * and to this node itself the replies of its host's connections to their
 * pods: anything else would make this node a relay for them. A node
 * without an IPv4 pod CIDR has an all-zero mask, which would take every
 * address, and one on an IPv6 underlay a zero endpoint: neither counts.
 */
static __always_inline int to_node4(__be32 daddr)
{
	if (onc_pod_mask && (daddr & onc_pod_mask) == onc_pod_net)
		return 1;
	return onc_node_ip && daddr == onc_node_ip;
}

/* guard_inner4 judges peer's inner IPv4 packet at inner. */
static __always_inline int guard_inner4(const struct guard_peer *peer, struct iphdr *inner,
					void *end)
{
	int drop;

	if ((void *)(inner + 1) > end)
		return STAT_OVERLAY_DROP_MALFORMED;
	drop = sender_drop(sender4_of(peer, inner->saddr));
	if (drop)
		return drop;
	if (!to_node4(inner->daddr))
		return STAT_OVERLAY_DROP_INNER_DESTINATION;
	return 0;
}

/* Whether addr is in this node's IPv6 pod CIDR: never when it has none. */
static __always_inline int in_pod6(const struct in6_addr *addr)
{
	if (!onc_pod6_mask[0])
		return 0;
#pragma unroll
	for (int i = 0; i < 4; i++)
		if ((addr->in6_u.u6_addr32[i] & onc_pod6_mask[i]) != onc_pod6_net[i])
			return 0;
	return 1;
}

/* Whether addr is this node's IPv6 tunnel endpoint: never on an IPv4
 * underlay, where it is all zeros. */
static __always_inline int is_node_ip6(const struct in6_addr *addr)
{
	if (!(onc_node_ip6[0] | onc_node_ip6[1] | onc_node_ip6[2] | onc_node_ip6[3]))
		return 0;
#pragma unroll
	for (int i = 0; i < 4; i++)
		if (addr->in6_u.u6_addr32[i] != onc_node_ip6[i])
			return 0;
	return 1;
}

/* guard_inner6 judges peer's inner IPv6 packet at inner. */
static __always_inline int guard_inner6(const struct guard_peer *peer, struct ipv6hdr *inner,
					void *end)
{
	int drop;

	if ((void *)(inner + 1) > end || inner->version != 6)
		return STAT_OVERLAY_DROP_MALFORMED;
	drop = sender_drop(sender6_of(peer, &inner->saddr));
	if (drop)
		return drop;
	/* Only to our pods (and gateway), and to this node's IPv6 endpoint
	 * the replies of its host's connections (on an IPv4 underlay a
	 * node's own address is IPv4). */
	if (!in_pod6(&inner->daddr) && !is_node_ip6(&inner->daddr))
		return STAT_OVERLAY_DROP_INNER_DESTINATION;
	return 0;
}

/* guard_inner judges the inner packet of peer's frame whose inner
 * Ethernet header is eth and network header inner. */
static __always_inline int guard_inner(const struct guard_peer *peer, struct ethhdr *eth,
				       void *inner, void *end)
{
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return guard_inner4(peer, inner, end);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return guard_inner6(peer, inner, end);
	return STAT_OVERLAY_DROP_MALFORMED;
}

/* guard_outer4 judges the frame at data, tags VLAN tags left in it, whose
 * outer IPv4 header is at outer: 0 when it is not for the VXLAN port. */
static __always_inline int guard_outer4(void *data, void *end, struct iphdr *outer, int tags)
{
	struct guard_peer peer = {};
	struct vxlanhdr *vx;
	struct ethhdr *eth;

	if (!to_vxlan_port(outer, end))
		return 0;
	/* ONC's peers send whole, untagged frames without IP options, to our
	 * endpoint; on an IPv6 underlay there is none (a zero onc_node_ip). */
	if (tags || outer->ihl != 5 || outer->frag_off & bpf_htons(0x2000) ||
	    !onc_node_ip || outer->daddr != onc_node_ip)
		return STAT_OVERLAY_DROP_MALFORMED;
	/* At fixed offsets now (the verifier follows those, not ihl's). */
	vx = data + sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr);
	eth = data + ONC_ENCAP_LEN;
	if ((void *)(eth + 1) > end || vx->vni != bpf_htonl(onc_vni << 8))
		return STAT_OVERLAY_DROP_MALFORMED;
	peer.ip = outer->saddr;
	return guard_inner(&peer, eth, data + ONC_HDR_LEN, end);
}

/* guard_outer6 is guard_outer4 for an outer IPv6 header, off bytes into
 * the skb. ONC_GUARD_LEN covers what it reads in place. */
static __always_inline int guard_outer6(struct __sk_buff *skb, void *data, void *end,
					struct ipv6hdr *outer, int tags, __u32 off)
{
	struct guard_peer peer = {};
	struct vxlanhdr *vx;
	struct ethhdr *eth;

	/* Past any extension headers, so that none can hide the port. */
	if (!to_vxlan_port6(skb, outer, end, off))
		return 0;
	/* ONC's peers send untagged frames with UDP right after the fixed
	 * header (no extension header, so no fragment), to our endpoint; on
	 * an IPv4 underlay there is none. */
	if (tags || outer->nexthdr != IPPROTO_UDP || !is_node_ip6(&outer->daddr))
		return STAT_OVERLAY_DROP_MALFORMED;
	vx = data + sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + sizeof(struct udphdr);
	eth = data + ONC_ENCAP6_LEN;
	if ((void *)(eth + 1) > end || vx->vni != bpf_htonl(onc_vni << 8))
		return STAT_OVERLAY_DROP_MALFORMED;
	peer.ip6 = &outer->saddr;
	return guard_inner(&peer, eth, data + ONC_HDR6_LEN, end);
}

/*
 * overlay_guard judges a packet arriving on the uplink: 0 to let it on
 * (not for the VXLAN port, or a frame a peer may send), else the counter
 * of the reason to drop it. Frames of either outer family are judged on
 * every node: one of the family the underlay does not use has no
 * destination here. It may pull data: packet pointers taken before it
 * are void after it.
 */
static __always_inline int overlay_guard(struct __sk_buff *skb)
{
	void *data, *end, *l3;
	__be16 proto;
	int tags;

	l3 = guard_frame(skb, &data, &end, &proto, &tags);
	if (!l3)
		return 0;
	if (proto == bpf_htons(ETH_P_IP))
		return guard_outer4(data, end, l3, tags);
	if (proto == bpf_htons(ETH_P_IPV6))
		return guard_outer6(skb, data, end, l3, tags,
				    sizeof(struct ethhdr) + tags * sizeof(struct vlanhdr));
	return 0;
}

/* from_pod_to_vxlan says whether a packet a pod sends is for a VXLAN port.
 * It may pull data, as overlay_guard does. */
static __always_inline int from_pod_to_vxlan(struct __sk_buff *skb)
{
	void *data, *end, *l3;
	__be16 proto;
	int tags;

	l3 = guard_frame(skb, &data, &end, &proto, &tags);
	if (!l3)
		return 0;
	if (proto == bpf_htons(ETH_P_IP))
		return to_vxlan_port(l3, end);
	if (proto == bpf_htons(ETH_P_IPV6))
		return to_vxlan_port6(skb, l3, end, sizeof(struct ethhdr) + tags * sizeof(struct vlanhdr));
	return 0;
}

#endif /* __ONC_OVERLAY_H */
