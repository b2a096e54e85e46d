/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Services from outside the cluster on the uplink, in IPv6: a packet to
 * an IPv6 NodePort, externalIP or load balancer IP (an LB_SCOPE_UPLINK
 * entry of onc_lb6_svc) gets a backend's address and port before the
 * stack sees it, and replies leaving by the uplink get the frontend's
 * back, as services_uplink.h does for IPv4: the same checks (spoofed
 * sources, loadBalancerSourceRanges), the same flows (one backend per
 * 5-tuple, ClientIP affinity), the same marks for netfilter (ip6tables'
 * MASQUERADE and REJECT rules, datapath/netfilter).
 *
 * The fast path too, as IPv4's: once netfilter let a flow to a backend
 * on this node through ESTABLISHED both ways (ip6tables' marks, the flow
 * cache's verdict in onc_filter6), or the fast path opened its TCP
 * connection (lb6_open), its packets skip the stack both ways
 * (lb6_uplink_fast, lb6_uplink_reply); a flow to a backend on another
 * node does once conntrack holds it established and masqueraded
 * (lb6_to_remote_pod, lb6_uplink_overlay_reply), over IPv4 or IPv6
 * tunnels. But for an entry with LB_SVC_DSR: a flow to a pod on another
 * node is sent to that node directly, never on the fast path, and that
 * node answers the client itself (services_dsr6.h, which includes this
 * file).
 *
 * Only a TCP or UDP header right after the IPv6 header is read: a packet
 * with extension headers (a fragment among them), ICMPv6 (neighbour
 * discovery) and anything else go on untouched.
 *
 * Each program dispatches here on the Ethernet type. The entry points
 * are global functions, which the verifier checks once on their own: the
 * IPv4 programs' paths, and what the verifier spends on them, stay as
 * they were.
 *
 * IPv6 has maps of its own (the IPv4 ones keep their layout, so an
 * upgrade adopts them): flows, source ranges, internal prefixes, ClientIP
 * affinity keyed by the client's address, and counters (named uplink6_*;
 * the fast path's in onc_lb6_uplink_fast_stats).
 */
#ifndef __ONC_SERVICES_UPLINK6_H
#define __ONC_SERVICES_UPLINK6_H

#include <linux/ipv6.h>
#include "overlay.h"
#include "services_dsr.h"
#include "services_uplink.h"

/* Counters of the IPv6 uplink functions (per CPU), named as
 * lb_uplink_stat's slow-path ones with a 6. */
enum lb6_uplink_stat {
	LB_STAT_UPLINK6_TRANSLATED,        /* packets sent to a backend */
	LB_STAT_UPLINK6_NEW_FLOW,          /* flows given a backend */
	LB_STAT_UPLINK6_AFFINITY_HIT,      /* new flows sent to the client's remembered backend */
	LB_STAT_UPLINK6_REFUSED,           /* no backend: left to the REJECT rule */
	LB_STAT_UPLINK6_NO_ENDPOINTS_DROP, /* no backend, DROP_WHEN_EMPTY */
	LB_STAT_UPLINK6_SOURCE_RANGE_DROP, /* client outside loadBalancerSourceRanges */
	LB_STAT_UPLINK6_SPOOFED,           /* source claims a pod or this node */
	LB_STAT_UPLINK6_REVERSED,          /* replies given the frontend's address */
	LB_STAT_UPLINK6_NO_SLOT,           /* a backend slot was missing: dropped */
	LB_STAT_UPLINK6_ERROR,             /* rewriting the packet failed: dropped */
	LB_STAT_UPLINK6_MAX,
};

ONC_COUNTERS(onc_lb6_uplink_stats, lb6_uplink_stat, LB_STAT_UPLINK6_MAX);

/* Counters of the IPv6 fast path from outside (per CPU), named as
 * lb_uplink_stat's fast ones with a 6: a map of their own, so that
 * onc_lb6_uplink_stats keeps its pinned size. */
enum lb6_uplink_fast_stat {
	LB_STAT_UPLINK6_FAST_TO_POD,  /* packets handed straight into a local backend */
	LB_STAT_UPLINK6_FAST_REPLY,   /* replies sent straight out of the uplink */
	LB_STAT_UPLINK6_FAST_TO_REMOTE, /* packets sent straight over the overlay to another node's backend */
	LB_STAT_UPLINK6_FAST_FROM_REMOTE, /* that backend's replies, decapsulated and sent straight out */
	LB_STAT_UPLINK6_LEARNED,      /* a reply taught the flow cache that its flow may leave */
	LB_STAT_UPLINK6_OPEN,         /* SYNs that opened their connection to a local backend on the fast path */
	LB_STAT_UPLINK6_FAST_MAX,
};

ONC_COUNTERS(onc_lb6_uplink_fast_stats, lb6_uplink_fast_stat, LB_STAT_UPLINK6_FAST_MAX);

/* loadBalancerSourceRanges in IPv6: a service's allowed client prefixes. */
struct lb6_src_key {
	__u32 prefixlen; /* 32 (the service id) + the client prefix's length */
	__u32 svc_id;
	__be32 ip[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct lb6_src_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb6_source_ranges SEC(".maps");

/* Sources no IPv6 packet from outside may carry: the cluster's IPv6 pod
 * CIDR and this node's IPv6 addresses. */
struct lb6_internal_key {
	__u32 prefixlen;
	__be32 ip[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 64);
	__type(key, struct lb6_internal_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb6_internal SEC(".maps");

/* A flow through the uplink, both ways, as lb_flow_key (dir: enum
 * lb_flow_dir). */
struct lb6_flow_key {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;
	__u8 pad[2];
};

/* lb_flow's fields in IPv6. */
struct lb6_flow {
	__be32 ip[4]; /* IN: the backend; OUT: the frontend */
	__be16 port;
	__u8 dsr;     /* IN: sent to the backend's node directly (services_dsr6.h) */
	__u8 pad;
	__u32 svc_id; /* IN: a flow of a service since replaced picks again */
	union {
		__u32 ifindex; /* OUT: the uplink replies leave by (the fast path's) */
		__u32 isn;     /* IN: the sequence number of a TCP flow's SYN */
	};
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072); /* 65,536 flows, two entries each */
	__type(key, struct lb6_flow_key);
	__type(value, struct lb6_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb6_flows SEC(".maps");

/* ClientIP affinity from outside: by the client's address, which
 * onc_lb6_aff's key (a network namespace cookie) cannot hold. */
struct lb6_uplink_aff_key {
	__be32 client[4];
	__u32 svc_id;
};

LB_LRU(onc_lb6_uplink_aff, 65536, struct lb6_uplink_aff_key, struct lb6_aff);

/* An IPv6 TCP or UDP packet without extension headers, read with
 * bpf_skb_load_bytes. */
struct lb6_pkt {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 syn; /* TCP, SYN without ACK: a connection's first packet */
	__u8 tcp_flags; /* 0 for UDP */
	__u8 hop_limit;
	__u32 l4off;
	__u8 tclass;
	__u8 pad[3];
	struct tcp_seg seg; /* TCP only */
};

/* lb6_parse_at reads the IPv6 header at l3off: after the outer headers
 * of a peer's frame, whose outer header may be IPv4. */
static __always_inline int lb6_parse_at(struct __sk_buff *skb, __u32 l3off, struct lb6_pkt *p)
{
	struct ipv6hdr ip6;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, l3off, &ip6, sizeof(ip6)))
		return -1;
	/* An extension header (hop-by-hop, routing, a fragment, ...) is
	 * never read past: such a packet is not ours. */
	if (ip6.version != 6 || (ip6.nexthdr != IPPROTO_TCP && ip6.nexthdr != IPPROTO_UDP))
		return -1;
	p->l4off = l3off + sizeof(ip6);
	if (bpf_skb_load_bytes(skb, p->l4off, ports, sizeof(ports)))
		return -1;
	p->tcp_flags = 0;
	if (ip6.nexthdr == IPPROTO_TCP) {
		/* From the sequence number to the flags, as lb_parse_at. */
		struct {
			__be32 seq;
			__be32 ack;
			__u8 doff;
			__u8 flags;
		} t;

		if (bpf_skb_load_bytes(skb, p->l4off + 4, &t, sizeof(t)))
			return -1;
		p->tcp_flags = t.flags;
		p->seg.seq = bpf_ntohl(t.seq);
		p->seg.ack = bpf_ntohl(t.ack);
		p->seg.len = bpf_ntohs(ip6.payload_len) - (t.doff >> 4) * 4;
		p->seg.flags = t.flags;
	}
	p->syn = (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	p->hop_limit = ip6.hop_limit;
	p->tclass = ip6_tclass(&ip6);
	__builtin_memcpy(p->saddr, &ip6.saddr, sizeof(p->saddr));
	__builtin_memcpy(p->daddr, &ip6.daddr, sizeof(p->daddr));
	p->sport = ports[0];
	p->dport = ports[1];
	p->proto = ip6.nexthdr;
	return 0;
}

static __always_inline int lb6_parse(struct __sk_buff *skb, struct lb6_pkt *p)
{
	/* skb->protocol: a VLAN tag left in the data is not ours to read past. */
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return -1;
	return lb6_parse_at(skb, ETH_HLEN, p);
}

/* Whether a new flow goes to its backend's node directly (services_dsr6.h,
 * which includes this file). */
static __always_inline int lb_dsr6_wanted(const struct lb_svc *svc, const __be32 *client, const __be32 *fe,
					  const struct lb6_addr *be);

/*
 * Adds diff, the change of a 16-byte address of the pseudo-header, to the
 * L4 checksum at csum_off. BPF_F_IPV6 (Linux 6.16, and stable kernels
 * since) leaves skb->csum alone, which a NIC's CHECKSUM_COMPLETE sum needs
 * in IPv6 (no L3 checksum moves with the address); an older kernel refuses
 * the flag, and its adjustment of skb->csum is undone.
 */
static __always_inline int lb6_csum_addr(struct __sk_buff *skb, __u32 csum_off, __s64 diff, __u64 flags)
{
	flags |= BPF_F_PSEUDO_HDR;
	if (!bpf_l4_csum_replace(skb, csum_off, 0, diff, flags | BPF_F_IPV6))
		return 0;
	if (bpf_l4_csum_replace(skb, csum_off, 0, diff, flags))
		return -1;
	bpf_csum_update(skb, diff); /* fails unless CHECKSUM_COMPLETE: nothing to undo */
	return 0;
}

/*
 * Rewrites the destination (dst) or source address and port, keeping the
 * TCP/UDP checksum right over the IPv6 pseudo-header. UDP in IPv6 always
 * carries a checksum: one that comes out 0 is written as 0xffff.
 */
static __always_inline int lb6_rewrite(struct __sk_buff *skb, const struct lb6_pkt *p, int dst,
				       const struct lb6_addr *to)
{
	__u32 ip_off = ETH_HLEN + (dst ? offsetof(struct ipv6hdr, daddr) : offsetof(struct ipv6hdr, saddr));
	__u32 port_off = p->l4off + (dst ? offsetof(struct udphdr, dest) : offsetof(struct udphdr, source));
	__u32 csum_off = p->l4off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) :
				     offsetof(struct udphdr, check));
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 | BPF_F_MARK_ENFORCE : 0;
	const __be32 *old_ip = dst ? p->daddr : p->saddr;
	__be16 old_port = dst ? p->dport : p->sport;
	__s64 diff;

	diff = bpf_csum_diff((__be32 *)old_ip, 16, (__be32 *)to->ip, 16, 0);
	if (diff < 0 || lb6_csum_addr(skb, csum_off, diff, mangled))
		return -1;
	if (bpf_l4_csum_replace(skb, csum_off, old_port, to->port, mangled | sizeof(to->port)))
		return -1;
	if (bpf_skb_store_bytes(skb, ip_off, to->ip, sizeof(to->ip), 0))
		return -1;
	return bpf_skb_store_bytes(skb, port_off, &to->port, sizeof(to->port), 0);
}

static __always_inline void lb6_copy(__be32 *to, const __be32 *from)
{
	to[0] = from[0];
	to[1] = from[1];
	to[2] = from[2];
	to[3] = from[3];
}

static __always_inline int lb6_internal(const __be32 *addr)
{
	struct lb6_internal_key key = { .prefixlen = 128 };

	lb6_copy(key.ip, addr);
	return bpf_map_lookup_elem(&onc_lb6_internal, &key) != NULL;
}

static __always_inline int lb6_source_allowed(__u32 svc_id, const __be32 *client)
{
	struct lb6_src_key key = { .prefixlen = 32 + 128, .svc_id = svc_id };

	lb6_copy(key.ip, client);
	return bpf_map_lookup_elem(&onc_lb6_source_ranges, &key) != NULL;
}

/* The flow's entry for a packet of a client, or of a backend's reply. */
static __always_inline struct lb6_flow_key lb6_flow_key(const __be32 *saddr, const __be32 *daddr, __be16 sport,
							 __be16 dport, __u8 proto, __u8 dir)
{
	struct lb6_flow_key key = { .sport = sport, .dport = dport, .proto = proto, .dir = dir };

	lb6_copy(key.saddr, saddr);
	lb6_copy(key.daddr, daddr);
	return key;
}

/* A new flow's backend: the client's remembered one (ClientIP affinity,
 * as lb_pick), else one at random. */
static __always_inline int lb6_pick(const struct lb_svc *svc, const __be32 *client, struct lb6_addr *be)
{
	struct lb6_uplink_aff_key akey = { .svc_id = svc->id };
	struct lb_backend_key slot = { .svc_id = svc->id, .bank = svc->bank };
	__u64 now = bpf_ktime_get_ns();
	struct lb6_aff *aff, put = {};

	lb6_copy(akey.client, client);
	if (svc->flags & LB_SVC_AFFINITY) {
		aff = bpf_map_lookup_elem(&onc_lb6_uplink_aff, &akey);
		if (aff) {
			*be = aff->be;
			if (now - aff->last_ns <= (__u64)svc->aff_timeout * LB_NSEC_PER_SEC &&
			    lb_listed(1, &onc_lb_member, &onc_lb6_member, svc->id, be)) {
				count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_AFFINITY_HIT, 1);
				goto picked;
			}
		}
	}
	slot.slot = bpf_get_prandom_u32() % svc->count;
	if (lb_backend(1, &slot, be))
		return -1;
picked:
	if (svc->flags & LB_SVC_AFFINITY) {
		put.be = *be;
		put.last_ns = now;
		bpf_map_update_elem(&onc_lb6_uplink_aff, &akey, &put, BPF_ANY);
	}
	return 0;
}

/*
 * The flow's backend, as lb_flow_backend: the one it has, else (a TCP
 * flow only at a SYN not sent again, as there) a new pick within the
 * source ranges, recorded both ways (one way for a DSR flow). *dsr says
 * whether the flow goes to its backend's node directly, decided at its
 * first packet.
 */
static __always_inline int lb6_flow_backend(const struct lb6_pkt *p, const struct lb_svc *svc, struct lb6_addr *be,
					    __u8 *dsr)
{
	struct lb6_flow_key in = lb6_flow_key(p->saddr, p->daddr, p->sport, p->dport, p->proto, LB_FLOW_IN), out;
	struct lb6_flow fwd = { .svc_id = svc->id, .isn = p->seg.seq }, rev = { .port = p->dport, .svc_id = svc->id };
	struct lb6_flow *cur = bpf_map_lookup_elem(&onc_lb6_flows, &in);

	if (cur && cur->svc_id == svc->id && (!p->syn || cur->isn == p->seg.seq)) {
		lb6_copy(be->ip, cur->ip);
		be->port = cur->port;
		*dsr = cur->dsr;
		return LB_FLOW_OK;
	}
	if (p->proto == IPPROTO_TCP && !p->syn)
		return LB_FLOW_FOREIGN;
	if ((svc->flags & LB_SVC_SOURCE_RANGES) && !lb6_source_allowed(svc->id, p->saddr))
		return LB_FLOW_OUT_OF_RANGE;
	if (!svc->count)
		return LB_FLOW_EMPTY;
	if (lb6_pick(svc, p->saddr, be)) {
		count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_NO_SLOT, 1);
		return LB_FLOW_ERROR;
	}
	lb6_copy(fwd.ip, be->ip);
	fwd.port = be->port;
	lb6_copy(rev.ip, p->daddr);
	fwd.dsr = lb_dsr6_wanted(svc, p->saddr, p->daddr, be);
	if (!fwd.dsr) {
		out = lb6_flow_key(be->ip, p->saddr, be->port, p->sport, p->proto, LB_FLOW_OUT);
		/* The reply's entry first: the backend may answer before this
		 * program returns. */
		bpf_map_update_elem(&onc_lb6_flows, &out, &rev, BPF_ANY);
	}
	bpf_map_update_elem(&onc_lb6_flows, &in, &fwd, BPF_ANY);
	count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_NEW_FLOW, 1);
	ev_three(EV_UPLINK, 0, 1, p->proto, p->saddr, p->sport, p->daddr, p->dport, be->ip, be->port, 0, 0);
	lb_count_svc(svc->id, 0);
	*dsr = fwd.dsr;
	return LB_FLOW_OK;
}

/*
 * The fast path in IPv6, as services_uplink.h's in IPv4: once netfilter
 * let a flow to a backend on this node through ESTABLISHED both ways (the
 * flow cache's verdict, onc_filter6), or the fast path opened it, its
 * packets skip the stack into the pod, and the pod's replies, which the
 * fast path's egress program passes on (onc_hooks), leave by the uplink
 * at once; a flow to a backend on another node skips it once conntrack
 * holds it established and masqueraded, both ways.
 */

/* A packet lb6_uplink_ingress translated, for lb6_uplink_fast: the
 * packet as it came and its backend; ok 0 when there is none. It lives in
 * the program's frame, so that neither function's frame grows: the
 * verifier allows 512 bytes along a chain of calls. */
struct lb6_xlat {
	struct lb6_pkt p;
	struct lb6_addr be;
	__u8 ok;
	__u8 pad[3];
};

/* The flow cache's key of a flow between a backend pod of this node and a
 * client outside. */
static __always_inline void lb6_cache_key(struct flow_key6 *k, const __be32 *pod, __be16 pod_port,
					  const __be32 *client, __be16 client_port, __u8 proto)
{
	__builtin_memcpy(k->local_ip, pod, sizeof(k->local_ip));
	__builtin_memcpy(k->remote_ip, client, sizeof(k->remote_ip));
	k->local_port = pod_port;
	k->remote_port = client_port;
	k->proto = proto;
}

/* The flow a backend's packet to a client replies to, if any. */
static __always_inline struct lb6_flow *lb6_reply_flow(const __be32 *backend, __be16 backend_port,
							const __be32 *client, __be16 client_port, __u8 proto)
{
	struct lb6_flow_key key = lb6_flow_key(backend, client, backend_port, client_port, proto, LB_FLOW_OUT);

	return bpf_map_lookup_elem(&onc_lb6_flows, &key);
}

/* lb6_dec_hop lowers the hop limit by one, as the forwarding hop the
 * stack would have been (no header checksum in IPv6, but a NIC's
 * CHECKSUM_COMPLETE sum covers the byte: keep it right, for a packet
 * handed into a pod). The caller checked that it is above 1. */
static __always_inline int lb6_dec_hop(struct __sk_buff *skb, const struct lb6_pkt *p)
{
	__u8 hop = p->hop_limit - 1;

	return bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, hop_limit), &hop, sizeof(hop),
				   BPF_F_RECOMPUTE_CSUM);
}

/* lb6_forget is lb_forget in IPv6: a connection that ended on the fast
 * path takes its flow's entries along, both ways. */
static __always_inline void lb6_forget(const __be32 *client, __be16 client_port, const struct lb6_addr *fe,
				       const struct lb6_addr *be, __u8 proto)
{
	struct lb6_flow_key in = lb6_flow_key(client, fe->ip, client_port, fe->port, proto, LB_FLOW_IN);
	struct lb6_flow_key out = lb6_flow_key(be->ip, client, be->port, client_port, proto, LB_FLOW_OUT);

	bpf_map_delete_elem(&onc_lb6_flows, &in);
	bpf_map_delete_elem(&onc_lb6_flows, &out);
}

/* The tunnels are IPv6 (this node's endpoint is onc_node_ip6, overlay.h),
 * else IPv4 (onc_node_ip); neither when the fast path's constants are not
 * set. */
static __always_inline int lb6_underlay6(void)
{
	return !onc_node_ip && (onc_node_ip6[0] | onc_node_ip6[1] | onc_node_ip6[2] | onc_node_ip6[3]);
}

/*
 * lb6_to_remote_pod is lb_to_remote_pod in IPv6 (see it): a translated
 * packet to a backend on another node goes straight over the overlay,
 * once conntrack holds its flow established and masqueraded, with the
 * source MASQUERADE gave it and the outer headers, IPv4 or IPv6 (the
 * underlay's), the VXLAN device put on earlier packets to that node.
 * Returns LB_NEXT when the stack must take it.
 */
static __always_inline int lb6_to_remote_pod(struct __sk_buff *skb, const struct lb6_pkt *p, const struct lb6_addr *be)
{
	struct encap6_val *encap6 = NULL;
	struct encap_val *encap = NULL;
	struct ct6_ends t = {}, reply;
	struct lb6_addr snat = {};
	struct cidr_val *peer;
	struct onc_in6 *peer6;
	__u32 mtu = 0, ifindex, hash;
	__s32 len;

	if (lb6_underlay6()) {
		peer6 = peer6_u6_of((const struct in6_addr *)be->ip);
		encap6 = peer6 ? bpf_map_lookup_elem(&onc_encap_u6, peer6) : NULL;
		if (!encap6)
			return LB_NEXT;
		ifindex = encap6->ifindex;
		len = ONC_ENCAP6_LEN;
	} else {
		peer = peer6_of((const struct in6_addr *)be->ip);
		encap = peer ? bpf_map_lookup_elem(&onc_encap, &peer->node_ip) : NULL;
		if (!encap)
			return LB_NEXT;
		ifindex = encap->ifindex;
		len = ONC_ENCAP_LEN;
	}
	/* Too big for the overlay, or a GRO super-packet: the stack's. */
	if (skb->gso_segs > 1 || bpf_check_mtu(skb, ifindex, &mtu, len, 0))
		return LB_NEXT;
	lb6_copy(t.saddr, p->saddr);
	lb6_copy(t.daddr, be->ip);
	t.sport = p->sport;
	t.dport = be->port;
	if (ct_established6(skb, &t, p->proto, CT_DIR_ORIGINAL, 1, &reply))
		return LB_NEXT;
	lb6_copy(snat.ip, reply.daddr);
	snat.port = reply.dport;
	hash = encap_hash(skb, addr6_fold((const struct in6_addr *)snat.ip), addr6_fold((const struct in6_addr *)be->ip),
			  snat.port, be->port);
	if (lb6_rewrite(skb, p, 0, &snat) || lb6_dec_hop(skb, p))
		goto err;
	if (encap6) {
		if (encap_push6(skb, encap6, encap_sport(hash), encap_ecn(p->tclass)))
			goto err;
	} else if (!encap || encap_push(skb, encap, encap_sport(hash), encap_ecn(p->tclass)) || encap_inner_ipv6(skb)) {
		goto err;
	}
	count(&onc_lb6_uplink_fast_stats, LB_STAT_UPLINK6_FAST_TO_REMOTE, 1);
	return bpf_redirect(ifindex, 0);
err:
	return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
}

/*
 * lb6_open is lb_open in IPv6 (see it): it opens a client's connection to
 * a backend on this node on the fast path (conn_setup.h), k its flow's
 * key, when the reply has a route, whose device the pod's replies leave
 * by. A node as the client needs no exception here, as it does in IPv4:
 * the fast path's egress program passes a pod's IPv6 packet to a node on
 * to the uplink's reply program as it does one to any client.
 */
static __always_inline int lb6_open(struct __sk_buff *skb, const struct flow_key6 *k, __u8 proto,
				    const struct local_pod *pod, __u32 epoch)
{
	struct bpf_fib_lookup fib = {
		.family = ONC_AF_INET6, .l4_protocol = proto, .sport = k->local_port, .dport = k->remote_port,
		.ifindex = pod->ifindex,
	};
	struct lb6_flow *rev;
	int rc;

	__builtin_memcpy(fib.ipv6_src, k->local_ip, sizeof(fib.ipv6_src));
	__builtin_memcpy(fib.ipv6_dst, k->remote_ip, sizeof(fib.ipv6_dst));
	rev = lb6_reply_flow((const __be32 *)k->local_ip, k->local_port, (const __be32 *)k->remote_ip, k->remote_port,
			     proto);
	if (!rev)
		return -1;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	if (rev->ifindex != fib.ifindex)
		rev->ifindex = fib.ifindex;
	return flow6_open(k, epoch, FLOW_OPENED_BY_REMOTE);
}

/*
 * lb6_uplink_fast is lb_fast_path in IPv6 (see it), for the packet
 * lb6_uplink_ingress translated (x): into a backend on this node when the
 * flow cache says netfilter let its flow through ESTABLISHED both ways in
 * this epoch and, for UDP, conntrack still holds it established, or when
 * the fast path opens or opened its TCP connection (lb6_open); to one on
 * another node as lb6_to_remote_pod says, never a TCP SYN, FIN or RST.
 * The packet that ends a connection the fast path opened takes its
 * records along (lb6_forget). Returns LB_NEXT when the stack must take it.
 */
__attribute__((noinline)) int lb6_uplink_fast(struct __sk_buff *skb, struct lb6_xlat *x)
{
	struct lb6_addr fe = {};
	struct flow_key6 key = {};
	struct ct6_ends t = {}, reply;
	struct onc_config *cfg;
	struct local_pod *pod;
	struct flow_val *flow;
	struct lb6_pkt *p;
	int setup;

	if (!x || !x->ok)
		return LB_NEXT;
	p = &x->p;
	lb6_cache_key(&key, x->be.ip, x->be.port, p->saddr, p->sport, p->proto);
	pod = bpf_map_lookup_elem(&onc_local6, key.local_ip);
	/* The masquerade is conntrack's: it sees a remote backend's flows
	 * open and close. */
	if (!pod && (p->tcp_flags & TCP_CTL))
		return LB_NEXT;
	cfg = config();
	setup = flow6_setup(&key, p->tcp_flags & TCP_CTL, p->tcp_flags & TCP_ACK, cfg, 0);
	if (setup == SETUP_SLOW || !cfg || !cfg->enabled || p->hop_limit <= 1)
		return LB_NEXT;
	if (!pod)
		return lb6_to_remote_pod(skb, p, &x->be);
	if (setup == SETUP_OPEN) {
		if (lb6_open(skb, &key, p->proto, pod, cfg->epoch))
			return LB_NEXT;
		flow = NULL;
	} else if (!(flow = filter_allowed(&onc_filter6, &key, cfg->epoch))) {
		return LB_NEXT;
	} else if (p->proto == IPPROTO_UDP) {
		lb6_copy(t.saddr, p->saddr);
		lb6_copy(t.daddr, x->be.ip);
		t.sport = p->sport;
		t.dport = x->be.port;
		if (ct_established6(skb, &t, p->proto, CT_DIR_ORIGINAL, 0, &reply))
			return LB_NEXT;
	}
	if (lb6_dec_hop(skb, p) || bpf_skb_store_bytes(skb, 0, pod->pod_mac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, pod->host_mac, ETH_ALEN, 0)) {
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
	}
	if (p->proto == IPPROTO_TCP && flow6_close_step(&key, flow, 0, &p->seg)) {
		lb6_copy(fe.ip, p->daddr);
		fe.port = p->dport;
		lb6_forget(p->saddr, p->sport, &fe, &x->be, p->proto);
	}
	count(&onc_lb6_uplink_fast_stats, setup == SETUP_OPEN ? LB_STAT_UPLINK6_OPEN : LB_STAT_UPLINK6_FAST_TO_POD, 1);
	return bpf_redirect_peer(pod->ifindex, 0);
}

/* lb6_learn_reply is lb_learn_reply in IPv6 (see it): from a reply the
 * slow path let out by the uplink as part of an ESTABLISHED flow, by
 * which device replies leave, and for a backend on this node that the
 * flow may leave. */
static __always_inline void lb6_learn_reply(struct __sk_buff *skb, const struct lb6_pkt *p, struct lb6_flow *rev)
{
	struct flow_key6 key = {};
	struct onc_config *cfg;

	if (!(skb->mark & onc_mark) || (p->tcp_flags & (TCP_FIN | TCP_RST)))
		return;
	cfg = config();
	if (!cfg || !cfg->enabled || !cfg->learning)
		return;
	if (rev->ifindex != skb->ifindex)
		rev->ifindex = skb->ifindex;
	lb6_cache_key(&key, p->saddr, p->sport, p->daddr, p->dport, p->proto);
	if (!bpf_map_lookup_elem(&onc_local6, key.local_ip))
		return;
	if (filter_learn(&onc_filter6, &key, cfg->epoch, 1))
		count(&onc_lb6_uplink_fast_stats, LB_STAT_UPLINK6_LEARNED, 1);
}

/*
 * onc_uplink_lb_reply for an IPv6 packet (see it): a local backend's
 * reply to a client outside, of a flow established both ways, gets its
 * frontend's address and leaves by the uplink at once. A SYN-ACK, FIN or
 * RST does only in a connection the fast path opened (lb6_open); the
 * packet that ends one takes its records along. Anything else takes the
 * stack.
 */
__attribute__((noinline)) int lb6_uplink_reply(struct __sk_buff *skb)
{
	struct flow_key6 cached = {};
	struct onc_config *cfg;
	struct flow_val *flow;
	struct lb6_flow *rev;
	struct lb6_addr fe = {}, be = {};
	struct lb6_pkt p;
	__u32 ifindex;

	if (lb6_parse(skb, &p) || p.syn || p.hop_limit <= 1)
		return TC_ACT_OK;
	rev = lb6_reply_flow(p.saddr, p.sport, p.daddr, p.dport, p.proto);
	if (!rev || !rev->ifindex)
		return TC_ACT_OK;
	cfg = config();
	if (!cfg || !cfg->enabled)
		return TC_ACT_OK;
	lb6_cache_key(&cached, p.saddr, p.sport, p.daddr, p.dport, p.proto);
	flow = filter_allowed(&onc_filter6, &cached, cfg->epoch);
	if (!flow || ((p.tcp_flags & TCP_CTL) && !flow->opener))
		return TC_ACT_OK;
	lb6_copy(fe.ip, rev->ip);
	fe.port = rev->port;
	ifindex = rev->ifindex;
	if (lb6_rewrite(skb, &p, 0, &fe) || lb6_dec_hop(skb, &p)) {
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
	}
	if (p.proto == IPPROTO_TCP && flow6_close_step(&cached, flow, 1, &p.seg)) {
		lb6_copy(be.ip, p.saddr);
		be.port = p.sport;
		lb6_forget(p.daddr, p.dport, &fe, &be, p.proto);
	}
	count(&onc_lb6_uplink_fast_stats, LB_STAT_UPLINK6_FAST_REPLY, 1);
	return bpf_redirect_neigh(ifindex, NULL, 0, 0);
}

/* lb6_overlay_frame says whether skb, a peer's frame, carries IPv6: over
 * an IPv6 underlay every frame the fast path passes on does. */
static __always_inline int lb6_overlay_frame(struct __sk_buff *skb)
{
	__be16 inner;

	if (lb6_underlay6())
		return 1;
	if (bpf_skb_load_bytes(skb, ONC_ENCAP_LEN + offsetof(struct ethhdr, h_proto), &inner, sizeof(inner)))
		return 0;
	return inner == bpf_htons(ETH_P_IPV6);
}

/* lb6_in_pod_cidr says whether addr is in this node's IPv6 pod CIDR (never,
 * without one: its mask is zero). */
static __always_inline int lb6_in_pod_cidr(const __be32 *addr)
{
	if (!(onc_pod6_mask[0] | onc_pod6_mask[1] | onc_pod6_mask[2] | onc_pod6_mask[3]))
		return 0;
	return (addr[0] & onc_pod6_mask[0]) == onc_pod6_net[0] && (addr[1] & onc_pod6_mask[1]) == onc_pod6_net[1] &&
	       (addr[2] & onc_pod6_mask[2]) == onc_pod6_net[2] && (addr[3] & onc_pod6_mask[3]) == onc_pod6_net[3];
}

/*
 * onc_uplink_lb_overlay_reply for a peer's frame carrying IPv6 (see it):
 * a backend's reply to a flow this node sent it masqueraded (to an
 * address of this node's IPv6 pod CIDR, its gateway), established in
 * conntrack, is decapsulated, given back the client's address and the
 * frontend's, and sent out of the uplink the flow's replies leave by.
 * Out of an IPv4 tunnel only where bpf_skb_adjust_room can make the skb
 * IPv6 (onc_decap_ipv6, Linux 6.3): the neighbour lookup goes by the
 * skb's protocol. Anything else, a GRO super-packet, and every TCP SYN,
 * FIN and RST, takes the stack.
 */
__attribute__((noinline)) int lb6_uplink_overlay_reply(struct __sk_buff *skb)
{
	__s32 len = lb6_underlay6() ? ONC_ENCAP6_LEN : ONC_ENCAP_LEN;
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	__be16 proto = bpf_htons(ETH_P_IPV6);
	struct lb6_addr client = {}, fe = {};
	struct ct6_ends t = {}, orig;
	struct lb6_flow *rev;
	struct lb6_pkt p;
	__u32 ifindex;

	if (!lb6_underlay6()) {
		if (!onc_decap_ipv6)
			return TC_ACT_OK;
		flags |= ONC_ADJ_ROOM_DECAP_L3_IPV6;
	}
	if (skb->gso_segs > 1 || lb6_parse_at(skb, len + ETH_HLEN, &p) || (p.tcp_flags & TCP_CTL) ||
	    p.hop_limit <= 1 || !lb6_in_pod_cidr(p.daddr))
		return TC_ACT_OK;
	lb6_copy(t.saddr, p.saddr);
	lb6_copy(t.daddr, p.daddr);
	t.sport = p.sport;
	t.dport = p.dport;
	/* A reply: conntrack's original direction ran from the client to
	 * this backend. */
	if (ct_established6(skb, &t, p.proto, CT_DIR_REPLY, 1, &orig) || !addr6_equal(orig.daddr, p.saddr) ||
	    orig.dport != p.sport)
		return TC_ACT_OK;
	lb6_copy(client.ip, orig.saddr);
	client.port = orig.sport;
	rev = lb6_reply_flow(p.saddr, p.sport, client.ip, client.port, p.proto);
	if (!rev || !rev->ifindex)
		return TC_ACT_OK;
	lb6_copy(fe.ip, rev->ip);
	fe.port = rev->port;
	ifindex = rev->ifindex;
	if (bpf_skb_adjust_room(skb, -len, BPF_ADJ_ROOM_MAC, flags))
		goto err;
	p.l4off -= len;
	/* The outer Ethernet header stays: an IPv4 tunnel's says IPv4. */
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto), 0) ||
	    lb6_rewrite(skb, &p, 0, &fe) || lb6_rewrite(skb, &p, 1, &client) || lb6_dec_hop(skb, &p))
		goto err;
	count(&onc_lb6_uplink_fast_stats, LB_STAT_UPLINK6_FAST_FROM_REMOTE, 1);
	return bpf_redirect_neigh(ifindex, NULL, 0, 0);
err:
	return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
}

/*
 * onc_uplink_lb_ingress for an IPv6 packet: one from outside to an IPv6
 * uplink frontend is checked (a spoofed source, a client outside the
 * source ranges: dropped), sent to its flow's backend, marked for SNAT
 * unless the entry keeps the client, and handed to lb6_uplink_fast in x,
 * which sends it past the stack or leaves it to it; one the service has
 * no backend for is marked for netfilter to refuse, or dropped; a DSR
 * flow's goes to its backend's node (LB_DSR6_SEND), x left empty: never
 * on the fast path. A frame to the VXLAN port is never a frontend's: a
 * peer's DSR frame, or the overlay guard's.
 */
__attribute__((noinline)) int lb6_uplink_ingress(struct __sk_buff *skb, struct lb6_xlat *x)
{
	struct lb6_svc_key key = { .scope = LB_SCOPE_UPLINK };
	struct lb_svc *found;
	struct lb6_addr be = {};
	struct lb_svc svc;
	struct lb6_pkt p;
	__u8 dsr = 0;

	if (lb6_parse(skb, &p))
		return LB_NEXT;
	if (p.proto == IPPROTO_UDP && p.dport == onc_vxlan_port)
		return LB_DSR6_RECEIVE6;
	lb6_copy(key.vip, p.daddr);
	key.port = p.dport;
	key.proto = p.proto;
	found = bpf_map_lookup_elem(&onc_lb6_svc, &key);
	if (!found)
		return LB_NEXT;
	svc = *found;
	/* Nobody outside speaks for a pod or for this node. */
	if (lb6_internal(p.saddr)) {
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_SPOOFED);
	}
	switch (lb6_flow_backend(&p, &svc, &be, &dsr)) {
	case LB_FLOW_OK:
		break;
	case LB_FLOW_FOREIGN:
		return LB_NEXT;
	case LB_FLOW_OUT_OF_RANGE:
		count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_SOURCE_RANGE_DROP, 1);
		lb_count_svc(svc.id, 1);
		return TC_ACT_SHOT;
	case LB_FLOW_EMPTY:
		lb_count_svc(svc.id, 1);
		if (svc.flags & LB_SVC_DROP_WHEN_EMPTY) {
			return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_NO_ENDPOINTS_DROP);
		}
		count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_REFUSED, 1);
		skb->mark |= LB_MARK_REJECT;
		return LB_NEXT;
	default:
		return TC_ACT_SHOT;
	}
	if (dsr)
		return LB_DSR6_SEND;
	if (lb6_rewrite(skb, &p, 1, &be)) {
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
	}
	count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_TRANSLATED, 1);
	/* A backend on another node must answer through this one. */
	if (!(svc.flags & LB_SVC_KEEP_CLIENT))
		skb->mark |= LB_MARK_SNAT;
	if (x) { /* for lb6_uplink_fast */
		x->p = p;
		x->be = be;
		x->ok = 1;
	}
	return LB_NEXT;
}

/*
 * onc_uplink_lb_egress for an IPv6 packet: a backend's reply to a client
 * (after conntrack undid the SNAT, for a remote backend) leaves from the
 * frontend the client sent to, and teaches the flow cache the flow as
 * lb6_learn_reply says.
 */
__attribute__((noinline)) int lb6_uplink_egress(struct __sk_buff *skb)
{
	struct lb6_flow_key key;
	struct lb6_flow *rev;
	struct lb6_addr fe = {};
	struct lb6_pkt p;

	if (lb6_parse(skb, &p))
		return LB_NEXT;
	key = lb6_flow_key(p.saddr, p.daddr, p.sport, p.dport, p.proto, LB_FLOW_OUT);
	rev = bpf_map_lookup_elem(&onc_lb6_flows, &key);
	if (!rev)
		return LB_NEXT;
	lb6_learn_reply(skb, &p, rev);
	lb6_copy(fe.ip, rev->ip);
	fe.port = rev->port;
	if (lb6_rewrite(skb, &p, 0, &fe)) {
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
	}
	count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_REVERSED, 1);
	return LB_NEXT;
}

#endif /* __ONC_SERVICES_UPLINK6_H */
