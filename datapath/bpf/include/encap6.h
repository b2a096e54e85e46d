/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The fast path over an IPv6 underlay (fastpath.c): where IPv6 pods'
 * packets go when the tunnel endpoints are IPv6 addresses, and the
 * encapsulation in the outer IPv6 header the kernel's VXLAN device put on
 * earlier packets to the same node (encap.h does the same for IPv4).
 *
 * The maps mirror onc_peers6, onc_egress6 and onc_encap with a peer's
 * IPv6 endpoint where those hold an IPv4 one: maps of their own, since
 * those are pinned (see onc_senders6 in fastpath.h). The fast path's
 * object owns them; the services object shares them (bpf.FlowCache), to
 * send flows from outside to another node's IPv6 pods. IPv4 pods' packets on an IPv6 underlay take the
 * slow path.
 *
 * The outer UDP checksum is zero, as the kernel's VXLAN device sends it
 * over IPv4 (RFC 6935 and 6936 allow it for tunnels over IPv6): every
 * node's onc.vxlan takes such frames (udp6zerocsumrx, datapath/overlay),
 * and computing it would read each packet whole.
 */
#ifndef __ONC_ENCAP6_H
#define __ONC_ENCAP6_H

#include <linux/ipv6.h>
#include "encap.h"
#include "parse.h"

/* Outer Ethernet + IPv6 + UDP + VXLAN (fixed: peers send no extension
 * header), then the inner Ethernet header. */
#define ONC_ENCAP6_LEN (sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + \
			sizeof(struct udphdr) + sizeof(struct vxlanhdr))
#define ONC_HDR6_LEN (ONC_ENCAP6_LEN + sizeof(struct ethhdr))

#define ENCAP6_FLAGS (BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | \
		      BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH | \
		      BPF_F_ADJ_ROOM_ENCAP_L2(14))

/* The ECN bits of the IPv6 traffic class, where they sit in flow_lbl[0]. */
#define ONC_ECN6_SHIFT 4

/* A peer's IPv6 endpoint -> the headers the kernel put on packets to it. */
struct encap6_val {
	__u8 hdr[ONC_HDR6_LEN];
	__u32 ifindex; /* the uplink they left by */
};

/* Remote IPv6 pod -> the IPv6 endpoint of the node it was last seen behind. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct onc_in6);
	__type(value, struct onc_in6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_egress6_u6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ONC_MAX_NODES);
	__type(key, struct onc_in6);
	__type(value, struct encap6_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_encap_u6 SEC(".maps");

/* IPv6 pod CIDR of a peer that runs the fast path -> its IPv6 endpoint. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, ONC_MAX_NODES);
	__type(key, struct cidr6_key);
	__type(value, struct onc_in6);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_peers6_u6 SEC(".maps");

static __always_inline int addr6_equal(const void *a, const void *b)
{
	const __u32 *x = a, *y = b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

/* The IPv6 endpoint of the fast-path peer whose pod CIDR holds addr, or NULL. */
static __always_inline struct onc_in6 *peer6_u6_of(const struct in6_addr *addr)
{
	struct cidr6_key k = { .prefixlen = 128 };

	__builtin_memcpy(k.addr, addr, sizeof(k.addr));
	return bpf_map_lookup_elem(&onc_peers6_u6, &k);
}

/* parse_vxlan6 is parse_vxlan for an outer IPv6 header with UDP right
 * after it: the outer header, or NULL. */
static __always_inline struct ipv6hdr *parse_vxlan6(void *data, void *end)
{
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	struct udphdr *udp = (void *)(ip6 + 1);
	struct vxlanhdr *vx = (void *)(udp + 1);

	if (!is_ipv6(data, end) || (void *)(vx + 1) > end)
		return NULL;
	if (ip6->nexthdr != IPPROTO_UDP || udp->dest != onc_vxlan_port ||
	    vx->vni != bpf_htonl(onc_vni << 8))
		return NULL;
	return ip6;
}

/*
 * encap_push6 is encap_push with a learned IPv6 header: it fixes the
 * payload length, the ECN bits and the UDP source port, length and
 * checksum (0). Returns 0, or -1 when the packet could not be rewritten
 * (drop it: it may be half done).
 */
static __always_inline int encap_push6(struct __sk_buff *skb, const struct encap6_val *encap, __be16 sport,
				       __u8 ecn)
{
	struct ipv6hdr *oip;
	struct udphdr *oudp;
	void *data, *end;
	__be16 len;

	data = encap_room(skb, ONC_ENCAP6_LEN, ENCAP6_FLAGS, encap->hdr, ONC_HDR6_LEN);
	if (!data)
		return -1;
	end = (void *)(long)skb->data_end;
	oip = data + sizeof(struct ethhdr);
	oudp = (void *)(oip + 1);
	if ((void *)(oudp + 1) > end)
		return -1;
	len = bpf_htons(skb->len - sizeof(struct ethhdr) - sizeof(struct ipv6hdr));
	oip->payload_len = len;
	oip->flow_lbl[0] = (oip->flow_lbl[0] & ~(ONC_ECN_MASK << ONC_ECN6_SHIFT)) | ecn << ONC_ECN6_SHIFT;
	oudp->source = sport;
	oudp->len = len;
	oudp->check = 0;
	return 0;
}

/* The outer header as egress uses it: what encap_push6 writes per packet
 * is zeroed, and so is the flow label (the kernel's device sends a fixed
 * one, 0 unless configured; the fast path sends 0), so that two packets to
 * one node give the same template. */
static __always_inline void encap6_template(struct encap6_val *e)
{
	struct ipv6hdr *ip6 = (void *)(e->hdr + sizeof(struct ethhdr));
	struct udphdr *udp = (void *)(ip6 + 1);

	ip6->flow_lbl[0] &= ~(ONC_ECN_MASK << ONC_ECN6_SHIFT) & 0xf0;
	ip6->flow_lbl[1] = 0;
	ip6->flow_lbl[2] = 0;
	ip6->payload_len = 0;
	udp->source = 0;
	udp->len = 0;
	udp->check = 0;
}

/* learn_encap6 learns the header of skb, a frame to the IPv6 endpoint
 * node: whether it wrote. */
static __always_inline int learn_encap6(struct __sk_buff *skb, const struct onc_in6 *node)
{
	struct encap6_val encap = {}, *cur;

	if (bpf_skb_load_bytes(skb, 0, encap.hdr, ONC_HDR6_LEN))
		return 0;
	encap6_template(&encap);
	encap.ifindex = skb->ifindex;
	cur = bpf_map_lookup_elem(&onc_encap_u6, node);
	if (cur && cur->ifindex == encap.ifindex && hdr_equal(cur->hdr, encap.hdr, ONC_HDR6_LEN / 4))
		return 0;
	bpf_map_update_elem(&onc_encap_u6, node, &encap, BPF_ANY);
	return 1;
}

#endif /* __ONC_ENCAP6_H */
