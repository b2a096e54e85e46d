//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The fast path: every tc program of the flow cache, and the overlay guard
 * (include/overlay.h) they run first. The slow path (routing, netfilter,
 * the kernel's VXLAN device) lets a flow through once each way and marks
 * it; the learning programs remember what they saw, and the fast-path
 * programs send the flow's next packets straight to the uplink or into
 * the pod.
 *
 *   onc_egress_fast    tc ingress of a pod's host veth (packets leaving the pod)
 *   onc_ingress_fast   tc ingress of the uplink
 *   onc_learn_egress   tc egress of the uplink
 *   onc_learn_ingress  tc egress of a pod's host veth (packets entering the pod)
 */
#include "include/conn_setup.h"
#include "include/encap.h"
#include "include/encap6.h"
#include "include/fastpath.h"
#include "include/overlay.h"
#include "include/parse.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/*
 * IPv6 pods' flows take the fast path as IPv4 pods' do once established,
 * in maps of their own (onc_filter6, onc_local6, onc_egress6, onc_peers6;
 * the header per node, onc_encap, is shared), with counters of their own
 * (onc_stats6). Their connections open and close as IPv4's do
 * (conn_setup.h, flow6_setup): on the fast path where no policy can deny
 * them (onc_open6), through conntrack otherwise, with onc_fin6 following
 * the closes.
 *
 * On an IPv6 underlay (a zero onc_node_ip: the node's endpoint is
 * onc_node_ip6) they ride IPv6 tunnels, through the maps of encap6.h;
 * IPv4 pods' packets take the slow path there.
 */
static __always_inline int underlay6(void)
{
	return !onc_node_ip;
}

/* hop_ok6 says whether p's hop limit may be lowered as a forwarding hop
 * does (no header checksum in IPv6: the caller decrements it); 0,
 * counting miss, when it would reach 0: the slow path sends the
 * time-exceeded error. */
static __always_inline int hop_ok6(const struct l4 *p, enum onc_stat miss)
{
	if (p->ip6->hop_limit <= 1) {
		count(&onc_stats6, miss, 1);
		return 0;
	}
	return 1;
}

/* egress6_open opens the connection of a SYN setup says opens (the
 * packet's last check passed): 0, counting tcp_flags, when it cannot be
 * recorded, and the SYN takes the slow path. */
static __always_inline int egress6_open(const struct flow_key6 *key, const struct onc_config *cfg, int setup)
{
	if (setup == SETUP_OPEN && flow6_open(key, cfg->epoch, FLOW_OPENED_BY_LOCAL)) {
		count(&onc_stats6, STAT_EGRESS_MISS_TCP_FLAGS, 1);
		return 0;
	}
	return 1;
}

/* sent6 is the end of a packet the fast path sent on (out: the local pod
 * sent it), its flow's entry flow (NULL for a SYN that opened it): the
 * close followed, the packet counted as open or hit. */
static __always_inline void sent6(const struct flow_key6 *key, struct flow_val *flow, const struct l4 *p, int setup,
				  int out)
{
	if (key->proto == IPPROTO_TCP)
		flow6_close_step(key, flow, out, &p->seg);
	if (out)
		count(&onc_stats6, setup == SETUP_OPEN ? STAT_EGRESS_OPEN : STAT_EGRESS_HIT, 1);
	else
		count(&onc_stats6, setup == SETUP_OPEN ? STAT_INGRESS_OPEN : STAT_INGRESS_HIT, 1);
	if (setup == SETUP_OPEN)
		ev_conn(EV_OPEN, key, 1, out);
}

/* drop_error drops a packet whose rewrite failed (it may be half done:
 * a failed bpf_skb_adjust_room leaves it as it was, its IP header at off),
 * counting stat in counters. */
static __always_inline int drop_error(struct __sk_buff *skb, void *counters, enum onc_stat stat, __u32 off)
{
	count(counters, stat, 1);
	ev_drop(skb, off, 0, EV_TABLE_ONC_STAT, stat);
	return TC_ACT_SHOT;
}

/* egress6_send_u6 is the rest of egress_fast6 on an IPv6 underlay: the
 * same checks, in the maps keyed by the peers' IPv6 endpoints. */
static __always_inline int egress6_send_u6(struct __sk_buff *skb, struct l4 *p, const struct flow_key6 *key,
					   const struct onc_config *cfg, int setup)
{
	struct encap6_val *encap;
	struct onc_in6 *peer, *dst;
	struct flow_val *flow;
	__u32 hash;

	peer = peer6_u6_of(&p->ip6->daddr);
	if (!peer) {
		count(&onc_stats6, STAT_EGRESS_MISS_NO_PEER, 1);
		/* Perhaps a reply to a client outside; returns only if not. */
		bpf_tail_call(skb, &onc_hooks, HOOK_POD_TO_NO_PEER);
		return TC_ACT_OK;
	}
	flow = setup == SETUP_OPEN ? NULL : filter_allowed(&onc_filter6, key, cfg->epoch);
	if (setup != SETUP_OPEN && !flow) {
		count(&onc_stats6, STAT_EGRESS_MISS_FLOW, 1);
		return TC_ACT_OK;
	}
	/* As onc_egress_fast: one the fast path opens or opened goes to the
	 * CIDR's owner, learned or not. */
	if (setup != SETUP_OPEN && !flow->opener) {
		dst = bpf_map_lookup_elem(&onc_egress6_u6, &p->ip6->daddr);
		if (!dst || !addr6_equal(dst, peer)) {
			count(&onc_stats6, STAT_EGRESS_MISS_DEST, 1);
			return TC_ACT_OK;
		}
	}
	encap = bpf_map_lookup_elem(&onc_encap_u6, peer);
	if (!encap) {
		count(&onc_stats6, STAT_EGRESS_MISS_ENCAP, 1);
		return TC_ACT_OK;
	}
	if (!hop_ok6(p, STAT_EGRESS_MISS_TTL) || !egress6_open(key, cfg, setup))
		return TC_ACT_OK;
	p->ip6->hop_limit--;
	hash = encap_hash(skb, addr6_fold(&p->ip6->saddr), addr6_fold(&p->ip6->daddr), p->sport, p->dport);
	if (encap_push6(skb, encap, encap_sport(hash), encap_ecn(ip6_tclass(p->ip6))))
		return drop_error(skb, &onc_stats6, STAT_EGRESS_ERROR, sizeof(struct ethhdr));
	sent6(key, flow, p, setup, 1);
	return bpf_redirect(encap->ifindex, 0);
}

/* egress_fast6 is onc_egress_fast for an IPv6 packet (see it). */
static __always_inline int egress_fast6(struct __sk_buff *skb, void *data, void *end)
{
	struct onc_config *cfg;
	struct encap_val *encap;
	struct egress_val *dst;
	struct local_pod *src;
	struct cidr_val *peer;
	struct flow_val *flow;
	struct flow_key6 key = {};
	struct l4 p;
	__u32 hash;
	int setup;

	if (parse_l4_6(data, end, sizeof(struct ethhdr), &p)) {
		count(&onc_stats6, STAT_EGRESS_MISS_NOT_IP, 1);
		return TC_ACT_OK;
	}
	src = bpf_map_lookup_elem(&onc_local6, &p.ip6->saddr);
	if (!src || src->ifindex != skb->ifindex) {
		count(&onc_stats6, STAT_EGRESS_MISS_SPOOF, 1);
		return TC_ACT_OK;
	}
	flow6_out(&key, &p);
	cfg = config();
	setup = flow6_setup(&key, p.tcp_flags, p.seg.flags & TCP_ACK, cfg, 1);
	if (setup == SETUP_SLOW) {
		count(&onc_stats6, STAT_EGRESS_MISS_TCP_FLAGS, 1);
		return TC_ACT_OK;
	}
	if (!cfg || !cfg->enabled) {
		count(&onc_stats6, STAT_EGRESS_MISS_DISABLED, 1);
		return TC_ACT_OK;
	}
	if (underlay6())
		return egress6_send_u6(skb, &p, &key, cfg, setup);
	peer = peer6_of(&p.ip6->daddr);
	if (!peer) {
		count(&onc_stats6, STAT_EGRESS_MISS_NO_PEER, 1);
		/* Perhaps a reply to a client outside; returns only if not. */
		bpf_tail_call(skb, &onc_hooks, HOOK_POD_TO_NO_PEER);
		return TC_ACT_OK;
	}
	flow = setup == SETUP_OPEN ? NULL : filter_allowed(&onc_filter6, &key, cfg->epoch);
	if (setup != SETUP_OPEN && !flow) {
		count(&onc_stats6, STAT_EGRESS_MISS_FLOW, 1);
		return TC_ACT_OK;
	}
	if (setup != SETUP_OPEN && !flow->opener) {
		dst = bpf_map_lookup_elem(&onc_egress6, &p.ip6->daddr);
		if (!dst || dst->node_ip != peer->node_ip) {
			count(&onc_stats6, STAT_EGRESS_MISS_DEST, 1);
			return TC_ACT_OK;
		}
	}
	encap = bpf_map_lookup_elem(&onc_encap, &peer->node_ip);
	if (!encap) {
		count(&onc_stats6, STAT_EGRESS_MISS_ENCAP, 1);
		return TC_ACT_OK;
	}
	if (!hop_ok6(&p, STAT_EGRESS_MISS_TTL) || !egress6_open(&key, cfg, setup))
		return TC_ACT_OK;
	p.ip6->hop_limit--;
	hash = encap_hash(skb, addr6_fold(&p.ip6->saddr), addr6_fold(&p.ip6->daddr), p.sport, p.dport);
	if (encap_push(skb, encap, encap_sport(hash), encap_ecn(ip6_tclass(p.ip6))) ||
	    encap_inner_ipv6(skb))
		return drop_error(skb, &onc_stats6, STAT_EGRESS_ERROR, sizeof(struct ethhdr));
	sent6(&key, flow, &p, setup, 1);
	return bpf_redirect(encap->ifindex, 0);
}

/*
 * Egress fast path: tc ingress of a pod's host-side veth (packets leaving
 * the pod). On a hit the packet gets the outer headers the kernel's VXLAN
 * device put on earlier packets of the same destination and is redirected
 * to the uplink: no routing, no netfilter, no VXLAN device. Whatever the
 * fast path's state, a packet for a VXLAN port is dropped here, before
 * masquerade could make it its node's (overlay.h).
 */
SEC("tc")
int onc_egress_fast(struct __sk_buff *skb)
{
	void *data, *end;
	struct onc_config *cfg;
	struct encap_val *encap;
	struct egress_val *dst;
	struct local_pod *src;
	struct cidr_val *peer;
	struct flow_val *flow;
	struct flow_key key = {};
	struct l4 p;
	__u32 hash;
	int setup;

	if (from_pod_to_vxlan(skb)) {
		count(&onc_stats, STAT_OVERLAY_DROP_FROM_POD, 1);
		ev_drop(skb, sizeof(struct ethhdr), 0, EV_TABLE_ONC_STAT, STAT_OVERLAY_DROP_FROM_POD);
		return TC_ACT_SHOT;
	}
	/* After the guard, which may have pulled data. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (is_ipv6(data, end))
		return egress_fast6(skb, data, end);
	if (!is_ipv4(data, end) || parse_l4(data, end, sizeof(struct ethhdr), &p)) {
		count(&onc_stats, STAT_EGRESS_MISS_NOT_IP, 1);
		return TC_ACT_OK;
	}
	/* Only the pod behind this veth may use its address: another pod
	 * sending with it would ride that pod's cached flows past policy, or
	 * open and close connections in their name. The slow path drops such
	 * packets. */
	src = bpf_map_lookup_elem(&onc_local, &p.ip->saddr);
	if (!src || src->ifindex != skb->ifindex) {
		count(&onc_stats, STAT_EGRESS_MISS_SPOOF, 1);
		return TC_ACT_OK;
	}
	flow_out(&key, &p);
	cfg = config();
	setup = flow_setup(&key, p.tcp_flags, p.seg.flags & TCP_ACK, cfg, 1);
	if (setup == SETUP_SLOW) {
		count(&onc_stats, STAT_EGRESS_MISS_TCP_FLAGS, 1);
		return TC_ACT_OK;
	}
	if (!cfg || !cfg->enabled) {
		count(&onc_stats, STAT_EGRESS_MISS_DISABLED, 1);
		return TC_ACT_OK;
	}
	if (is_host(p.ip->daddr)) {
		count(&onc_stats, STAT_EGRESS_MISS_HOST, 1);
		return TC_ACT_OK;
	}
	peer = peer_of(p.ip->daddr);
	if (!peer) {
		count(&onc_stats, STAT_EGRESS_MISS_NO_PEER, 1);
		/* Perhaps a reply to a client outside; returns only if not. */
		bpf_tail_call(skb, &onc_hooks, HOOK_POD_TO_NO_PEER);
		return TC_ACT_OK;
	}
	flow = setup == SETUP_OPEN ? NULL : flow_allowed(&key, cfg->epoch);
	if (setup != SETUP_OPEN && !flow) {
		count(&onc_stats, STAT_EGRESS_MISS_FLOW, 1);
		return TC_ACT_OK;
	}
	/* The learned node must still own the destination's CIDR: a pod IP
	 * that moved to another node is never sent to the old one. One the
	 * fast path opens or opened goes to the CIDR's owner, learned or
	 * not: conntrack has no entry for it, so the slow path is no way. */
	if (setup != SETUP_OPEN && !flow->opener) {
		dst = bpf_map_lookup_elem(&onc_egress, &p.ip->daddr);
		if (!dst || dst->node_ip != peer->node_ip) {
			count(&onc_stats, STAT_EGRESS_MISS_DEST, 1);
			return TC_ACT_OK;
		}
	}
	encap = bpf_map_lookup_elem(&onc_encap, &peer->node_ip);
	if (!encap) {
		count(&onc_stats, STAT_EGRESS_MISS_ENCAP, 1);
		return TC_ACT_OK;
	}
	if (p.ip->ttl <= 1) {
		count(&onc_stats, STAT_EGRESS_MISS_TTL, 1); /* the slow path sends time-exceeded */
		return TC_ACT_OK;
	}
	if (setup == SETUP_OPEN && flow_open(&key, cfg->epoch, FLOW_OPENED_BY_LOCAL)) {
		count(&onc_stats, STAT_EGRESS_MISS_TCP_FLAGS, 1);
		return TC_ACT_OK;
	}
	ip_dec_ttl(p.ip);
	hash = encap_hash(skb, p.ip->saddr, p.ip->daddr, p.sport, p.dport);
	if (encap_push(skb, encap, encap_sport(hash), encap_ecn(p.ip->tos)))
		return drop_error(skb, &onc_stats, STAT_EGRESS_ERROR, sizeof(struct ethhdr));

	if (key.proto == IPPROTO_TCP)
		flow_close_step(&key, flow, 1, &p.seg);
	if (setup == SETUP_OPEN) {
		count(&onc_stats, STAT_EGRESS_OPEN, 1);
		ev_conn(EV_OPEN, &key, 0, 1);
	} else {
		count(&onc_stats, STAT_EGRESS_HIT, 1);
	}
	return bpf_redirect(encap->ifindex, 0);
}

/*
 * ingress_open opens the connection of a SYN from a peer's pod: only when
 * this node knows the header back to the client's node, since the SYN-ACK
 * must ride the fast path too.
 */
static __always_inline int ingress_open(const struct flow_key *k, const struct cidr_val *peer, __u32 epoch)
{
	if (!bpf_map_lookup_elem(&onc_encap, &peer->node_ip))
		return -1;
	return flow_open(k, epoch, FLOW_OPENED_BY_REMOTE);
}

/* decap takes a peer's frame's outer headers (len bytes) off and gives
 * the packet the Ethernet header of pod (proto its type, ETH_P_IP or
 * ETH_P_IPV6); 0, or -1 when the packet could not be rewritten (drop it:
 * it may be half done). */
static __always_inline int decap(struct __sk_buff *skb, const struct local_pod *pod, __be16 proto, __s32 len)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	struct ethhdr *eth;
	void *data, *end;

	if (proto == bpf_htons(ETH_P_IPV6) && onc_decap_ipv6)
		flags |= ONC_ADJ_ROOM_DECAP_L3_IPV6;
	if (bpf_skb_adjust_room(skb, -len, BPF_ADJ_ROOM_MAC, flags))
		return -1;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	__builtin_memcpy(eth->h_dest, pod->pod_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, pod->host_mac, ETH_ALEN);
	eth->h_proto = proto;
	return 0;
}

/* owned6 says whether the IPv6 pod address pod is in the CIDR of a
 * fast-path peer whose tunnel endpoint is node, an IPv4 address (node4)
 * or, on an IPv6 underlay, an IPv6 one (node6). */
static __always_inline int owned6(const struct in6_addr *pod, __be32 node4, const struct in6_addr *node6)
{
	struct cidr_val *peer;
	struct onc_in6 *peer6;

	if (underlay6()) {
		peer6 = peer6_u6_of(pod);
		return peer6 && addr6_equal(peer6, node6);
	}
	peer = peer6_of(pod);
	return peer && peer->node_ip == node4;
}

/* ingress6_open opens the connection of a SYN from a peer's IPv6 pod, as
 * ingress_open does IPv4's: only when this node knows the header back to
 * the client's node, its tunnel endpoint node4 or, on an IPv6 underlay,
 * node6 (the frame's outer source, which owned6 checked). */
static __always_inline int ingress6_open(const struct flow_key6 *k, __be32 node4, const struct in6_addr *node6,
					 __u32 epoch)
{
	if (underlay6() ? !bpf_map_lookup_elem(&onc_encap_u6, node6) : !bpf_map_lookup_elem(&onc_encap, &node4))
		return -1;
	return flow6_open(k, epoch, FLOW_OPENED_BY_REMOTE);
}

/* ingress_fast6 is onc_ingress_fast for a peer's IPv6 packet (see it),
 * in a frame of len bytes of outer headers from the tunnel endpoint
 * outer4 or, on an IPv6 underlay, outer6; the guard passed it. */
static __always_inline int ingress_fast6(struct __sk_buff *skb, __be32 outer4, const struct in6_addr *outer6,
					 __s32 len, void *data, void *end)
{
	struct onc_config *cfg;
	struct local_pod *pod;
	struct flow_val *flow;
	struct flow_key6 key = {};
	struct l4 p;
	int setup;

	if (parse_l4_6(data, end, len + sizeof(struct ethhdr), &p)) {
		count(&onc_stats6, STAT_INGRESS_MISS_NOT_VXLAN, 1);
		return TC_ACT_OK;
	}
	flow6_in(&key, &p);
	cfg = config();
	setup = flow6_setup(&key, p.tcp_flags, p.seg.flags & TCP_ACK, cfg, 0);
	if (setup == SETUP_SLOW) {
		count(&onc_stats6, STAT_INGRESS_MISS_TCP_FLAGS, 1);
		return TC_ACT_OK;
	}
	if (!cfg || !cfg->enabled) {
		count(&onc_stats6, STAT_INGRESS_MISS_DISABLED, 1);
		return TC_ACT_OK;
	}
	if (!owned6(&p.ip6->saddr, outer4, outer6)) {
		count(&onc_stats6, STAT_INGRESS_MISS_NO_PEER, 1);
		return TC_ACT_OK;
	}
	pod = bpf_map_lookup_elem(&onc_local6, &p.ip6->daddr);
	if (!pod) {
		count(&onc_stats6, STAT_INGRESS_MISS_NO_POD, 1);
		/* Perhaps a reply to a flow this node masqueraded. */
		bpf_tail_call(skb, &onc_hooks, HOOK_OVERLAY_TO_NO_POD);
		return TC_ACT_OK;
	}
	flow = setup == SETUP_OPEN ? NULL : filter_allowed(&onc_filter6, &key, cfg->epoch);
	if (setup != SETUP_OPEN && !flow) {
		count(&onc_stats6, STAT_INGRESS_MISS_FLOW, 1);
		return TC_ACT_OK;
	}
	if (!hop_ok6(&p, STAT_INGRESS_MISS_TTL))
		return TC_ACT_OK;
	if (setup == SETUP_OPEN && ingress6_open(&key, outer4, outer6, cfg->epoch)) {
		count(&onc_stats6, STAT_INGRESS_MISS_REPLY, 1);
		return TC_ACT_OK;
	}
	p.ip6->hop_limit--;
	if (decap(skb, pod, bpf_htons(ETH_P_IPV6), len))
		return drop_error(skb, &onc_stats6, STAT_INGRESS_ERROR, len + sizeof(struct ethhdr));
	sent6(&key, flow, &p, setup, 0);
	/* Out of an IPv4 tunnel without the flag the skb still says IPv4:
	 * the veth's crossing reads the protocol from the Ethernet header. */
	return onc_decap_ipv6 || underlay6() ? bpf_redirect_peer(pod->ifindex, 0) : bpf_redirect(pod->ifindex, 0);
}

/* ingress_fast_u6 is onc_ingress_fast on an IPv6 underlay, after the
 * guard: only IPv6 pods' packets take the fast path there. */
static __always_inline int ingress_fast_u6(struct __sk_buff *skb, void *data, void *end)
{
	struct ipv6hdr *outer = parse_vxlan6(data, end);

	if (!outer || !is_ipv6(data + ONC_ENCAP6_LEN, end)) {
		count(&onc_stats, STAT_INGRESS_MISS_NOT_VXLAN, 1);
		return TC_ACT_OK;
	}
	return ingress_fast6(skb, 0, &outer->saddr, ONC_ENCAP6_LEN, data, end);
}

/*
 * Ingress fast path: tc ingress of the uplink. A VXLAN packet of a flow the
 * slow path established, from the node that owns the sender's CIDR, to a
 * local pod loses its outer headers, gets the pod's MACs and goes straight
 * into the pod (bpf_redirect_peer): no VXLAN device, no routing, no netfilter.
 * Before anything else, every frame for the VXLAN port passes the overlay
 * guard (overlay.h), which drops what no peer may send.
 */
SEC("tc")
int onc_ingress_fast(struct __sk_buff *skb)
{
	void *data, *end;
	struct onc_config *cfg;
	struct local_pod *pod;
	struct cidr_val *peer;
	struct flow_val *flow;
	struct flow_key key = {};
	struct iphdr *outer;
	struct l4 p;
	int drop, setup;

	drop = overlay_guard(skb);
	if (drop) {
		count(&onc_stats, drop, 1);
		ev_drop(skb, underlay6() ? ONC_HDR6_LEN : ONC_HDR_LEN, sizeof(struct ethhdr), EV_TABLE_ONC_STAT, drop);
		return TC_ACT_SHOT;
	}
	/* After the guard, which may have pulled data. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (underlay6())
		return ingress_fast_u6(skb, data, end);
	outer = parse_vxlan(data, end);
	if (outer && is_ipv6(data + ONC_ENCAP_LEN, end))
		return ingress_fast6(skb, outer->saddr, NULL, ONC_ENCAP_LEN, data, end);
	if (!outer || !is_ipv4(data + ONC_ENCAP_LEN, end) ||
	    parse_l4(data, end, ONC_HDR_LEN, &p)) {
		count(&onc_stats, STAT_INGRESS_MISS_NOT_VXLAN, 1);
		return TC_ACT_OK;
	}
	flow_in(&key, &p);
	cfg = config();
	setup = flow_setup(&key, p.tcp_flags, p.seg.flags & TCP_ACK, cfg, 0);
	if (setup == SETUP_SLOW) {
		count(&onc_stats, STAT_INGRESS_MISS_TCP_FLAGS, 1);
		return TC_ACT_OK;
	}
	if (!cfg || !cfg->enabled) {
		count(&onc_stats, STAT_INGRESS_MISS_DISABLED, 1);
		return TC_ACT_OK;
	}
	if (is_host(p.ip->saddr)) {
		count(&onc_stats, STAT_INGRESS_MISS_HOST, 1);
		return TC_ACT_OK;
	}
	peer = peer_of(p.ip->saddr);
	if (!peer || peer->node_ip != outer->saddr) {
		count(&onc_stats, STAT_INGRESS_MISS_NO_PEER, 1);
		return TC_ACT_OK;
	}
	pod = bpf_map_lookup_elem(&onc_local, &p.ip->daddr);
	if (!pod) {
		count(&onc_stats, STAT_INGRESS_MISS_NO_POD, 1);
		/* Perhaps a reply to a flow this node masqueraded. */
		bpf_tail_call(skb, &onc_hooks, HOOK_OVERLAY_TO_NO_POD);
		return TC_ACT_OK;
	}
	flow = setup == SETUP_OPEN ? NULL : flow_allowed(&key, cfg->epoch);
	if (setup != SETUP_OPEN && !flow) {
		count(&onc_stats, STAT_INGRESS_MISS_FLOW, 1);
		return TC_ACT_OK;
	}
	if (p.ip->ttl <= 1) {
		count(&onc_stats, STAT_INGRESS_MISS_TTL, 1);
		return TC_ACT_OK;
	}
	if (setup == SETUP_OPEN && ingress_open(&key, peer, cfg->epoch)) {
		count(&onc_stats, STAT_INGRESS_MISS_REPLY, 1);
		return TC_ACT_OK;
	}
	ip_dec_ttl(p.ip);
	if (decap(skb, pod, bpf_htons(ETH_P_IP), ONC_ENCAP_LEN))
		return drop_error(skb, &onc_stats, STAT_INGRESS_ERROR, ONC_HDR_LEN);
	if (key.proto == IPPROTO_TCP)
		flow_close_step(&key, flow, 0, &p.seg);
	if (setup == SETUP_OPEN) {
		count(&onc_stats, STAT_INGRESS_OPEN, 1);
		ev_conn(EV_OPEN, &key, 0, 0);
	} else {
		count(&onc_stats, STAT_INGRESS_HIT, 1);
	}
	return bpf_redirect_peer(pod->ifindex, 0);
}

/*
 * Egress learning: tc egress of the uplink, after the kernel's VXLAN device
 * encapsulated a packet. If the slow path marked its inner packet as part of
 * an ESTABLISHED flow from a local pod to a fast-path peer, remember the
 * destination's node and the headers, and that the flow may leave.
 */

/* The outer header as the egress program uses it: the fields it rewrites
 * per packet (IP length, id, checksum, ECN bits, which the kernel copies
 * from each inner packet; UDP source port, length, checksum) are zeroed,
 * and the inner Ethernet type is IPv4's (encap_inner_ipv6 sets IPv6's per
 * packet), so two packets to one node give the same template. */
static __always_inline void encap_template(struct encap_val *e)
{
	struct iphdr *ip = (void *)(e->hdr + sizeof(struct ethhdr));
	struct udphdr *udp = (void *)(ip + 1);
	struct ethhdr *inner = (void *)(e->hdr + ONC_ENCAP_LEN);

	ip->tos &= ~ONC_ECN_MASK;
	ip->tot_len = 0;
	ip->id = 0;
	ip->check = 0;
	udp->source = 0;
	udp->len = 0;
	udp->check = 0;
	inner->h_proto = bpf_htons(ETH_P_IP); /* one header for both families */
}

/* learn_encap learns the header of skb, a frame to node: whether it wrote. */
static __always_inline int learn_encap(struct __sk_buff *skb, __be32 node)
{
	struct encap_val encap = {}, *cur;

	if (bpf_skb_load_bytes(skb, 0, encap.hdr, ONC_HDR_LEN))
		return 0;
	encap_template(&encap);
	encap.ifindex = skb->ifindex;
	/* Each write only when it changes (see filter_learn). */
	cur = bpf_map_lookup_elem(&onc_encap, &node);
	if (cur && cur->ifindex == encap.ifindex && hdr_equal(cur->hdr, encap.hdr, ONC_HDR_LEN / 4))
		return 0;
	bpf_map_update_elem(&onc_encap, &node, &encap, BPF_ANY);
	return 1;
}

/* learn_dest6 remembers that the remote IPv6 pod is behind the node
 * whose tunnel endpoint is node4 or, on an IPv6 underlay, node6: whether
 * it wrote. */
static __always_inline int learn_dest6(const struct in6_addr *pod, __be32 node4, const struct in6_addr *node6)
{
	struct egress_val dst = { .node_ip = node4 }, *cur;
	struct onc_in6 dst6, *cur6;

	if (underlay6()) {
		cur6 = bpf_map_lookup_elem(&onc_egress6_u6, pod);
		if (cur6 && addr6_equal(cur6, node6))
			return 0;
		__builtin_memcpy(&dst6, node6, sizeof(dst6));
		bpf_map_update_elem(&onc_egress6_u6, pod, &dst6, BPF_ANY);
		return 1;
	}
	cur = bpf_map_lookup_elem(&onc_egress6, pod);
	if (cur && cur->node_ip == node4)
		return 0;
	bpf_map_update_elem(&onc_egress6, pod, &dst, BPF_ANY);
	return 1;
}

/* learn_egress6 is onc_learn_egress for a frame whose inner packet is
 * IPv6 (see it), with len bytes of outer headers to the tunnel endpoint
 * outer4 or, on an IPv6 underlay, outer6. */
static __always_inline int learn_egress6(struct __sk_buff *skb, const struct onc_config *cfg, __be32 outer4,
					 const struct in6_addr *outer6, __s32 len, void *data, void *end)
{
	struct flow_key6 key = {};
	struct onc_in6 node6;
	int wrote;
	struct l4 p;

	if (parse_l4_6(data, end, len + sizeof(struct ethhdr), &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(&onc_stats6, STAT_LEARN_PAUSED, 1);
		return TC_ACT_OK;
	}
	if (!learnable(&p) || !owned6(&p.ip6->daddr, outer4, outer6))
		return TC_ACT_OK;
	if (underlay6()) {
		__builtin_memcpy(&node6, outer6, sizeof(node6));
		wrote = learn_encap6(skb, &node6);
	} else {
		wrote = learn_encap(skb, outer4);
	}
	if (!bpf_map_lookup_elem(&onc_local6, &p.ip6->saddr)) {
		count(&onc_stats6, wrote ? STAT_LEARN_EGRESS : STAT_LEARN_KNOWN, 1);
		return TC_ACT_OK;
	}
	wrote |= learn_dest6(&p.ip6->daddr, outer4, outer6);
	flow6_out(&key, &p);
	wrote |= filter_learn(&onc_filter6, &key, cfg->epoch, 1);
	count(&onc_stats6, wrote ? STAT_LEARN_EGRESS : STAT_LEARN_KNOWN, 1);
	return TC_ACT_OK;
}

/* learn_egress_u6 is onc_learn_egress on an IPv6 underlay: only IPv6
 * pods' flows are learned there. */
static __always_inline int learn_egress_u6(struct __sk_buff *skb, const struct onc_config *cfg, void *data, void *end)
{
	struct ipv6hdr *outer = parse_vxlan6(data, end);

	if (!outer || !is_ipv6(data + ONC_ENCAP6_LEN, end))
		return TC_ACT_OK;
	return learn_egress6(skb, cfg, 0, &outer->daddr, ONC_ENCAP6_LEN, data, end);
}

SEC("tc")
int onc_learn_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct onc_config *cfg;
	struct egress_val dst = {}, *cur_dst;
	struct flow_key key = {};
	struct cidr_val *peer;
	struct iphdr *outer;
	int wrote;
	struct l4 p;

	if (!(skb->mark & onc_mark))
		return TC_ACT_OK;
	skb->mark &= ~onc_mark; /* ONC's bit never leaves the node */
	/* Off, the fast path learns nothing (it flushes when switched on). */
	cfg = config();
	if (!cfg || !cfg->enabled)
		return TC_ACT_OK;
	if (underlay6())
		return learn_egress_u6(skb, cfg, data, end);
	outer = parse_vxlan(data, end);
	if (outer && is_ipv6(data + ONC_ENCAP_LEN, end))
		return learn_egress6(skb, cfg, outer->daddr, NULL, ONC_ENCAP_LEN, data, end);
	if (!outer || !is_ipv4(data + ONC_ENCAP_LEN, end) || parse_l4(data, end, ONC_HDR_LEN, &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(&onc_stats, STAT_LEARN_PAUSED, 1);
		return TC_ACT_OK;
	}
	if (!learnable(&p))
		return TC_ACT_OK;
	/* Only flows to a fast-path peer, sent to its owner. */
	if (is_host(p.ip->daddr))
		return TC_ACT_OK;
	peer = peer_of(p.ip->daddr);
	if (!peer || peer->node_ip != outer->daddr)
		return TC_ACT_OK;

	dst.node_ip = outer->daddr;
	wrote = learn_encap(skb, dst.node_ip);
	/* The header is the node's, whoever sent: a flow from outside that
	 * this node masqueraded to a backend there teaches it too, for the
	 * uplink load balancer. Destinations and flows are local pods'. */
	if (!bpf_map_lookup_elem(&onc_local, &p.ip->saddr)) {
		count(&onc_stats, wrote ? STAT_LEARN_EGRESS : STAT_LEARN_KNOWN, 1);
		return TC_ACT_OK;
	}
	cur_dst = bpf_map_lookup_elem(&onc_egress, &p.ip->daddr);
	if (!cur_dst || cur_dst->node_ip != dst.node_ip) {
		bpf_map_update_elem(&onc_egress, &p.ip->daddr, &dst, BPF_ANY);
		wrote = 1;
	}
	flow_out(&key, &p);
	wrote |= flow_learn(&key, cfg->epoch, 1);
	count(&onc_stats, wrote ? STAT_LEARN_EGRESS : STAT_LEARN_KNOWN, 1);
	return TC_ACT_OK;
}

/* learn_ingress6 is onc_learn_ingress for an IPv6 packet (see it). */
static __always_inline int learn_ingress6(const struct onc_config *cfg, void *data, void *end)
{
	struct flow_key6 key = {};
	struct l4 p;

	if (parse_l4_6(data, end, sizeof(struct ethhdr), &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(&onc_stats6, STAT_LEARN_PAUSED, 1);
		return TC_ACT_OK;
	}
	if (!learnable(&p) || !bpf_map_lookup_elem(&onc_local6, &p.ip6->daddr))
		return TC_ACT_OK;
	flow6_in(&key, &p);
	count(&onc_stats6, filter_learn(&onc_filter6, &key, cfg->epoch, 0) ? STAT_LEARN_INGRESS : STAT_LEARN_KNOWN, 1);
	return TC_ACT_OK;
}

/*
 * Ingress learning: tc egress of a pod's host-side veth (packets about to
 * enter the pod). If the slow path marked the packet as part of an
 * ESTABLISHED flow that came in over onc.vxlan, or by the uplink from a
 * client outside (datapath/netfilter marks only those), remember that the
 * flow may enter.
 */
SEC("tc")
int onc_learn_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct onc_config *cfg;
	struct flow_key key = {};
	struct l4 p;

	if (!(skb->mark & onc_mark))
		return TC_ACT_OK;
	skb->mark &= ~onc_mark; /* ONC's bit never reaches the pod */
	/* Off, the fast path learns nothing (it flushes when switched on). */
	cfg = config();
	if (!cfg || !cfg->enabled)
		return TC_ACT_OK;
	if (is_ipv6(data, end))
		return learn_ingress6(cfg, data, end);
	if (!is_ipv4(data, end) || parse_l4(data, end, sizeof(struct ethhdr), &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(&onc_stats, STAT_LEARN_PAUSED, 1);
		return TC_ACT_OK;
	}
	if (!learnable(&p))
		return TC_ACT_OK;
	if (is_host(p.ip->saddr) || !bpf_map_lookup_elem(&onc_local, &p.ip->daddr))
		return TC_ACT_OK;
	flow_in(&key, &p);
	count(&onc_stats, flow_learn(&key, cfg->epoch, 0) ? STAT_LEARN_INGRESS : STAT_LEARN_KNOWN, 1);
	return TC_ACT_OK;
}
