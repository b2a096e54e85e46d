//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Services at the socket: every cgroup hook of the socket LB, as Cilium's
 * bpf_sock.c holds its own. A ClusterIP:port, IPv4 or IPv6, is rewritten
 * to a backend pod when a socket connects or sends, and back when it
 * reads a reply or asks for its peer (include/services.h). And from
 * outside the cluster, on the uplink: NodePorts, externalIPs and load
 * balancer IPs, in IPv4 (include/services_uplink.h) and IPv6
 * (include/services_uplink6.h).
 */
#include "include/services.h"
#include "include/services_uplink.h"
#include "include/services_uplink6.h"
#include "include/services_dsr.h"
#include "include/services_dsr6.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* TCP and connected UDP to a ClusterIP connect to a backend pod instead;
 * no packet of the connection carries the ClusterIP. */
SEC("cgroup/connect4")
int onc_sock_connect4(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, 0, LB_STAT_CONNECT_TRANSLATED, LB_STAT_CONNECT_REFUSED);
}

/* A datagram of an unconnected UDP socket to a ClusterIP is sent to a
 * backend pod instead; so is a dual-stack socket's to an IPv4-mapped
 * ClusterIP, which the kernel sends as IPv4. */
SEC("cgroup/sendmsg4")
int onc_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, 0, LB_STAT_SENDMSG_TRANSLATED, LB_STAT_SENDMSG_REFUSED);
}

/* A UDP reply from a backend reads as coming from the ClusterIP:port it
 * was sent to, as resolvers and other clients check. */
SEC("cgroup/recvmsg4")
int onc_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, 0, LB_STAT_RECVMSG_REVERSED);
	return SYS_PROCEED;
}

/* A socket connected through a Service reports the ClusterIP:port it
 * dialled, not the backend it reached. */
SEC("cgroup/getpeername4")
int onc_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, 0, LB_STAT_GETPEERNAME_REVERSED);
	return SYS_PROCEED;
}

/* The same for AF_INET6 sockets: an IPv6 ClusterIP, or an IPv4 one
 * IPv4-mapped (a dual-stack socket). */
SEC("cgroup/connect6")
int onc_sock_connect6(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, 1, LB_STAT_CONNECT6_TRANSLATED, LB_STAT_CONNECT6_REFUSED);
}

SEC("cgroup/sendmsg6")
int onc_sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, 1, LB_STAT_SENDMSG6_TRANSLATED, LB_STAT_SENDMSG6_REFUSED);
}

SEC("cgroup/recvmsg6")
int onc_sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, 1, LB_STAT_RECVMSG6_REVERSED);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int onc_sock_getpeername6(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, 1, LB_STAT_GETPEERNAME6_REVERSED);
	return SYS_PROCEED;
}

/*
 * A closing socket's reverse translation goes with it. A connected socket
 * has one, keyed by its peer; an unconnected UDP socket's entries (one per
 * backend it sent to) age out of the LRU. An AF_INET6 socket's peer keys
 * the IPv6 entries, or the IPv4 ones when it is IPv4-mapped.
 */
SEC("cgroup/sock_release")
int onc_sock_release(struct bpf_sock *sk)
{
	struct lb6_addr be = {};
	__u8 proto = (__u8)sk->protocol;
	int released;
	__u64 sock;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	sock = bpf_get_socket_cookie(sk);
	be.port = sk->dst_port;
	if (sk->family == ONC_AF_INET) {
		be.ip[0] = sk->dst_ip4;
		if (!lb_unset(&be) && lb_revnat_delete(0, sock, &be, proto))
			lb_count(0, LB_STAT_RELEASED);
		return SYS_PROCEED;
	}
	if (sk->family != ONC_AF_INET6)
		return SYS_PROCEED;
	be.ip[0] = sk->dst_ip6[0];
	be.ip[1] = sk->dst_ip6[1];
	be.ip[2] = sk->dst_ip6[2];
	be.ip[3] = sk->dst_ip6[3];
	if (lb_unset(&be))
		return SYS_PROCEED;
	if (lb_unmap(&be))
		released = lb_revnat_delete(1, sock, &be, proto);
	else
		released = lb_revnat_delete(0, sock, &be, proto);
	if (released)
		lb_count(1, LB_STAT_RELEASED6);
	return SYS_PROCEED;
}

/* Ends a connected UDP socket whose peer is be, if this node translated
 * it there for a service that be has left (listed in onc_lb_gone or
 * onc_lb6_gone). */
static __always_inline int lb_udp_end(struct sock_common *sk, int fam6, const struct lb6_addr *be)
{
	__u64 sock = bpf_get_socket_cookie(sk);
	struct lb6_addr vip;
	__u32 svc_id;

	if (!lb_recall(fam6, sock, be, IPPROTO_UDP, &vip, &svc_id) ||
	    !lb_listed(fam6, &onc_lb_gone, &onc_lb6_gone, svc_id, be))
		return 0;
	if (bpf_sock_destroy(sk)) {
		count(&onc_lb_destroy_stats, LB_DESTROY_STAT_UDP_DESTROY_FAILED, 1);
		return 0;
	}
	/* Disconnected now, so sock_release would not find the entry. */
	lb_revnat_delete(fam6, sock, be, IPPROTO_UDP);
	count(&onc_lb_destroy_stats, LB_DESTROY_STAT_UDP_DESTROYED, 1);
	return 0;
}

/*
 * Ends each connected UDP socket of the iterated network namespace that
 * this node translated to a backend listed as gone for the service it
 * was translated for, of either family: its pending and next calls fail
 * with ECONNABORTED, and the client's next connect() picks a live
 * backend. A socket connected to a pod IP by the application has no
 * reverse entry, nor does one of another agent: neither is touched.
 * Unconnected sockets pick per datagram and need nothing.
 */
SEC("iter/udp")
int onc_sock_udp_destroy(struct bpf_iter__udp *ctx)
{
	struct sock_common *sk = ctx->udp_sk;
	struct lb6_addr be = {};

	if (!sk || !bpf_sock_destroy)
		return 0;
	be.port = sk->skc_dport;
	if (sk->skc_family == ONC_AF_INET) {
		be.ip[0] = sk->skc_daddr;
		return lb_unset(&be) ? 0 : lb_udp_end(sk, 0, &be);
	}
	if (sk->skc_family != ONC_AF_INET6)
		return 0;
	be.ip[0] = sk->skc_v6_daddr.in6_u.u6_addr32[0];
	be.ip[1] = sk->skc_v6_daddr.in6_u.u6_addr32[1];
	be.ip[2] = sk->skc_v6_daddr.in6_u.u6_addr32[2];
	be.ip[3] = sk->skc_v6_daddr.in6_u.u6_addr32[3];
	if (lb_unset(&be))
		return 0;
	return lb_unmap(&be) ? lb_udp_end(sk, 1, &be) : lb_udp_end(sk, 0, &be);
}

/*
 * tcx ingress of the uplink, ahead of the fast path's program: a packet
 * from outside to a NodePort, externalIP or load balancer IP is checked
 * (a spoofed source, a client outside the source ranges: dropped) and
 * sent to its flow's backend, through the stack or past it, or to the
 * backend's node directly (direct server return); one the service has
 * none for is left to netfilter to refuse, or dropped. And a peer's
 * frame for a flow it sends directly is taken (services_dsr.h; an IPv6
 * client's, services_dsr6.h). An IPv6 packet is lb6_uplink_ingress's
 * (services_uplink6.h).
 *
 * Each family's half is a function of its own, not inlined: each has its
 * own stack frame (together they would exceed the 512 bytes a program
 * may use), and the IPv4 half is verified as it was.
 */
static __attribute__((noinline)) int lb_uplink_ingress4(struct __sk_buff *skb)
{
	struct lb_svc_key key = { .scope = LB_SCOPE_UPLINK };
	struct lb_svc *found;
	struct lb_svc svc;
	struct lb_addr be, fe;
	struct lb_pkt p;
	__u8 dsr = 0;

	if (lb_parse(skb, &p))
		return LB_NEXT;
	/* A peer's frame: perhaps a client's packet for a backend here (an
	 * IPv4 underlay's; on an IPv6 one lb6_uplink_ingress takes them). */
	if (onc_node_ip && p.proto == IPPROTO_UDP && p.dport == onc_vxlan_port)
		return lb_dsr_receive(skb, &p);
	key.vip = p.daddr;
	key.port = p.dport;
	key.proto = p.proto;
	found = bpf_map_lookup_elem(&onc_lb_svc, &key);
	if (!found)
		return LB_NEXT;
	svc = *found;
	/* Nobody outside speaks for a pod or for this node. */
	if (lb_internal(p.saddr)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_SPOOFED);
	}
	switch (lb_flow_backend(&p, &svc, &be, &dsr)) {
	case LB_FLOW_OK:
		break;
	case LB_FLOW_FOREIGN:
		return LB_NEXT;
	case LB_FLOW_OUT_OF_RANGE: /* dropped, as kube-proxy drops them */
		count(&onc_lb_uplink_stats, LB_STAT_UPLINK_SOURCE_RANGE_DROP, 1);
		lb_count_svc(svc.id, 1);
		return TC_ACT_SHOT;
	case LB_FLOW_EMPTY:
		lb_count_svc(svc.id, 1);
		if (svc.flags & LB_SVC_DROP_WHEN_EMPTY) {
			return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_NO_ENDPOINTS_DROP);
		}
		count(&onc_lb_uplink_stats, LB_STAT_UPLINK_REFUSED, 1);
		skb->mark |= LB_MARK_REJECT;
		return LB_NEXT;
	default:
		return TC_ACT_SHOT;
	}
	if (dsr) {
		fe.ip = p.daddr;
		fe.port = p.dport;
		return lb_dsr_send(skb, &p, &fe, &be);
	}
	if (lb_rewrite(skb, &p, 1, &be)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_TRANSLATED, 1);
	/* A backend on another node must answer through this one. */
	if (!(svc.flags & LB_SVC_KEEP_CLIENT))
		skb->mark |= LB_MARK_SNAT;
	return lb_fast_path(skb, &p, &be);
}

/* The IPv6 half, with x in a frame of its own: the IPv4 half's chain of
 * frames is close to the verifier's 512 bytes. The fast path's verdicts
 * are never DSR steps, so lb_dsr6_step passes them on. */
static __attribute__((noinline)) int lb_uplink_ingress6(struct __sk_buff *skb)
{
	struct lb6_xlat x = {};
	int rc = lb6_uplink_ingress(skb, &x);

	return x.ok ? lb6_uplink_fast(skb, &x) : rc;
}

/*
 * The program: its IPv4 half above, its IPv6 one in services_uplink6.h,
 * whose fast path (lb6_uplink_fast) runs beside lb6_uplink_ingress, not
 * inside it: each frame on its own, on top of this one's. An IPv6
 * frontend's direct server return runs after either half, in frames of
 * its own too (lb_dsr6_step). The two never share a packet, as in IPv4
 * (lb_uplink_ingress4: lb_dsr_send or lb_fast_path): a DSR flow's packet
 * leaves x empty, and what x holds is never a DSR step.
 */
SEC("tc")
int onc_uplink_lb_ingress(struct __sk_buff *skb)
{
	int rc;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		rc = lb_uplink_ingress6(skb);
	else
		rc = lb_uplink_ingress4(skb);
	return lb_dsr6_step(skb, rc);
}

/*
 * tcx egress of the uplink, ahead of the fast path's learning: a backend's
 * reply to a client (after conntrack undid the SNAT, for a remote backend;
 * a local backend's to a flow a peer sent directly) leaves from the
 * frontend the client sent to, and, when netfilter marked it ESTABLISHED,
 * teaches the flow cache that the flow may leave. An IPv6 packet is
 * lb6_uplink_egress's (services_uplink6.h).
 */
SEC("tc")
int onc_uplink_lb_egress(struct __sk_buff *skb)
{
	struct lb_flow *rev;
	struct lb_addr fe;
	struct lb_pkt p;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return lb6_uplink_egress(skb);
	if (lb_parse(skb, &p))
		return LB_NEXT;
	rev = lb_reply_flow(p.saddr, p.sport, p.daddr, p.dport, p.proto);
	if (!rev)
		return LB_NEXT;
	lb_learn_reply(skb, &p, rev);
	fe = lb_flow_addr(rev);
	if (lb_rewrite(skb, &p, 0, &fe)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_REVERSED, 1);
	return LB_NEXT;
}

/*
 * A pod's packet to a client outside, passed on by the fast path's egress
 * program (onc_hooks) after its own checks, the source and a TCP packet's
 * flags among them (flow_setup): the reply of a flow to a backend on this
 * node, established both ways, gets its frontend's address and leaves by
 * the uplink at once, the kernel's neighbour table giving the next hop.
 * A SYN-ACK, FIN or RST does only in a connection the fast path opened
 * (lb_open): conntrack saw every other open and must see its close; the
 * packet that ends such a connection (flow_close_step) takes its records along.
 * Anything else takes the stack. An IPv6 packet is lb6_uplink_reply's
 * (services_uplink6.h).
 */
SEC("tc")
int onc_uplink_lb_reply(struct __sk_buff *skb)
{
	struct flow_key cached = {};
	struct onc_config *cfg;
	struct flow_val *flow;
	struct lb_flow *rev;
	struct lb_addr fe, be;
	struct lb_pkt p;
	__u32 ifindex;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return lb6_uplink_reply(skb);
	if (lb_parse(skb, &p) || p.syn || p.ttl <= 1)
		return TC_ACT_OK;
	rev = lb_reply_flow(p.saddr, p.sport, p.daddr, p.dport, p.proto);
	if (!rev || !rev->ifindex)
		return TC_ACT_OK;
	cfg = config();
	if (!cfg || !cfg->enabled)
		return TC_ACT_OK;
	lb_cache_key(&cached, p.saddr, p.sport, p.daddr, p.dport, p.proto);
	flow = flow_allowed(&cached, cfg->epoch);
	if (!flow || ((p.tcp_flags & TCP_CTL) && !flow->opener))
		return TC_ACT_OK;
	fe = lb_flow_addr(rev);
	ifindex = rev->ifindex;
	if (lb_rewrite(skb, &p, 0, &fe) || lb_dec_ttl(skb, &p)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	if (p.proto == IPPROTO_TCP && flow_close_step(&cached, flow, 1, &p.seg)) {
		be.ip = p.saddr;
		be.port = p.sport;
		lb_forget(p.daddr, p.dport, &fe, &be, p.proto);
	}
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_FAST_REPLY, 1);
	return bpf_redirect_neigh(ifindex, NULL, 0, 0);
}


/*
 * A VXLAN frame to no pod of this node, passed on by the fast path's
 * ingress program after the overlay guard and its own checks (the inner
 * source is a pod of the node that sent it): the reply of a backend on
 * that node to a flow this node sent it masqueraded (to an address of
 * this node's pod CIDR, its gateway), established in conntrack, is
 * decapsulated, given back the client's address and the frontend's, and
 * sent out of the uplink the flow's replies leave by. Anything else, a
 * GRO super-packet (its tunnel offload state is not for the uplink), and
 * every TCP SYN, FIN and RST, takes the stack.
 */
SEC("tc")
int onc_uplink_lb_overlay_reply(struct __sk_buff *skb)
{
	struct ct_ends t, orig;
	struct lb_addr client, fe;
	struct lb_flow *rev;
	struct lb_pkt p;

	if (lb6_overlay_frame(skb))
		return lb6_uplink_overlay_reply(skb);
	/* A node without IPv4 pods has a zero mask, which every address
	 * would match. */
	if (skb->gso_segs > 1 || lb_parse_at(skb, ONC_HDR_LEN, &p) || (p.tcp_flags & TCP_CTL) || p.ttl <= 1 ||
	    !onc_pod_mask || (p.daddr & onc_pod_mask) != onc_pod_net)
		return TC_ACT_OK;
	t.saddr = p.saddr;
	t.daddr = p.daddr;
	t.sport = p.sport;
	t.dport = p.dport;
	/* A reply: conntrack's original direction ran from the client to
	 * this backend. */
	if (ct_established(skb, &t, p.proto, CT_DIR_REPLY, 1, &orig) || orig.daddr != p.saddr || orig.dport != p.sport)
		return TC_ACT_OK;
	client.ip = orig.saddr;
	client.port = orig.sport;
	rev = lb_reply_flow(p.saddr, p.sport, client.ip, client.port, p.proto);
	if (!rev || !rev->ifindex)
		return TC_ACT_OK;
	if (bpf_skb_adjust_room(skb, -ONC_ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		goto err;
	p.l4off -= ONC_ENCAP_LEN;
	fe = lb_flow_addr(rev);
	if (lb_rewrite(skb, &p, 0, &fe) || lb_rewrite(skb, &p, 1, &client) || lb_dec_ttl(skb, &p))
		goto err;
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_FAST_FROM_REMOTE, 1);
	return bpf_redirect_neigh(rev->ifindex, NULL, 0, 0);
err:
	return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
}
