/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing shared by the programs: direct packet access only. */
#ifndef __ONC_PARSE_H
#define __ONC_PARSE_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "fastpath.h"

struct vxlanhdr {
	__be32 flags;
	__be32 vni; /* VNI << 8 */
};

/* An IPv4 TCP or UDP packet whose IP header starts at off. */
struct l4 {
	struct iphdr *ip;
	__be16 sport;
	__be16 dport;
	__u8 tcp_flags; /* FIN 0x01, SYN 0x02, RST 0x04; 0 for UDP */
	__u8 syn_ack;   /* SYN and ACK alone: the reply to a connection's SYN */
	struct tcp_seg seg; /* TCP only */
};

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
/* Flags conntrack must see: their packets always take the stack. */
#define TCP_CTL (TCP_FIN | TCP_SYN | TCP_RST)

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
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *t = (void *)(ip + 1);
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
		p->seg.len = (__u32)bpf_ntohs(ip->tot_len) - sizeof(*ip) - t->doff * 4;
		p->seg.flags = flags;
		return 0;
	}
	if (ip->protocol == IPPROTO_UDP) {
		struct udphdr *u = (void *)(ip + 1);

		if ((void *)(u + 1) > end)
			return -1;
		p->sport = u->source;
		p->dport = u->dest;
		p->tcp_flags = 0;
		p->syn_ack = 0;
		return 0;
	}
	return -1;
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
	k->proto = p->ip->protocol;
}

/* flow_in is the key of a packet a local pod receives (local = destination). */
static __always_inline void flow_in(struct flow_key *k, const struct l4 *p)
{
	k->local_ip = p->ip->daddr;
	k->remote_ip = p->ip->saddr;
	k->local_port = p->dport;
	k->remote_port = p->sport;
	k->proto = p->ip->protocol;
}

/* An Ethernet frame carrying IPv4 at data. */
static __always_inline int is_ipv4(void *data, void *end)
{
	struct ethhdr *eth = data;

	return (void *)(eth + 1) <= end && eth->h_proto == bpf_htons(ETH_P_IP);
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

#endif /* __ONC_PARSE_H */
