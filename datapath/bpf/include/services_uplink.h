/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Services from outside the cluster, balanced on the uplink (tc, tcx): a
 * packet to a NodePort, externalIP or load balancer IP (an LB_SCOPE_UPLINK
 * entry of onc_lb_svc) gets a backend's address and port before the stack
 * sees it, and the stack routes it to the local pod or over the overlay.
 * Replies get the frontend's address back on their way out of the uplink.
 * With direct server return (LB_SVC_DSR, services_dsr.h) a flow to a pod
 * on another node never enters this node's stack: its packets are sent
 * to that node directly, which answers the client itself.
 *
 * The programs end the link's chain only on a packet they drop or send
 * past the stack themselves (below): every other packet, translated or
 * not, goes on to the fast path's program behind them (the overlay guard).
 *
 * Once netfilter let a flow to a backend on this node through ESTABLISHED
 * both ways (the flow cache's verdict, include/flow_cache.h), its packets
 * skip the stack: the ingress program hands them straight into the pod,
 * and the pod's replies, which the fast path's egress program passes on
 * (onc_hooks), leave by the uplink at once (services.c). A flow to a
 * backend on another node skips it once conntrack holds it established
 * and masqueraded (include/conntrack.h): the ingress program gives its
 * packets the masqueraded source and the outer headers the overlay put
 * on earlier packets to that node, and the replies, which the fast
 * path's ingress program passes on, are decapsulated and reversed at
 * once. A TCP connection to a backend on this node that no policy
 * isolates opens, runs and closes on the fast path (conn_setup.h), never
 * seen by conntrack; every other connection's SYN, FIN and RST take the
 * stack (of the node that holds the flow's conntrack entry), so conntrack
 * sees it open and close.
 *
 * Address translation the kernel must do stays the kernel's: SNAT of
 * packets to a backend on another node (ONC's MASQUERADE rule, matching
 * LB_MARK_SNAT and the overlay device; conntrack undoes it on the reply),
 * and refusals of services without backends (ONC's REJECT rules, matching
 * LB_MARK_REJECT: a TCP reset or an ICMP port unreachable, as kube-proxy's
 * REJECT answers). datapath/netfilter installs both.
 */
#ifndef __ONC_SERVICES_UPLINK_H
#define __ONC_SERVICES_UPLINK_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include "services.h"
#include "conn_setup.h"
#include "conntrack.h"
#include "encap.h"
#include "parse.h"

/* TCX_NEXT (older uapi headers lack it): the next program on the link runs. */
#define LB_NEXT TC_ACT_UNSPEC

/* skb->mark bits for netfilter; datapath/services/uplink.go has the same. */
#define LB_MARK_SNAT 0x80000
#define LB_MARK_REJECT 0x100000


/* What lb_flow_backend found. */
enum lb_flow_verdict {
	LB_FLOW_FOREIGN = -3, /* no flow of ours: a reply, or a connection never seen opening */
	LB_FLOW_OUT_OF_RANGE = -2, /* a new flow from outside loadBalancerSourceRanges */
	LB_FLOW_ERROR = -1,
	LB_FLOW_EMPTY = 0, /* a new flow, and no backend to give it */
	LB_FLOW_OK = 1,
};

/* Counters of the uplink programs (per CPU); onctl decodes them by name. */
enum lb_uplink_stat {
	LB_STAT_UPLINK_TRANSLATED,    /* packets sent to a backend */
	LB_STAT_UPLINK_NEW_FLOW,      /* flows given a backend */
	LB_STAT_UPLINK_AFFINITY_HIT,  /* new flows sent to the client's remembered backend */
	LB_STAT_UPLINK_REFUSED,       /* no backend: left to the REJECT rule */
	LB_STAT_UPLINK_NO_ENDPOINTS_DROP, /* no backend, DROP_WHEN_EMPTY */
	LB_STAT_UPLINK_SOURCE_RANGE_DROP, /* client outside loadBalancerSourceRanges */
	LB_STAT_UPLINK_SPOOFED,       /* source claims a pod or this node */
	LB_STAT_UPLINK_REVERSED,      /* replies given the frontend's address */
	LB_STAT_UPLINK_NO_SLOT,       /* a backend slot was missing: dropped */
	LB_STAT_UPLINK_ERROR,         /* rewriting the packet failed: dropped */
	LB_STAT_UPLINK_FAST_TO_POD,   /* packets handed straight into a local backend */
	LB_STAT_UPLINK_FAST_REPLY,    /* replies sent straight out of the uplink */
	LB_STAT_UPLINK_FAST_TO_REMOTE, /* packets sent straight over the overlay to another node's backend */
	LB_STAT_UPLINK_FAST_FROM_REMOTE, /* that backend's replies, decapsulated and sent straight out */
	LB_STAT_UPLINK_LEARNED,       /* a reply taught the flow cache that its flow may leave */
	LB_STAT_UPLINK_OPEN,          /* SYNs that opened their connection to a local backend on the fast path */
	LB_STAT_UPLINK_MAX,
};

ONC_COUNTERS(onc_lb_uplink_stats, lb_uplink_stat, LB_STAT_UPLINK_MAX);

/* loadBalancerSourceRanges: a service's allowed client prefixes. */
struct lb_src_key {
	__u32 prefixlen; /* 32 (the service id) + the client prefix's length */
	__u32 svc_id;
	__be32 ip;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct lb_src_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_source_ranges SEC(".maps");

/* Sources no packet from outside may carry: the cluster's pod CIDR and
 * this node's addresses. */
struct lb_internal_key {
	__u32 prefixlen;
	__be32 ip;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 64);
	__type(key, struct lb_internal_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_internal SEC(".maps");

/*
 * A flow through the uplink, both ways: LB_FLOW_IN, keyed by the client's
 * packet (client → frontend), names the flow's backend; LB_FLOW_OUT, keyed
 * by the backend's reply as it leaves (backend → client), names the
 * frontend the reply must come from.
 */
enum lb_flow_dir {
	LB_FLOW_IN,
	LB_FLOW_OUT,
};

struct lb_flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir; /* enum lb_flow_dir */
	__u8 pad[2];
};

/* The layout of struct lb_addr followed by two words, so that an upgrade
 * adopts the pinned map: dsr sits where lb_addr's padding, always 0, was. */
struct lb_flow {
	__be32 ip;     /* IN: the backend; OUT: the frontend */
	__be16 port;
	__u8 dsr;      /* IN: sent to the backend's node directly (services_dsr.h) */
	__u8 pad;
	__u32 svc_id;  /* IN: a flow of a service since replaced picks again */
	union {
		__u32 ifindex; /* OUT: the uplink the slow path sent replies by */
		__u32 isn;     /* IN: the sequence number of a TCP flow's SYN */
	};
};

static __always_inline struct lb_addr lb_flow_addr(const struct lb_flow *f)
{
	struct lb_addr a = { .ip = f->ip, .port = f->port };

	return a;
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072); /* 65,536 flows, two entries each */
	__type(key, struct lb_flow_key);
	__type(value, struct lb_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_flows SEC(".maps");

/* An IPv4 TCP or UDP packet that is not a fragment, read with
 * bpf_skb_load_bytes, which needs no linear headers. */
struct lb_pkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 syn; /* TCP, SYN without ACK: a connection's first packet */
	__u8 tcp_flags; /* 0 for UDP */
	__u8 ttl;
	__u8 tos;
	__u32 l4off;
	struct tcp_seg seg; /* TCP only */
};

/* lb_drop drops skb's packet, whose IP header follows the Ethernet one,
 * counting stat in counters, and reports it (a value of table's enum). */
static __always_inline int lb_drop(struct __sk_buff *skb, void *counters, __u8 table, __u32 stat)
{
	count(counters, stat, 1);
	ev_drop(skb, ETH_HLEN, 0, table, stat);
	return TC_ACT_SHOT;
}

static __always_inline int lb_parse_at(struct __sk_buff *skb, __u32 l3off, struct lb_pkt *p)
{
	struct iphdr ip;
	__be16 ports[2];

	/* skb->protocol: a VLAN tag left in the data is not ours to read past. */
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, l3off, &ip, sizeof(ip)))
		return -1;
	if (ip.version != 4 || ip.ihl < 5 || (ip.frag_off & bpf_htons(0x3fff)))
		return -1;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return -1;
	p->l4off = l3off + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, p->l4off, ports, sizeof(ports)))
		return -1;
	p->tcp_flags = 0;
	if (ip.protocol == IPPROTO_TCP) {
		/* From the sequence number to the flags. */
		struct {
			__be32 seq;
			__be32 ack;
			__u8 doff; /* the data offset in its high nibble */
			__u8 flags;
		} t;

		if (bpf_skb_load_bytes(skb, p->l4off + 4, &t, sizeof(t)))
			return -1;
		p->tcp_flags = t.flags;
		p->seg.seq = bpf_ntohl(t.seq);
		p->seg.ack = bpf_ntohl(t.ack);
		p->seg.len = bpf_ntohs(ip.tot_len) - ip.ihl * 4 - (t.doff >> 4) * 4;
		p->seg.flags = t.flags;
	}
	p->syn = (p->tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN;
	p->ttl = ip.ttl;
	p->tos = ip.tos;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->sport = ports[0];
	p->dport = ports[1];
	p->proto = ip.protocol;
	return 0;
}

static __always_inline int lb_parse(struct __sk_buff *skb, struct lb_pkt *p)
{
	return lb_parse_at(skb, ETH_HLEN, p);
}

/*
 * Rewrites the destination (dst) or source address and port, keeping the
 * IPv4 and TCP/UDP checksums right (a UDP checksum of 0, none, stays 0).
 */
static __always_inline int lb_rewrite(struct __sk_buff *skb, const struct lb_pkt *p, int dst,
				      const struct lb_addr *to)
{
	__u32 ip_off = ETH_HLEN + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
	/* TCP and UDP keep their ports at the same offsets. */
	__u32 port_off = p->l4off + (dst ? offsetof(struct udphdr, dest) : offsetof(struct udphdr, source));
	__u32 csum_off = p->l4off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) :
				     offsetof(struct udphdr, check));
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__be32 old_ip = dst ? p->daddr : p->saddr;
	__be16 old_port = dst ? p->dport : p->sport;

	if (bpf_l4_csum_replace(skb, csum_off, old_ip, to->ip, mangled | BPF_F_PSEUDO_HDR | sizeof(to->ip)))
		return -1;
	if (bpf_l4_csum_replace(skb, csum_off, old_port, to->port, mangled | sizeof(to->port)))
		return -1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_ip, to->ip, sizeof(to->ip)))
		return -1;
	if (bpf_skb_store_bytes(skb, ip_off, &to->ip, sizeof(to->ip), 0))
		return -1;
	return bpf_skb_store_bytes(skb, port_off, &to->port, sizeof(to->port), 0);
}

/* The key of a flow's entry for a client's packet, p. */
static __always_inline struct lb_flow_key lb_in_key(const struct lb_pkt *p)
{
	struct lb_flow_key key = {
		.saddr = p->saddr, .daddr = p->daddr, .sport = p->sport, .dport = p->dport,
		.proto = p->proto, .dir = LB_FLOW_IN,
	};

	return key;
}

/* The key of a flow's entry for its backend's replies. */
static __always_inline struct lb_flow_key lb_out_key(__be32 backend, __be16 backend_port, __be32 client,
						     __be16 client_port, __u8 proto)
{
	struct lb_flow_key key = {
		.saddr = backend, .daddr = client, .sport = backend_port, .dport = client_port,
		.proto = proto, .dir = LB_FLOW_OUT,
	};

	return key;
}

/* The flow a backend's packet to a client replies to, if any. */
static __always_inline struct lb_flow *lb_reply_flow(__be32 backend, __be16 backend_port, __be32 client,
						     __be16 client_port, __u8 proto)
{
	struct lb_flow_key key = lb_out_key(backend, backend_port, client, client_port, proto);

	return bpf_map_lookup_elem(&onc_lb_flows, &key);
}

/* lb_dec_ttl lowers the TTL by one, as the forwarding hop the stack would
 * have been. The caller checked that it is above 1. */
static __always_inline int lb_dec_ttl(struct __sk_buff *skb, const struct lb_pkt *p)
{
	__u8 ttl = p->ttl - 1;
	/* TTL and protocol share one 16-bit word of the checksum. */
	__be16 old = bpf_htons((__u16)p->ttl << 8 | p->proto);
	__be16 new = bpf_htons((__u16)ttl << 8 | p->proto);

	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, sizeof(new)))
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &ttl, sizeof(ttl), 0);
}

/* The flow cache's key of a flow between a backend pod of this node and a
 * client outside. */
static __always_inline void lb_cache_key(struct flow_key *k, __be32 pod, __be16 pod_port, __be32 client,
					 __be16 client_port, __u8 proto)
{
	k->local_ip = pod;
	k->remote_ip = client;
	k->local_port = pod_port;
	k->remote_port = client_port;
	k->proto = proto;
}

/*
 * lb_to_remote_pod sends a translated packet to a backend on another node
 * straight over the overlay, once conntrack holds its flow established
 * and masqueraded: with the source MASQUERADE gave the flow's first
 * packets, the outer headers the VXLAN device put on earlier packets to
 * that node, out of the uplink. No policy of this node judges it (the
 * backend's node does). Returns LB_NEXT when the stack must take it.
 */
static __always_inline int lb_to_remote_pod(struct __sk_buff *skb, const struct lb_pkt *p,
					    const struct lb_addr *be, const struct ct_ends *t)
{
	struct ct_ends reply;
	struct encap_val *encap;
	struct cidr_val *peer;
	struct lb_addr snat;
	__u32 mtu = 0;

	peer = peer_of(be->ip);
	if (!peer)
		return LB_NEXT;
	encap = bpf_map_lookup_elem(&onc_encap, &peer->node_ip);
	if (!encap)
		return LB_NEXT;
	/* Too big for the overlay: the stack answers (fragmentation needed),
	 * as the VXLAN device's MTU makes it. A GRO super-packet's segments,
	 * cut to the client's MSS, would be too: the stack takes it too. */
	if (skb->gso_segs > 1 || bpf_check_mtu(skb, encap->ifindex, &mtu, ONC_ENCAP_LEN, 0))
		return LB_NEXT;
	if (ct_established(skb, t, p->proto, CT_DIR_ORIGINAL, 1, &reply))
		return LB_NEXT;
	snat.ip = reply.daddr;
	snat.port = reply.dport;
	if (lb_rewrite(skb, p, 0, &snat) || lb_dec_ttl(skb, p) ||
	    encap_push(skb, encap, encap_sport(encap_hash(skb, snat.ip, be->ip, snat.port, be->port)), encap_ecn(p->tos))) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_FAST_TO_REMOTE, 1);
	return bpf_redirect(encap->ifindex, 0);
}

/*
 * lb_open opens a client's connection to a backend on this node on the
 * fast path (conn_setup.h), k its flow's key, when the pod's replies can
 * ride too: the client is no node (a packet to a node takes the stack,
 * which would find the replies invalid), and the reply has a route, whose
 * device the pod's replies leave by (onc_uplink_lb_reply), as the stack
 * forwarding them would choose it.
 */
static __always_inline int lb_open(struct __sk_buff *skb, const struct flow_key *k, __u8 proto,
				   const struct local_pod *pod, __u32 epoch)
{
	struct bpf_fib_lookup fib = {
		.family = ONC_AF_INET, .l4_protocol = proto, .sport = k->local_port, .dport = k->remote_port,
		.ipv4_src = k->local_ip, .ipv4_dst = k->remote_ip, .ifindex = pod->ifindex,
	};
	struct lb_flow *rev;
	int rc;

	if (is_host(k->remote_ip))
		return -1;
	rev = lb_reply_flow(k->local_ip, k->local_port, k->remote_ip, k->remote_port, proto);
	if (!rev)
		return -1;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	if (rev->ifindex != fib.ifindex)
		rev->ifindex = fib.ifindex;
	return flow_open(k, epoch, FLOW_OPENED_BY_REMOTE);
}

/*
 * lb_forget deletes the uplink's records of a connection to a backend on
 * this node that ended on the fast path (flow_close_step, which forgot the
 * flow cache's): its flow's entries both ways. The client's entry is
 * keyed by the frontend it sent to (fe); with direct server return it was
 * the sending node's, and there is none here to delete.
 */
static __always_inline void lb_forget(__be32 client, __be16 client_port, const struct lb_addr *fe,
				      const struct lb_addr *be, __u8 proto)
{
	struct lb_flow_key in = {
		.saddr = client, .daddr = fe->ip, .sport = client_port, .dport = fe->port,
		.proto = proto, .dir = LB_FLOW_IN,
	};
	struct lb_flow_key out = lb_out_key(be->ip, be->port, client, client_port, proto);

	bpf_map_delete_elem(&onc_lb_flows, &in);
	bpf_map_delete_elem(&onc_lb_flows, &out);
}

/*
 * lb_fast_path sends a translated packet past the stack when it may: to
 * a backend on this node straight into its pod, as the fast path hands an
 * overlay packet (fastpath.c), only when the flow cache says netfilter
 * let the flow through ESTABLISHED both ways in this epoch and, for UDP,
 * conntrack still holds it established (each packet refreshing it: a UDP
 * flow conntrack forgot after two minutes would come back to the stack
 * from the pod's side, taken for the pod's own connection out and
 * masqueraded; a TCP entry lasts five days), or when the fast path opens
 * or opened its TCP connection (conn_setup.h); to one on another node as
 * lb_to_remote_pod says, never a TCP SYN, FIN or RST: the masquerade is
 * conntrack's. The packet that ends a connection the fast path opened
 * (flow_close_step) takes its records along (lb_forget). Returns LB_NEXT when
 * the stack must take it.
 */
static __always_inline int lb_fast_path(struct __sk_buff *skb, const struct lb_pkt *p, const struct lb_addr *be)
{
	struct ct_ends t = { .saddr = p->saddr, .daddr = be->ip, .sport = p->sport, .dport = be->port };
	__u8 ctl = p->tcp_flags & TCP_CTL;
	struct lb_addr fe = { .ip = p->daddr, .port = p->dport };
	struct flow_val *flow = NULL;
	struct ct_ends reply;
	struct flow_key key = {};
	struct onc_config *cfg;
	struct local_pod *pod;
	int setup;

	lb_cache_key(&key, be->ip, be->port, p->saddr, p->sport, p->proto);
	cfg = config();
	pod = bpf_map_lookup_elem(&onc_local, &be->ip);
	if (!pod && ctl)
		return LB_NEXT;
	setup = flow_setup(&key, ctl, p->tcp_flags & TCP_ACK, cfg, 0);
	if (setup == SETUP_SLOW || !cfg || !cfg->enabled || p->ttl <= 1)
		return LB_NEXT;
	if (!pod)
		return lb_to_remote_pod(skb, p, be, &t);
	if (setup == SETUP_OPEN) {
		if (lb_open(skb, &key, p->proto, pod, cfg->epoch))
			return LB_NEXT;
	} else if (!(flow = flow_allowed(&key, cfg->epoch)) ||
		   (p->proto == IPPROTO_UDP && ct_established(skb, &t, p->proto, CT_DIR_ORIGINAL, 0, &reply))) {
		return LB_NEXT;
	}
	if (lb_dec_ttl(skb, p) || bpf_skb_store_bytes(skb, 0, pod->pod_mac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, pod->host_mac, ETH_ALEN, 0)) {
		return lb_drop(skb, &onc_lb_uplink_stats, EV_TABLE_LB_UPLINK_STAT, LB_STAT_UPLINK_ERROR);
	}
	if (p->proto == IPPROTO_TCP && flow_close_step(&key, flow, 0, &p->seg))
		lb_forget(p->saddr, p->sport, &fe, be, p->proto);
	count(&onc_lb_uplink_stats, setup == SETUP_OPEN ? LB_STAT_UPLINK_OPEN : LB_STAT_UPLINK_FAST_TO_POD, 1);
	return bpf_redirect_peer(pod->ifindex, 0);
}

/*
 * lb_learn_reply remembers, from a reply that the slow path let out by
 * the uplink as part of an ESTABLISHED flow (marked onc_mark), by which
 * device replies leave, and for a backend on this node that the flow may
 * leave. A FIN or RST is a flow ending: never learned. The fast path's
 * learning program behind this one clears the mark.
 */
static __always_inline void lb_learn_reply(struct __sk_buff *skb, const struct lb_pkt *p, struct lb_flow *rev)
{
	struct flow_key key = {};
	struct onc_config *cfg;

	if (!(skb->mark & onc_mark) || (p->tcp_flags & (TCP_FIN | TCP_RST)))
		return;
	cfg = config();
	if (!cfg || !cfg->enabled || !cfg->learning)
		return;
	if (rev->ifindex != skb->ifindex)
		rev->ifindex = skb->ifindex;
	if (!bpf_map_lookup_elem(&onc_local, &p->saddr))
		return; /* a remote backend's: conntrack holds its verdict */
	lb_cache_key(&key, p->saddr, p->sport, p->daddr, p->dport, p->proto);
	if (flow_learn(&key, cfg->epoch, 1))
		count(&onc_lb_uplink_stats, LB_STAT_UPLINK_LEARNED, 1);
}

static __always_inline int lb_internal(__be32 addr)
{
	struct lb_internal_key key = { .prefixlen = 32, .ip = addr };

	return bpf_map_lookup_elem(&onc_lb_internal, &key) != NULL;
}

static __always_inline int lb_source_allowed(__u32 svc_id, __be32 client)
{
	struct lb_src_key key = { .prefixlen = 64, .svc_id = svc_id, .ip = client };

	return bpf_map_lookup_elem(&onc_lb_source_ranges, &key) != NULL;
}

/*
 * A new flow's backend: the client's remembered one (ClientIP affinity,
 * keyed by the client's address where the socket scope keys by network
 * namespace; the service ids differ, so the two never meet), else one at
 * random.
 */
static __always_inline int lb_pick(const struct lb_svc *svc, __be32 client, struct lb_addr *be)
{
	struct lb_aff_key akey = { .netns = client, .svc_id = svc->id };
	struct lb_backend_key slot = { .svc_id = svc->id, .bank = svc->bank };
	__u64 now = bpf_ktime_get_ns(), last;
	struct lb6_addr pick = {};

	if ((svc->flags & LB_SVC_AFFINITY) && lb_affine(0, &akey, svc, now, &pick, &last)) {
		count(&onc_lb_uplink_stats, LB_STAT_UPLINK_AFFINITY_HIT, 1);
	} else {
		slot.slot = bpf_get_prandom_u32() % svc->count;
		if (lb_backend(0, &slot, &pick))
			return -1;
	}
	if (svc->flags & LB_SVC_AFFINITY)
		lb_affinity_put(0, &akey, &pick, now);
	*be = lb_to4(&pick);
	return 0;
}

/*
 * The flow's backend: the one it has (an existing flow keeps it, as a
 * conntrack entry does under kube-proxy), else a new pick, recorded both
 * ways (one way for a DSR flow, whose replies never come back here). A
 * TCP flow starts only at a SYN, which picks afresh (a reused 5-tuple
 * meets a backend that is still there), so that a reply to a connection
 * of this node, whose port may equal a frontend's, is never taken for a
 * new flow. A SYN sent again (its sequence number the flow's first
 * SYN's: the SYN-ACK was lost or late) keeps the backend, as conntrack
 * keeps a connection's translation, so that one connection never meets
 * two. loadBalancerSourceRanges judge new flows, as kube-proxy's rules
 * judge new connections. *dsr says whether the flow
 * goes to its backend's node directly: decided at its first packet, so a
 * flow keeps its way while the service's changes.
 */
static __always_inline int lb_flow_backend(const struct lb_pkt *p, const struct lb_svc *svc,
					   struct lb_addr *be, __u8 *dsr)
{
	struct lb_flow_key in = lb_in_key(p), out;
	struct lb_flow fwd = { .svc_id = svc->id, .isn = p->seg.seq };
	struct lb_flow rev = { .ip = p->daddr, .port = p->dport, .svc_id = svc->id };
	struct lb_flow *cur = bpf_map_lookup_elem(&onc_lb_flows, &in);

	if (cur && cur->svc_id == svc->id && (!p->syn || cur->isn == p->seg.seq)) {
		*be = lb_flow_addr(cur);
		*dsr = cur->dsr;
		return LB_FLOW_OK;
	}
	if (p->proto == IPPROTO_TCP && !p->syn)
		return LB_FLOW_FOREIGN;
	if ((svc->flags & LB_SVC_SOURCE_RANGES) && !lb_source_allowed(svc->id, p->saddr))
		return LB_FLOW_OUT_OF_RANGE;
	if (!svc->count)
		return LB_FLOW_EMPTY;
	if (lb_pick(svc, p->saddr, be)) {
		count(&onc_lb_uplink_stats, LB_STAT_UPLINK_NO_SLOT, 1);
		return LB_FLOW_ERROR;
	}
	fwd.ip = be->ip;
	fwd.port = be->port;
	/* Only a pod on another node answers for us; a backend here, or a
	 * host-network or external one, answers through this node. So does
	 * every backend to a node's host (another node dialling this one's
	 * NodePort): the backend's node would deliver the replies to its own
	 * host, or refuse a node as a client. */
	fwd.dsr = (svc->flags & LB_SVC_DSR) && peer_of(be->ip) && !is_host(p->saddr);
	if (!fwd.dsr) {
		out = lb_out_key(be->ip, be->port, p->saddr, p->sport, p->proto);
		/* The reply's entry first: the backend may answer before this
		 * program returns. */
		bpf_map_update_elem(&onc_lb_flows, &out, &rev, BPF_ANY);
	}
	bpf_map_update_elem(&onc_lb_flows, &in, &fwd, BPF_ANY);
	count(&onc_lb_uplink_stats, LB_STAT_UPLINK_NEW_FLOW, 1);
	ev_three(EV_UPLINK, 0, 0, p->proto, &p->saddr, p->sport, &p->daddr, p->dport, &be->ip, be->port, 0, 0);
	lb_count_svc(svc->id, 0);
	*dsr = fwd.dsr;
	return LB_FLOW_OK;
}

#endif /* __ONC_SERVICES_UPLINK_H */
