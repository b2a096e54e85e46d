/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Encapsulation as the kernel's VXLAN device would do it, with the outer
 * headers it put on earlier packets to the same node (onc_encap): for the
 * fast path's pod-to-pod packets (fastpath.c) and the uplink load
 * balancer's packets to a backend on another node (services.c); or with
 * headers built afresh, for direct server return (services_dsr.h).
 */
#ifndef __ONC_ENCAP_H
#define __ONC_ENCAP_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include "fastpath.h"

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
static __always_inline __u32 encap_hash(const struct __sk_buff *skb, __be32 saddr, __be32 daddr,
					__be16 sport, __be16 dport)
{
	__u32 h = skb->hash;

	if (h)
		return h;
	h = saddr * 0x9e3779b1;
	h ^= daddr;
	h ^= ((__u32)sport << 16 | dport) * 0x85ebca6b;
	h ^= h >> 15; /* murmur3's finaliser: every input bit reaches the low bits */
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* An IPv6 address folded to 32 bits for encap_hash. */
static __always_inline __be32 addr6_fold(const struct in6_addr *a)
{
	return a->in6_u.u6_addr32[0] ^ a->in6_u.u6_addr32[1] ^ a->in6_u.u6_addr32[2] ^ a->in6_u.u6_addr32[3];
}

/* The outer UDP source port for a flow's hash, in the range the kernel's
 * VXLAN device picks from. */
static __always_inline __be16 encap_sport(__u32 hash)
{
	return bpf_htons(49152 + (hash % 16384));
}

/* The outer ECN as the kernel's VXLAN device sets it (RFC 6040): the
 * inner packet's, with CE sent as ECT(0). */
static __always_inline __u8 encap_ecn(__u8 inner_tos)
{
	__u8 ecn = inner_tos & ONC_ECN_MASK;

	return ecn == ONC_ECN_MASK ? ONC_ECN_ECT0 : ecn;
}

/* encap_room makes room for len bytes of outer headers (adjust_room's
 * flags) in front of skb's Ethernet frame and writes the learned header
 * hdr (hdr_len bytes: the outer ones and the inner Ethernet header) at
 * its start: the packet's data then, or NULL when it could not be
 * rewritten. */
static __always_inline void *encap_room(struct __sk_buff *skb, __s32 len, __u64 flags, const void *hdr, __u32 hdr_len)
{
	if (bpf_skb_adjust_room(skb, len, BPF_ADJ_ROOM_MAC, flags))
		return NULL;
	if (bpf_skb_store_bytes(skb, 0, hdr, hdr_len, 0))
		return NULL;
	return (void *)(long)skb->data;
}

/* hdr_equal says whether two learned headers of words 32-bit words are
 * the same. */
static __always_inline int hdr_equal(const void *a, const void *b, int words)
{
	const __u32 *x = a, *y = b;

#pragma unroll
	for (int i = 0; i < words; i++)
		if (x[i] != y[i])
			return 0;
	return 1;
}

/*
 * encap_push puts encap's headers in front of the Ethernet frame in skb
 * and fixes what differs per packet: outer IP length, ECN, id and
 * checksum; UDP source port (sport: encap_sport's, to spread flows over
 * the uplink's queues as the kernel does), length, checksum 0. The caller
 * redirects it (to encap->ifindex, for a learned header). Returns 0, or -1
 * when the packet could not be rewritten (drop it: it may be half done).
 */
static __always_inline int encap_push(struct __sk_buff *skb, const struct encap_val *encap, __be16 sport, __u8 ecn)
{
	struct iphdr *oip;
	struct udphdr *oudp;
	void *data, *end;
	__u32 sum = 0;
	__u16 *w;

	data = encap_room(skb, ONC_ENCAP_LEN, ENCAP_FLAGS, encap->hdr, ONC_HDR_LEN);
	if (!data)
		return -1;
	end = (void *)(long)skb->data_end;
	oip = data + sizeof(struct ethhdr);
	oudp = (void *)(oip + 1);
	if ((void *)(oudp + 1) > end)
		return -1;
	oip->tot_len = bpf_htons(skb->len - sizeof(struct ethhdr));
	oip->tos = (oip->tos & ~ONC_ECN_MASK) | ecn;
	oip->id = 0;
	oip->check = 0;
	w = (__u16 *)oip;
#pragma unroll
	for (int i = 0; i < (int)sizeof(struct iphdr) / 2; i++)
		sum += w[i];
	oip->check = csum_fold(sum);
	oudp->source = sport;
	oudp->len = bpf_htons(skb->len - sizeof(struct ethhdr) - sizeof(struct iphdr));
	oudp->check = 0;
	return 0;
}

/* encap_inner_ipv6 marks the inner Ethernet header encap_push wrote as
 * carrying IPv6 (onc_encap stores IPv4's); 0, or -1 as encap_push. */
static __always_inline int encap_inner_ipv6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *inner = data + ONC_ENCAP_LEN;

	if ((void *)(inner + 1) > end)
		return -1;
	inner->h_proto = bpf_htons(ETH_P_IPV6);
	return 0;
}

#endif /* __ONC_ENCAP_H */
