/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Direct server return for IPv6 frontends (LB_SVC_DSR on an onc_lb6_svc
 * entry): services_dsr.h's, for an IPv6 client, frontend and backend, over
 * either underlay: an IPv4 one (a dual-stack cluster's tunnels, IPv6
 * inside IPv4) or an IPv6 one.
 *
 * The frontend travels whole, in headers every frame has anyway: its port
 * as the outer UDP source port and its address's first 32 bits in the
 * VXLAN header's reserved bits, both as IPv4's frontend travels
 * (lb_dsr_vxlan); its other 96 bits in place of the inner Ethernet
 * header's two addresses, which the receiver strips unread. A frame is
 * the size of an ordinary one (50 bytes of headers over IPv4, 70 over
 * IPv6): no extension header to add and strip, no id for the nodes to
 * agree on, no frontend mistaken for another. The inner Ethernet type
 * (IPv6) tells it from IPv4's frame. A frontend in ::/32 (unspecified,
 * loopback, IPv4-mapped: reserved, never a Service's) would leave the
 * reserved bits zero, as in an ordinary frame: it is served by SNAT.
 *
 * The trust rules are IPv4's. Only a peer's tunnel endpoint may send such
 * a frame (onc_senders, or onc_senders6_u6 on an IPv6 underlay), for a
 * client outside the cluster (not in the cluster's IPv6 pod CIDR, not
 * this node, and on an IPv6 underlay not a peer's endpoint: the nodes'
 * addresses the datapath knows, as IPv4's onc_hosts holds the nodes'
 * IPv4 endpoints), to a local IPv6 pod (onc_local6), through a frontend
 * this node serves too: an IPv6 externalIP or load balancer IP, or a
 * NodePort of the peer's whose port this node serves on its own IPv6
 * address (onc_lb6_dsr_nodeport, which the agent fills). Each refusal
 * has its counter (enum lb6_dsr_stat).
 *
 * What the backend's node takes goes up its stack as if the client's
 * packet had come in by the uplink (the IPv6 fast path from outside,
 * lb6_uplink_fast, takes only what lb6_uplink_ingress translated, never a
 * DSR flow's packets, on either node); the pod's replies leave by the
 * uplink, where lb6_uplink_egress gives them the frontend's address from
 * the LB_FLOW_OUT entry recorded here, or, once the flow cache learned
 * the flow, lb6_uplink_reply does, as IPv4's do.
 */
#ifndef __ONC_SERVICES_DSR6_H
#define __ONC_SERVICES_DSR6_H

#include <linux/ipv6.h>
#include "encap6.h"
#include "overlay.h"
#include "services_dsr.h"
#include "services_uplink6.h"

/* IPv6's twins of enum lb_dsr_stat, in a map of their own (the IPv4 one
 * keeps its size, so an upgrade adopts it). */
enum lb6_dsr_stat {
	LB_STAT_DSR6_SENT,           /* packets sent to a backend's node directly */
	LB_STAT_DSR6_TOO_BIG,        /* too big for the overlay: dropped */
	LB_STAT_DSR6_NO_ROUTE,       /* no route to the backend's node, or it left: dropped */
	LB_STAT_DSR6_TTL_EXPIRED,    /* a hop limit of 1 or less: dropped */
	LB_STAT_DSR6_RECEIVED,       /* a peer's packets for a backend here, taken */
	LB_STAT_DSR6_DROP_MALFORMED, /* not a whole VXLAN frame of ours with an IPv6 TCP or UDP packet */
	LB_STAT_DSR6_DROP_SENDER,    /* not from a peer's tunnel endpoint */
	LB_STAT_DSR6_DROP_CLIENT,    /* for a pod or a node, not a client outside */
	LB_STAT_DSR6_DROP_BACKEND,   /* to no pod of this node */
	LB_STAT_DSR6_DROP_FRONTEND,  /* through a frontend this node does not serve */
	LB_STAT_DSR6_MAX,
};

ONC_COUNTERS(onc_lb6_dsr_stats, lb6_dsr_stat, LB_STAT_DSR6_MAX);

/* lb_dsr6_drop drops skb's packet, whose IP header is at off, counting
 * stat, and reports it; outer, if not 0, is the offset of the IP header of
 * the peer's frame that carried it (lb_drop_frame's, for IPv6). */
static __always_inline int lb_dsr6_drop(struct __sk_buff *skb, __u32 off, __u32 outer, __u32 stat)
{
	count(&onc_lb6_dsr_stats, stat, 1);
	ev_drop(skb, off, outer, EV_TABLE_LB6_DSR_STAT, stat);
	return TC_ACT_SHOT;
}

/* An IPv6 address this node serves its NodePorts on (all zeros: none),
 * where a peer's NodePort frontend is looked up by its port: no node
 * knows another's IPv6 addresses. The agent writes it (datapath/services). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct onc_in6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb6_dsr_nodeport SEC(".maps");

/* lb6_node_ip6 copies this node's IPv6 tunnel endpoint to to, a word at a
 * time: a copy of the whole would lose the constant's volatile, and the
 * compiler would copy its initial zeros. */
static __always_inline void lb6_node_ip6(__be32 *to)
{
	to[0] = onc_node_ip6[0];
	to[1] = onc_node_ip6[1];
	to[2] = onc_node_ip6[2];
	to[3] = onc_node_ip6[3];
}

/* Whether addr is a peer's IPv6 tunnel endpoint: the entry by which a
 * peer speaks for its own address. */
static __always_inline int lb6_peer_node_u6(const __be32 *addr)
{
	struct sender6_u6_key k = { .prefixlen = 128 + 128 };
	struct sender_val *may;

	__builtin_memcpy(k.peer, addr, sizeof(k.peer));
	__builtin_memcpy(k.inner, addr, sizeof(k.inner));
	may = bpf_map_lookup_elem(&onc_senders6_u6, &k);
	return may && may->may_send;
}

/*
 * lb_dsr6_wanted says whether a new flow of svc from client to backend be,
 * through frontend fe, goes to be's node directly, as lb_flow_backend
 * decides IPv4's: a pod of a fast-path peer, a client that is no node the
 * datapath knows (the backend's node would deliver the replies to its own
 * host), a frontend a frame can carry.
 */
static __always_inline int lb_dsr6_wanted(const struct lb_svc *svc, const __be32 *client, const __be32 *fe,
					  const struct lb6_addr *be)
{
	if (!(svc->flags & LB_SVC_DSR) || !fe[0])
		return 0;
	if (lb6_underlay6())
		return peer6_u6_of((const struct in6_addr *)be->ip) && !lb6_peer_node_u6(client);
	return onc_node_ip && peer6_of((const struct in6_addr *)be->ip);
}

/* The length of one segment of skb as its IPv6 packet (lb_segment_len's). */
static __always_inline __u32 lb6_segment_len(struct __sk_buff *skb, const struct lb6_pkt *p)
{
	__u8 doff = 0;

	if (!skb->gso_size)
		return skb->len - ETH_HLEN;
	if (p->proto == IPPROTO_UDP)
		return sizeof(struct ipv6hdr) + sizeof(struct udphdr) + skb->gso_size;
	bpf_skb_load_bytes(skb, p->l4off + 12, &doff, 1);
	return sizeof(struct ipv6hdr) + (doff >> 4) * 4 + skb->gso_size;
}

/* The inner Ethernet header of a DSR frame: the frontend's last 96 bits
 * for addresses, IPv6 for type. */
static __always_inline void lb_dsr6_inner_eth(__u8 *eth, const struct lb6_addr *fe)
{
	__be16 proto = bpf_htons(ETH_P_IPV6);

	__builtin_memcpy(eth, &fe->ip[1], 3 * sizeof(fe->ip[1]));
	__builtin_memcpy(eth + 2 * ETH_ALEN, &proto, sizeof(proto));
}

/* lb_dsr6_header4 writes the headers of a DSR frame to the IPv4 endpoint
 * node into encap, as lb_dsr_header does for IPv4's. */
static __always_inline void lb_dsr6_header4(struct encap_val *encap, __be32 node, const struct lb6_addr *fe)
{
	struct lb_addr first = { .ip = fe->ip[0] };

	lb_dsr_header(encap, node, &first);
	lb_dsr6_inner_eth(encap->hdr + ONC_ENCAP_LEN, fe);
}

/* lb_dsr6_header6 is lb_dsr6_header4 for the IPv6 endpoint node: the
 * outer UDP checksum stays zero, as the kernel's VXLAN device sends it
 * (encap6.h). */
static __always_inline void lb_dsr6_header6(struct encap6_val *encap, const struct onc_in6 *node,
					    const struct lb6_addr *fe)
{
	struct {
		struct ipv6hdr ip6;
		struct udphdr udp;
		struct vxlanhdr vx;
	} h = {};
	__be16 proto = bpf_htons(ETH_P_IPV6);

	h.ip6.version = 6;
	h.ip6.nexthdr = IPPROTO_UDP;
	h.ip6.hop_limit = 64;
	lb6_node_ip6(h.ip6.saddr.in6_u.u6_addr32);
	__builtin_memcpy(&h.ip6.daddr, node, sizeof(h.ip6.daddr));
	h.udp.dest = onc_vxlan_port;
	h.vx = lb_dsr_vxlan(fe->ip[0]);
	__builtin_memcpy(encap->hdr + offsetof(struct ethhdr, h_proto), &proto, sizeof(proto));
	__builtin_memcpy(encap->hdr + sizeof(struct ethhdr), &h, sizeof(h));
	lb_dsr6_inner_eth(encap->hdr + ONC_ENCAP6_LEN, fe);
}

/* lb_dsr6_no_route drops p, whose backend's node left the peers (or its
 * fast path went off), and forgets its flow: a UDP flow's next datagram
 * picks afresh; a TCP flow's next segment meets the stack, which resets
 * it. */
static __always_inline int lb_dsr6_no_route(struct __sk_buff *skb, const struct lb6_pkt *p)
{
	struct lb6_flow_key in = lb6_flow_key(p->saddr, p->daddr, p->sport, p->dport, p->proto, LB_FLOW_IN);

	bpf_map_delete_elem(&onc_lb6_flows, &in);
	return lb_dsr6_drop(skb, ETH_HLEN, 0, LB_STAT_DSR6_NO_ROUTE);
}

/* lb_dsr6_fib judges the FIB's answer to a DSR frame's route: 0 to send
 * it, else the verdict (dropped, counted). */
static __always_inline int lb_dsr6_fib(struct __sk_buff *skb, int rc)
{
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return lb_dsr6_drop(skb, ETH_HLEN, 0, LB_STAT_DSR6_TOO_BIG);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return lb_dsr6_drop(skb, ETH_HLEN, 0, LB_STAT_DSR6_NO_ROUTE);
	return 0;
}

/*
 * lb_dsr6_send sends a client's packet of a DSR flow (lb6_uplink_ingress
 * recorded its backend in the flow's entry) to its backend's node, as
 * lb_dsr_send does IPv4's: the destination made the backend's, the hop
 * limit lowered, wrapped in VXLAN from this node's tunnel endpoint with
 * the frontend in the headers, out of the device and to the next hop the
 * kernel's FIB and neighbour table give. A global function, verified once
 * on its own.
 */
__attribute__((noinline)) int lb_dsr6_send(struct __sk_buff *skb)
{
	struct bpf_fib_lookup fib = { .l4_protocol = IPPROTO_UDP, .ifindex = skb->ingress_ifindex };
	struct bpf_redir_neigh nh = {};
	struct lb6_flow_key in;
	struct lb6_addr fe = {}, be = {};
	struct cidr_val *peer = NULL;
	struct onc_in6 *peer6 = NULL;
	struct lb6_flow *fwd;
	struct lb6_pkt pkt, *p = &pkt;
	int rc, u6 = lb6_underlay6();

	if (lb6_parse(skb, p))
		goto err;
	in = lb6_flow_key(p->saddr, p->daddr, p->sport, p->dport, p->proto, LB_FLOW_IN);
	fwd = bpf_map_lookup_elem(&onc_lb6_flows, &in);
	if (!fwd)
		goto err;
	lb6_copy(be.ip, fwd->ip);
	be.port = fwd->port;
	lb6_copy(fe.ip, p->daddr);
	fe.port = p->dport;
	if (p->hop_limit <= 1)
		return lb_dsr6_drop(skb, ETH_HLEN, 0, LB_STAT_DSR6_TTL_EXPIRED);
	if (u6)
		peer6 = peer6_u6_of((const struct in6_addr *)be.ip);
	else
		peer = peer6_of((const struct in6_addr *)be.ip);
	if (!peer && !peer6)
		return lb_dsr6_no_route(skb, p);
	fib.tot_len = lb6_segment_len(skb, p);
	if (peer6) {
		fib.family = ONC_AF_INET6;
		lb6_node_ip6(fib.ipv6_src);
		__builtin_memcpy(fib.ipv6_dst, peer6, sizeof(fib.ipv6_dst));
		fib.tot_len += ONC_ENCAP6_LEN;
	} else {
		fib.family = ONC_AF_INET;
		fib.ipv4_src = onc_node_ip;
		fib.ipv4_dst = peer->node_ip;
		fib.tot_len += ONC_ENCAP_LEN;
	}
	rc = lb_dsr6_fib(skb, bpf_fib_lookup(skb, &fib, sizeof(fib), 0));
	if (rc)
		return rc;

	if (lb6_rewrite(skb, p, 1, &be) || lb6_dec_hop(skb, p))
		goto err;
	if (peer6) {
		struct encap6_val encap = {};

		lb_dsr6_header6(&encap, peer6, &fe);
		if (encap_push6(skb, &encap, fe.port, encap_ecn(p->tclass)))
			goto err;
		nh.nh_family = ONC_AF_INET6;
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, sizeof(nh.ipv6_nh));
	} else {
		struct encap_val encap = {};

		lb_dsr6_header4(&encap, peer->node_ip, &fe);
		if (encap_push(skb, &encap, fe.port, encap_ecn(p->tclass)))
			goto err;
		nh.nh_family = ONC_AF_INET;
		nh.ipv4_nh = fib.ipv4_dst;
	}
	count(&onc_lb6_uplink_stats, LB_STAT_UPLINK6_TRANSLATED, 1);
	count(&onc_lb6_dsr_stats, LB_STAT_DSR6_SENT, 1);
	/* The next hop: the peer, or the gateway to it. */
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
err:
	return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
}

/* The service whose frontend a peer's frame names, if this node serves
 * it: an IPv6 externalIP or load balancer IP (every node's), or a
 * NodePort of the peer's, on any of its addresses (this node serves the
 * same port on its own). Never a frontend in the cluster's pod CIDR. */
static __always_inline struct lb_svc *lb_dsr6_frontend(const struct lb6_addr *fe, __u8 proto)
{
	struct lb6_svc_key key = { .port = fe->port, .proto = proto, .scope = LB_SCOPE_UPLINK };
	struct onc_in6 *self;
	struct lb_svc *svc;
	__u32 zero = 0;

	lb6_copy(key.vip, fe->ip);
	svc = bpf_map_lookup_elem(&onc_lb6_svc, &key);
	if (svc || lb6_internal(fe->ip))
		return svc;
	self = bpf_map_lookup_elem(&onc_lb6_dsr_nodeport, &zero);
	if (!self)
		return NULL;
	__builtin_memcpy(key.vip, self, sizeof(key.vip));
	if (!(key.vip[0] | key.vip[1] | key.vip[2] | key.vip[3]))
		return NULL;
	return bpf_map_lookup_elem(&onc_lb6_svc, &key);
}

/* What lb_dsr6_receive reads after the outer IP header: UDP, VXLAN and
 * the inner Ethernet header (LB_DSR6_TUNNEL_LEN bytes: the struct has
 * padding after them). */
struct lb_dsr6_tunnel {
	struct udphdr udp;
	struct vxlanhdr vx;
	__u8 macs[2 * ETH_ALEN];
	__be16 proto;
};

#define LB_DSR6_TUNNEL_LEN (offsetof(struct lb_dsr6_tunnel, proto) + sizeof(__be16))

/* lb_dsr6_outer reads the outer IP header of a frame to this node's VXLAN
 * port: the source into from; whether the frame is whole, untagged,
 * without IP options or extension headers, to this node's endpoint. */
static __always_inline int lb_dsr6_outer(struct __sk_buff *skb, int outer6, __be32 *from)
{
	struct ipv6hdr ip6;
	struct iphdr ip;

	if (!outer6) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
			return 0;
		from[0] = ip.saddr;
		return ip.ihl == 5 && !(ip.frag_off & bpf_htons(0x3fff)) && onc_node_ip && ip.daddr == onc_node_ip;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
		return 0;
	__builtin_memcpy(from, &ip6.saddr, sizeof(ip6.saddr));
	return ip6.nexthdr == IPPROTO_UDP && lb6_underlay6() && ip6.daddr.in6_u.u6_addr32[0] == onc_node_ip6[0] &&
	       ip6.daddr.in6_u.u6_addr32[1] == onc_node_ip6[1] && ip6.daddr.in6_u.u6_addr32[2] == onc_node_ip6[2] &&
	       ip6.daddr.in6_u.u6_addr32[3] == onc_node_ip6[3];
}

/* Whether the tunnel endpoint from (IPv4 in from[0], or IPv6) is a
 * peer's, speaking for its own address (datapath/peers.go). */
static __always_inline int lb_dsr6_peer(int outer6, const __be32 *from)
{
	struct sender_key k = { .prefixlen = 64, .peer = from[0], .inner = from[0] };
	struct sender_val *may;

	if (outer6)
		return lb6_peer_node_u6(from);
	may = bpf_map_lookup_elem(&onc_senders, &k);
	return may && may->may_send;
}

/*
 * lb_dsr6_receive judges a frame to this node's VXLAN port, its outer
 * header IPv6 (outer6) or IPv4, as lb_dsr_receive does IPv4's: LB_NEXT for
 * an ordinary one (no frontend in it: the overlay guard's and the VXLAN
 * device's), a peer's DSR frame with an IPv6 client's packet taken (its
 * outer headers stripped, its frontend recorded for the replies), or
 * dropped. A global function, verified once on its own.
 */
__attribute__((noinline)) int lb_dsr6_receive(struct __sk_buff *skb, __u32 outer6)
{
	__u32 l4off = ETH_HLEN + (outer6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	__u32 inner = l4off + LB_DSR6_TUNNEL_LEN;
	__s32 len = outer6 ? ONC_ENCAP6_LEN : ONC_ENCAP_LEN;
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	__be16 proto = bpf_htons(ETH_P_IPV6);
	struct lb_dsr6_tunnel t;
	struct lb6_flow_key out;
	struct lb6_flow rev = {}, *cur;
	struct lb6_addr fe = {};
	__be32 from[4] = {};
	struct lb_svc *svc;
	struct lb6_pkt p;

	if (bpf_skb_load_bytes(skb, l4off, &t, LB_DSR6_TUNNEL_LEN))
		return LB_NEXT;
	fe.ip[0] = lb_dsr_frontend_ip(&t.vx);
	if (!fe.ip[0])
		return LB_NEXT;
	__builtin_memcpy(&fe.ip[1], t.macs, 3 * sizeof(fe.ip[1]));
	fe.port = t.udp.source;
	/* Whole, untagged, to our endpoint, our VNI, an IPv6 TCP or UDP
	 * packet in it: as ONC's peers send. */
	if (!lb_dsr6_outer(skb, outer6, from) || bpf_ntohl(t.vx.flags) >> 24 != VXLAN_FLAG_VNI ||
	    bpf_ntohl(t.vx.vni) >> 8 != onc_vni || t.proto != proto ||
	    lb6_parse_at(skb, inner, &p))
		return lb_dsr6_drop(skb, inner, ETH_HLEN, LB_STAT_DSR6_DROP_MALFORMED);
	if (!lb_dsr6_peer(outer6, from))
		return lb_dsr6_drop(skb, inner, ETH_HLEN, LB_STAT_DSR6_DROP_SENDER);
	if (lb6_internal(p.saddr) || (lb6_underlay6() && lb6_peer_node_u6(p.saddr)))
		return lb_dsr6_drop(skb, inner, ETH_HLEN, LB_STAT_DSR6_DROP_CLIENT);
	if (!bpf_map_lookup_elem(&onc_local6, p.daddr))
		return lb_dsr6_drop(skb, inner, ETH_HLEN, LB_STAT_DSR6_DROP_BACKEND);
	svc = lb_dsr6_frontend(&fe, p.proto);
	if (!svc)
		return lb_dsr6_drop(skb, inner, ETH_HLEN, LB_STAT_DSR6_DROP_FRONTEND);
	lb6_copy(rev.ip, fe.ip);
	rev.port = fe.port;
	rev.svc_id = svc->id;
	out = lb6_flow_key(p.daddr, p.saddr, p.dport, p.sport, p.proto, LB_FLOW_OUT);
	/* Written only when it changes. */
	cur = bpf_map_lookup_elem(&onc_lb6_flows, &out);
	if (!cur || !addr6_equal(cur->ip, rev.ip) || cur->port != rev.port || cur->svc_id != rev.svc_id)
		bpf_map_update_elem(&onc_lb6_flows, &out, &rev, BPF_ANY);

	/* The outer Ethernet header stays, typed IPv6 now, with the inner
	 * packet after it: as the client's packet would have come in by the
	 * uplink. Out of an IPv4 tunnel, the skb must say IPv6 too. */
	if (!outer6 && onc_decap_ipv6)
		flags |= ONC_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -len, BPF_ADJ_ROOM_MAC, flags) ||
	    bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto), 0))
		return lb_drop(skb, &onc_lb6_uplink_stats, EV_TABLE_LB6_UPLINK_STAT, LB_STAT_UPLINK6_ERROR);
	count(&onc_lb6_dsr_stats, LB_STAT_DSR6_RECEIVED, 1);
	/* A kernel without the flag leaves the skb saying IPv4: the uplink
	 * takes the packet in again, which reads the type from the Ethernet
	 * header. */
	if (!outer6 && !onc_decap_ipv6)
		return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
	return LB_NEXT;
}

/* lb_dsr6_step does what an uplink half's rc asks (enum lb_dsr6_step),
 * or returns it: a verdict. */
static __always_inline int lb_dsr6_step(struct __sk_buff *skb, int rc)
{
	switch (rc) {
	case LB_DSR6_RECEIVE4:
		return lb_dsr6_receive(skb, 0);
	case LB_DSR6_RECEIVE6:
		return lb_dsr6_receive(skb, 1);
	case LB_DSR6_SEND:
		return lb_dsr6_send(skb);
	}
	return rc;
}

#endif /* __ONC_SERVICES_DSR6_H */
