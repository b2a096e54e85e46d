/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing shared by the programs: direct packet access only. */
#ifndef __ONC_PARSE_H
#define __ONC_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "fastpath.h"

struct vxlanhdr {
	__be32 flags;
	__be32 vni; /* VNI << 8 */
};

/* An IPv4 or IPv6 TCP or UDP packet (parse_l4, parse_l4_6): ip or ip6 is
 * its IP header, the other NULL. */
struct l4 {
	struct iphdr *ip;
	struct ipv6hdr *ip6;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags; /* FIN 0x01, SYN 0x02, RST 0x04; 0 for UDP */
	__u8 syn_ack;   /* SYN and ACK alone: the reply to a connection's SYN */
	struct tcp_seg seg; /* TCP's; for UDP only flags, 0 */
};

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
/* Flags conntrack must see: their packets always take the stack. */
#define TCP_CTL (TCP_FIN | TCP_SYN | TCP_RST)

/* parse_ports fills p from the TCP or UDP header at l4hdr (proto), whose
 * segment is payload bytes long with its header; 0 on success. */
static __always_inline int parse_ports(void *l4hdr, void *end, __u8 proto, __u32 payload, struct l4 *p)
{
	p->proto = proto;
	if (proto == IPPROTO_TCP) {
		struct tcphdr *t = l4hdr;
		__u8 flags;

		if ((void *)(t + 1) > end)
			return -1;
		flags = ((__u8 *)t)[13];
		p->sport = t->source;
		p->dport = t->dest;
		p->tcp_flags = flags & TCP_CTL;
		p->syn_ack = p->tcp_flags == TCP_SYN && (flags & TCP_ACK);
		p->seg.seq = bpf_ntohl(t->seq);
		p->seg.ack = bpf_ntohl(t->ack_seq);
		p->seg.len = payload - t->doff * 4;
		p->seg.flags = flags;
		return 0;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *u = l4hdr;

		if ((void *)(u + 1) > end)
			return -1;
		p->sport = u->source;
		p->dport = u->dest;
		p->tcp_flags = 0;
		p->syn_ack = 0;
		p->seg.flags = 0;
		return 0;
	}
	return -1;
}

/* parse_l4 returns 0 when data+off holds an unfragmented IPv4 TCP/UDP
 * packet without IP options, filling p. */
static __always_inline int parse_l4(void *data, void *end, __u32 off, struct l4 *p)
{
	struct iphdr *ip = data + off;

	if ((void *)(ip + 1) > end)
		return -1;
	if (ip->ihl != 5 || ip->version != 4)
		return -1;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF or offset */
		return -1;
	p->ip = ip;
	p->ip6 = NULL;
	return parse_ports(ip + 1, end, ip->protocol, (__u32)bpf_ntohs(ip->tot_len) - sizeof(*ip), p);
}

/* parse_l4_6 returns 0 when data+off holds an IPv6 packet whose TCP or UDP
 * header follows the fixed header: no extension header, so no fragment
 * (those take the slow path), filling p. */
static __always_inline int parse_l4_6(void *data, void *end, __u32 off, struct l4 *p)
{
	struct ipv6hdr *ip6 = data + off;

	if ((void *)(ip6 + 1) > end || ip6->version != 6)
		return -1;
	p->ip = NULL;
	p->ip6 = ip6;
	return parse_ports(ip6 + 1, end, ip6->nexthdr, bpf_ntohs(ip6->payload_len), p);
}

/*
 * May a marked packet teach the cache its direction? Data and pure ACKs
 * may, and so may a SYN-ACK: conntrack marks it ESTABLISHED (it is the
 * reply its entry waited for), so both nodes learn a connection's reply
 * direction at the handshake and its first request and response already
 * take the fast path. The handshake's last ACK still goes slow (it is the
 * other direction's first marked packet), so each node's conntrack sees
 * the whole handshake. SYN, FIN and RST teach nothing.
 */
static __always_inline int learnable(const struct l4 *p)
{
	return !p->tcp_flags || p->syn_ack;
}

/* flow_out is the key of a packet a local pod sends (local = source). */
static __always_inline void flow_out(struct flow_key *k, const struct l4 *p)
{
	k->local_ip = p->ip->saddr;
	k->remote_ip = p->ip->daddr;
	k->local_port = p->sport;
	k->remote_port = p->dport;
	k->proto = p->proto;
}

/* flow_in is the key of a packet a local pod receives (local = destination). */
static __always_inline void flow_in(struct flow_key *k, const struct l4 *p)
{
	k->local_ip = p->ip->daddr;
	k->remote_ip = p->ip->saddr;
	k->local_port = p->dport;
	k->remote_port = p->sport;
	k->proto = p->proto;
}

/* flow6_out and flow6_in are flow_out's and flow_in's IPv6 keys. */
static __always_inline void flow6_out(struct flow_key6 *k, const struct l4 *p)
{
	__builtin_memcpy(k->local_ip, &p->ip6->saddr, sizeof(k->local_ip));
	__builtin_memcpy(k->remote_ip, &p->ip6->daddr, sizeof(k->remote_ip));
	k->local_port = p->sport;
	k->remote_port = p->dport;
	k->proto = p->proto;
}

static __always_inline void flow6_in(struct flow_key6 *k, const struct l4 *p)
{
	__builtin_memcpy(k->local_ip, &p->ip6->daddr, sizeof(k->local_ip));
	__builtin_memcpy(k->remote_ip, &p->ip6->saddr, sizeof(k->remote_ip));
	k->local_port = p->dport;
	k->remote_port = p->sport;
	k->proto = p->proto;
}

/* An Ethernet frame carrying IPv4 at data. */
static __always_inline int is_ipv4(void *data, void *end)
{
	struct ethhdr *eth = data;

	return (void *)(eth + 1) <= end && eth->h_proto == bpf_htons(ETH_P_IP);
}

/* An Ethernet frame carrying IPv6 at data. */
static __always_inline int is_ipv6(void *data, void *end)
{
	struct ethhdr *eth = data;

	return (void *)(eth + 1) <= end && eth->h_proto == bpf_htons(ETH_P_IPV6);
}

/* parse_vxlan checks data holds outer Ethernet/IPv4/UDP to our port with
 * our VNI; it returns the outer IP header or NULL. */
static __always_inline struct iphdr *parse_vxlan(void *data, void *end)
{
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct udphdr *udp;
	struct vxlanhdr *vx;

	if (!is_ipv4(data, end))
		return NULL;
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return NULL;
	if (ip->frag_off & bpf_htons(0x3fff))
		return NULL;
	udp = (void *)(ip + 1);
	vx = (void *)(udp + 1);
	if ((void *)(vx + 1) > end)
		return NULL;
	if (udp->dest != onc_vxlan_port || vx->vni != bpf_htonl(onc_vni << 8))
		return NULL;
	return ip;
}

/* ip_dec_ttl lowers the TTL by one as a forwarding hop does, keeping the
 * checksum right (RFC 1624). */
static __always_inline void ip_dec_ttl(struct iphdr *ip)
{
	__u32 check = (__u32)ip->check;

	check += (__u32)bpf_htons(0x0100);
	ip->check = (__sum16)(check + (check >= 0xFFFF));
	--ip->ttl;
}

/* The IPv6 traffic class: the byte IPv4 calls TOS. */
static __always_inline __u8 ip6_tclass(const struct ipv6hdr *ip6)
{
	return ip6->priority << 4 | ip6->flow_lbl[0] >> 4;
}

#endif /* __ONC_PARSE_H */
