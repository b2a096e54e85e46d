/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Direct server return for the uplink load balancer (LB_SVC_DSR): a flow
 * from outside to a backend on another node keeps the client's address,
 * and the backend's node answers the client itself, from the frontend's
 * address; the replies never come back through the node the client chose.
 *
 * The node that balances (lb_dsr_send) translates the client's packet to
 * the backend and wraps it in VXLAN to the backend's node, outside the
 * kernel's VXLAN device, with the frontend in the header: its address in
 * the 32 reserved bits (flags word bytes 1-3, then the byte after the
 * VNI), its port as the outer UDP source port. None of the flow's packets
 * enter this node's stack: no conntrack entry, no masquerade.
 *
 * The backend's node (lb_dsr_receive) takes such a frame before the
 * kernel's VXLAN device would (it drops frames with reserved bits set),
 * checks who sent it and for whom, records the frontend for the replies
 * (an LB_FLOW_OUT entry, as for a flow it balanced itself), and strips the
 * outer headers: the client's packet goes on up the stack as if it had
 * come in by the uplink to a local backend, where conntrack and the
 * NetworkPolicy table judge it with the client's address, or, once the
 * flow cache knows the flow, straight into the pod. The pod's replies
 * leave by this node's uplink with the frontend's address
 * (onc_uplink_lb_egress, onc_uplink_lb_reply).
 *
 * Who may send such a frame: a peer (its tunnel endpoint, as the overlay
 * guard knows it), for a client outside the cluster (no pod, no node),
 * to a pod of this node, through a frontend this node serves too.
 */
#ifndef __ONC_SERVICES_DSR_H
#define __ONC_SERVICES_DSR_H

#include "services_uplink.h"

#define VXLAN_FLAG_VNI 0x08

/*
 * What an uplink half (lb_uplink_ingress4, lb6_uplink_ingress) returns
 * for the program to do next with an IPv6 frontend's direct server
 * return (services_dsr6.h): never a verdict the program returns. The
 * program calls those functions itself, each in its own frame: a half's
 * and theirs together would exceed the stack a program may use.
 */
enum lb_dsr6_step {
	LB_DSR6_RECEIVE4 = 0x10000, /* a frame over IPv4 with an IPv6 client's packet */
	LB_DSR6_RECEIVE6,           /* a frame to the VXLAN port over IPv6 */
	LB_DSR6_SEND,               /* a client's packet of a DSR flow */
};

/* Counters of their own, so that onc_lb_uplink_stats keeps its size and
 * an upgrade adopts the pinned maps. */
enum lb_dsr_stat {
	LB_STAT_DSR_SENT,           /* packets sent to a backend's node directly */
	LB_STAT_DSR_TOO_BIG,        /* too big for the overlay: dropped */
	LB_STAT_DSR_NO_ROUTE,       /* no route to the backend's node, or it left: dropped */
	LB_STAT_DSR_TTL_EXPIRED,    /* a TTL of 1 or less: dropped */
	LB_STAT_DSR_RECEIVED,       /* a peer's packets for a backend here, taken */
	LB_STAT_DSR_DROP_MALFORMED, /* not a whole VXLAN frame of ours with a TCP or UDP packet */
	LB_STAT_DSR_DROP_SENDER,    /* not from a peer's tunnel endpoint */
	LB_STAT_DSR_DROP_CLIENT,    /* for a pod or a node, not a client outside */
	LB_STAT_DSR_DROP_BACKEND,   /* to no pod of this node */
	LB_STAT_DSR_DROP_FRONTEND,  /* through a frontend this node does not serve */
	LB_STAT_DSR_MAX,
};

ONC_COUNTERS(onc_lb_dsr_stats, lb_dsr_stat, LB_STAT_DSR_MAX);

/* lb_drop_frame drops a peer's frame for a flow it sends directly,
 * counting stat, and reports it with the inner packet and the peer. */
static __always_inline int lb_drop_frame(struct __sk_buff *skb, __u32 stat)
{
	count(&onc_lb_dsr_stats, stat, 1);
	ev_drop(skb, ONC_HDR_LEN, ETH_HLEN, EV_TABLE_LB_DSR_STAT, stat);
	return TC_ACT_SHOT;
}

/* The frontend's address in a VXLAN header's reserved bits (host order
 * inside): its first three bytes after the flags, its last after the VNI. */
static __always_inline struct vxlanhdr lb_dsr_vxlan(__be32 fe)
{
	struct vxlanhdr vx = {
		.flags = bpf_htonl(VXLAN_FLAG_VNI << 24 | bpf_ntohl(fe) >> 8),
		.vni = bpf_htonl(onc_vni << 8 | (bpf_ntohl(fe) & 0xff)),
	};

	return vx;
}

static __always_inline __be32 lb_dsr_frontend_ip(const struct vxlanhdr *vx)
{
	return bpf_htonl(bpf_ntohl(vx->flags) << 8 | (bpf_ntohl(vx->vni) & 0xff));
}

/* The length of one segment of skb as its IPv4 packet: a GRO or GSO
 * packet is sent as segments of gso_size bytes of payload. */
static __always_inline __u32 lb_segment_len(struct __sk_buff *skb, const struct lb_pkt *p)
{
	__u8 doff = 0;

	if (!skb->gso_size)
		return skb->len - ETH_HLEN;
	if (p->proto == IPPROTO_UDP)
		return p->l4off - ETH_HLEN + sizeof(struct udphdr) + skb->gso_size;
	bpf_skb_load_bytes(skb, p->l4off + 12, &doff, 1);
	return p->l4off - ETH_HLEN + (doff >> 4) * 4 + skb->gso_size;
}

/*
 * lb_dsr_header writes the headers of a DSR frame to node into encap, as
 * encap_push puts them on (it fills in lengths, ECN, checksum and the UDP
 * source port, the frontend's). The outer
 * Ethernet header is the neighbour's to fill; the inner one the receiver
 * strips.
 */
static __always_inline void lb_dsr_header(struct encap_val *encap, __be32 node, const struct lb_addr *fe)
{
	/* Built aligned, copied to where the headers sit in encap. */
	struct {
		struct iphdr ip;
		struct udphdr udp;
		struct vxlanhdr vx;
	} h = {};
	__be16 proto = bpf_htons(ETH_P_IP);

	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.ttl = 64;
	h.ip.protocol = IPPROTO_UDP;
	h.ip.saddr = onc_node_ip;
	h.ip.daddr = node;
	h.udp.dest = onc_vxlan_port;
	h.vx = lb_dsr_vxlan(fe->ip);
	__builtin_memcpy(encap->hdr + offsetof(struct ethhdr, h_proto), &proto, sizeof(proto));
	__builtin_memcpy(encap->hdr + sizeof(struct ethhdr), &h, sizeof(h));
	__builtin_memcpy(encap->hdr + ONC_HDR_LEN - sizeof(proto), &proto, sizeof(proto));
}

/*
 * lb_dsr_send sends a client's packet, already given its backend's
 * address, to the backend's node: TTL lowered, wrapped in VXLAN from this
 * node's tunnel endpoint with the frontend in the header, out of the
 * device and to the next hop the kernel's FIB and neighbour table give.
 */
static __always_inline int lb_dsr_send(struct __sk_buff *skb, const struct lb_pkt *p, const struct lb_addr *fe,
				       const struct lb_addr *be)
{
	struct bpf_fib_lookup fib = { .family = ONC_AF_INET, .l4_protocol = IPPROTO_UDP };
	struct bpf_redir_neigh nh = { .nh_family = ONC_AF_INET };
	struct lb_flow_key in = lb_in_key(p);
	struct encap_val encap = {};
	struct cidr_val *peer;
	int rc;

	if (p->ttl <= 1) {
		return lb_drop(skb, &onc_lb_dsr_stats, EV_TABLE_LB_DSR_STAT, LB_STAT_DSR_TTL_EXPIRED);
	}
	peer = peer_of(be->ip);
	if (!peer) {
		/* The backend's node left the peers (or its fast path went
		 * off): forgotten, a UDP flow's next datagram picks afresh; a
		 * TCP flow's next segment meets the stack, which resets it. */
		bpf_map_delete_elem(&onc_lb_flows, &in);
		return lb_drop(skb, &onc_lb_dsr_stats, EV_TABLE_LB_DSR_STAT, LB_STAT_DSR_NO_ROUTE);
	}
	fib.ipv4_src = onc_node_ip;
	fib.ipv4_dst = peer->node_ip;
	fib.ifindex = skb->ingress_ifindex;
	fib.tot_len = lb_segment_len(skb, p) + ONC_ENCAP_LEN;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		return lb_drop(skb, &onc_lb_dsr_stats, EV_TABLE_LB_DSR_STAT, LB_STAT_DSR_TOO_BIG);
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		return lb_drop(skb, &onc_lb_dsr_stats, EV_TABLE_LB_DSR_STAT, LB_STAT_DSR_NO_ROUTE);
	}

	lb_dsr_header(&encap, peer->node_ip, fe);
	if (lb_rewrite(skb, p, 1, be) || lb_dec_ttl(skb, p) || encap_push(skb, &encap, fe->port, encap_ecn(p->tos))) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_TRANSLATED, 1);
	count(&onc_lb_dsr_stats, LB_STAT_DSR_SENT, 1);
	nh.ipv4_nh = fib.ipv4_dst; /* the next hop: the peer, or the gateway to it */
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
}

/* The service whose frontend a peer's frame names, if this node serves
 * it: an externalIP or load balancer IP (every node's), or a NodePort of
 * the peer's, on any of its addresses (this node serves the same port on
 * its own). Never a frontend in the cluster's pod CIDR. */
static __always_inline struct lb_svc *lb_dsr_frontend(const struct lb_addr *fe, __u8 proto)
{
	struct lb_svc_key key = { .vip = fe->ip, .port = fe->port, .proto = proto, .scope = LB_SCOPE_UPLINK };
	struct lb_svc *svc = bpf_map_lookup_elem(&onc_lb_svc, &key);

	if (svc || lb_internal(fe->ip))
		return svc;
	key.vip = onc_node_ip;
	return bpf_map_lookup_elem(&onc_lb_svc, &key);
}

/*
 * lb_dsr_receive judges a frame to this node's VXLAN port (outer, parsed):
 * LB_NEXT for an ordinary one (no frontend in it: the overlay guard's and
 * the VXLAN device's), a peer's DSR frame taken as above, or dropped.
 */
static __always_inline int lb_dsr_receive(struct __sk_buff *skb, const struct lb_pkt *outer)
{
	struct sender_key sender = { .prefixlen = 64, .peer = outer->saddr, .inner = outer->saddr };
	struct lb_flow_key out;
	struct lb_flow rev = {};
	struct vxlanhdr vx;
	struct sender_val *may;
	struct lb_flow *cur;
	struct lb_svc *svc;
	struct lb_addr fe, be;
	struct lb_pkt p;
	__be16 inner_proto;

	if (bpf_skb_load_bytes(skb, outer->l4off + sizeof(struct udphdr), &vx, sizeof(vx)))
		return LB_NEXT;
	fe.ip = lb_dsr_frontend_ip(&vx);
	if (!fe.ip)
		return LB_NEXT;
	fe.port = outer->sport;
	if (bpf_skb_load_bytes(skb, ONC_HDR_LEN - sizeof(inner_proto), &inner_proto, sizeof(inner_proto)))
		inner_proto = 0;
	/* An IPv6 client's: an IPv6 frontend (services_dsr6.h). */
	if (inner_proto == bpf_htons(ETH_P_IPV6))
		return LB_DSR6_RECEIVE4;
	/* Whole, untagged, without IP options, to our endpoint, our VNI, an
	 * IPv4 TCP or UDP packet in it: as ONC's peers send. */
	if (outer->l4off != ETH_HLEN + sizeof(struct iphdr) || outer->daddr != onc_node_ip ||
	    bpf_ntohl(vx.flags) >> 24 != VXLAN_FLAG_VNI || bpf_ntohl(vx.vni) >> 8 != onc_vni ||
	    inner_proto != bpf_htons(ETH_P_IP) || lb_parse_at(skb, ONC_HDR_LEN, &p)) {
		return lb_drop_frame(skb, LB_STAT_DSR_DROP_MALFORMED);
	}
	/* A peer may speak for its own address (datapath/peers.go). */
	may = bpf_map_lookup_elem(&onc_senders, &sender);
	if (!may || !may->may_send) {
		return lb_drop_frame(skb, LB_STAT_DSR_DROP_SENDER);
	}
	if (lb_internal(p.saddr) || is_host(p.saddr)) {
		return lb_drop_frame(skb, LB_STAT_DSR_DROP_CLIENT);
	}
	if (!bpf_map_lookup_elem(&onc_local, &p.daddr)) {
		return lb_drop_frame(skb, LB_STAT_DSR_DROP_BACKEND);
	}
	svc = lb_dsr_frontend(&fe, p.proto);
	if (!svc) {
		return lb_drop_frame(skb, LB_STAT_DSR_DROP_FRONTEND);
	}
	rev.ip = fe.ip;
	rev.port = fe.port;
	rev.svc_id = svc->id;
	out = lb_out_key(p.daddr, p.dport, p.saddr, p.sport, p.proto);
	/* Written only when it changes: the learned uplink stays. */
	cur = bpf_map_lookup_elem(&onc_lb_flows, &out);
	if (!cur || cur->ip != rev.ip || cur->port != rev.port || cur->svc_id != rev.svc_id)
		bpf_map_update_elem(&onc_lb_flows, &out, &rev, BPF_ANY);

	/* The outer Ethernet header stays, with the inner IPv4 packet after
	 * it: as the client's packet would have come in by the uplink. */
	if (bpf_skb_adjust_room(skb, -ONC_ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	p.l4off -= ONC_ENCAP_LEN;
	count(&onc_lb_dsr_stats, LB_STAT_DSR_RECEIVED, 1);
	be.ip = p.daddr;
	be.port = p.dport;
	return lb_fast_path(skb, &p, &be);
}

#endif /* __ONC_SERVICES_DSR_H */
