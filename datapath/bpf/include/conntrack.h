/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The kernel's conntrack, read through its kfuncs (Linux 6.1): the uplink
 * load balancer sends a flow to a backend on another node past the stack
 * with the source address and port conntrack's MASQUERADE gave it, and
 * reverses the backend's replies with conntrack's entry too, so the two
 * paths never disagree.
 *
 * Only the fields read are declared; preserve_access_index relocates them
 * to the running kernel's layout when the object loads (CO-RE).
 */
#ifndef __ONC_CONNTRACK_H
#define __ONC_CONNTRACK_H

#include "common.h"

union nf_inet_addr {
	__be32 ip;
	__be32 ip6[4];
} __attribute__((preserve_access_index));

union nf_conntrack_man_proto {
	__be16 all;
} __attribute__((preserve_access_index));

struct nf_conntrack_man {
	union nf_inet_addr u3;
	union nf_conntrack_man_proto u;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple {
	struct nf_conntrack_man src;
	struct {
		union nf_inet_addr u3;
		union {
			__be16 all;
		} u;
	} dst;
} __attribute__((preserve_access_index));

struct nf_conntrack_tuple_hash {
	struct nf_conntrack_tuple tuple;
} __attribute__((preserve_access_index));

struct ip_ct_tcp {
	__u8 state;
} __attribute__((preserve_access_index));

union nf_conntrack_proto {
	struct ip_ct_tcp tcp;
} __attribute__((preserve_access_index));

struct nf_conn {
	struct nf_conntrack_tuple_hash tuplehash[2]; /* original, reply */
	unsigned long status;
	union nf_conntrack_proto proto;
} __attribute__((preserve_access_index));

/* The kfuncs' options; netns_id -1 is the packet's own namespace. Passed
 * without the zone fields (CT_OPTS_SIZE), which kernels before 6.10 do
 * not know: ONC uses no zones. */
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u16 ct_zone_id;
	__u8 ct_zone_dir;
	__u8 reserved[3];
};

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb_ctx, struct bpf_sock_tuple *bpf_tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *nfct) __ksym;
extern int bpf_ct_change_timeout(struct nf_conn *nfct, __u32 timeout) __ksym;

#define CT_OPTS_SIZE 12

#define CT_DIR_ORIGINAL 0
#define CT_DIR_REPLY 1

/* enum ip_conntrack_status */
#define CT_SEEN_REPLY (1UL << 1)
#define CT_SRC_NAT (1UL << 4)

/* enum tcp_conntrack */
#define CT_TCP_ESTABLISHED 3

/*
 * The timeouts a packet the fast path carries gives its entry back, as the
 * stack would have: the kernel's defaults for an established TCP
 * connection and a UDP stream.
 */
#define CT_TCP_ESTABLISHED_MS (5U * 24 * 3600 * 1000)
#define CT_UDP_STREAM_MS (120U * 1000)

/* The two ends of one direction of a connection, in network order. */
struct ct_ends {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

static __always_inline int ct_ends_equal(const struct ct_ends *a, const struct ct_ends *b)
{
	return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport && a->dport == b->dport;
}

/* The ends of an entry's direction dir, a constant: the verifier checks
 * each field access at a fixed offset. */
#define ct_ends_of(e, ct, dir)                                            \
	do {                                                              \
		(e)->saddr = (ct)->tuplehash[dir].tuple.src.u3.ip;        \
		(e)->sport = (ct)->tuplehash[dir].tuple.src.u.all;        \
		(e)->daddr = (ct)->tuplehash[dir].tuple.dst.u3.ip;        \
		(e)->dport = (ct)->tuplehash[dir].tuple.dst.u.all;        \
	} while (0)

/*
 * ct_established finds the conntrack entry whose direction dir is t
 * (protocol proto) and checks that it is established (TCP: in state
 * ESTABLISHED, so a closing connection's packets go back to the stack;
 * UDP: a reply seen) and, with snat, source-NATed. Then it gives the entry
 * back the timeout the stack would have given it for this packet, which
 * the stack will not see, so that conntrack never forgets (or, NATed,
 * re-maps) a live flow, and returns in *other the entry's other
 * direction. -1: no such entry, the stack must take the packet.
 */
static __always_inline int ct_established(struct __sk_buff *skb, const struct ct_ends *t, __u8 proto, int dir,
					  int snat, struct ct_ends *other)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = { .netns_id = -1, .l4proto = proto };
	unsigned long need = (snat ? CT_SRC_NAT : 0) | CT_SEEN_REPLY;
	struct ct_ends found;
	struct nf_conn *ct;
	int ret = -1;

	tuple.ipv4.saddr = t->saddr;
	tuple.ipv4.daddr = t->daddr;
	tuple.ipv4.sport = t->sport;
	tuple.ipv4.dport = t->dport;
	ct = bpf_skb_ct_lookup(skb, &tuple, sizeof(tuple.ipv4), &opts, CT_OPTS_SIZE);
	if (!ct)
		return -1;
	if (dir == CT_DIR_ORIGINAL)
		ct_ends_of(&found, ct, CT_DIR_ORIGINAL);
	else
		ct_ends_of(&found, ct, CT_DIR_REPLY);
	if ((ct->status & need) == need && ct_ends_equal(&found, t) &&
	    (proto != IPPROTO_TCP || ct->proto.tcp.state == CT_TCP_ESTABLISHED)) {
		if (dir == CT_DIR_ORIGINAL)
			ct_ends_of(other, ct, CT_DIR_REPLY);
		else
			ct_ends_of(other, ct, CT_DIR_ORIGINAL);
		bpf_ct_change_timeout(ct, proto == IPPROTO_TCP ? CT_TCP_ESTABLISHED_MS : CT_UDP_STREAM_MS);
		ret = 0;
	}
	bpf_ct_release(ct);
	return ret;
}

/* The two ends of one direction of an IPv6 connection, in network order. */
struct ct6_ends {
	__be32 saddr[4];
	__be32 daddr[4];
	__be16 sport;
	__be16 dport;
};

static __always_inline int ct6_ends_equal(const struct ct6_ends *a, const struct ct6_ends *b)
{
	return a->saddr[0] == b->saddr[0] && a->saddr[1] == b->saddr[1] && a->saddr[2] == b->saddr[2] &&
	       a->saddr[3] == b->saddr[3] && a->daddr[0] == b->daddr[0] && a->daddr[1] == b->daddr[1] &&
	       a->daddr[2] == b->daddr[2] && a->daddr[3] == b->daddr[3] && a->sport == b->sport &&
	       a->dport == b->dport;
}

/* ct_ends_of for an IPv6 entry. */
#define ct6_ends_of(e, ct, dir)                                                 \
	do {                                                                    \
		(e)->saddr[0] = (ct)->tuplehash[dir].tuple.src.u3.ip6[0];       \
		(e)->saddr[1] = (ct)->tuplehash[dir].tuple.src.u3.ip6[1];       \
		(e)->saddr[2] = (ct)->tuplehash[dir].tuple.src.u3.ip6[2];       \
		(e)->saddr[3] = (ct)->tuplehash[dir].tuple.src.u3.ip6[3];       \
		(e)->sport = (ct)->tuplehash[dir].tuple.src.u.all;              \
		(e)->daddr[0] = (ct)->tuplehash[dir].tuple.dst.u3.ip6[0];       \
		(e)->daddr[1] = (ct)->tuplehash[dir].tuple.dst.u3.ip6[1];       \
		(e)->daddr[2] = (ct)->tuplehash[dir].tuple.dst.u3.ip6[2];       \
		(e)->daddr[3] = (ct)->tuplehash[dir].tuple.dst.u3.ip6[3];       \
		(e)->dport = (ct)->tuplehash[dir].tuple.dst.u.all;              \
	} while (0)

/* ct_established for an IPv6 connection (see it). */
static __always_inline int ct_established6(struct __sk_buff *skb, const struct ct6_ends *t, __u8 proto, int dir,
					   int snat, struct ct6_ends *other)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = { .netns_id = -1, .l4proto = proto };
	unsigned long need = (snat ? CT_SRC_NAT : 0) | CT_SEEN_REPLY;
	struct ct6_ends found;
	struct nf_conn *ct;
	int ret = -1;

	__builtin_memcpy(tuple.ipv6.saddr, t->saddr, sizeof(tuple.ipv6.saddr));
	__builtin_memcpy(tuple.ipv6.daddr, t->daddr, sizeof(tuple.ipv6.daddr));
	tuple.ipv6.sport = t->sport;
	tuple.ipv6.dport = t->dport;
	ct = bpf_skb_ct_lookup(skb, &tuple, sizeof(tuple.ipv6), &opts, CT_OPTS_SIZE);
	if (!ct)
		return -1;
	if (dir == CT_DIR_ORIGINAL)
		ct6_ends_of(&found, ct, CT_DIR_ORIGINAL);
	else
		ct6_ends_of(&found, ct, CT_DIR_REPLY);
	if ((ct->status & need) == need && ct6_ends_equal(&found, t) &&
	    (proto != IPPROTO_TCP || ct->proto.tcp.state == CT_TCP_ESTABLISHED)) {
		if (dir == CT_DIR_ORIGINAL)
			ct6_ends_of(other, ct, CT_DIR_REPLY);
		else
			ct6_ends_of(other, ct, CT_DIR_ORIGINAL);
		bpf_ct_change_timeout(ct, proto == IPPROTO_TCP ? CT_TCP_ESTABLISHED_MS : CT_UDP_STREAM_MS);
		ret = 0;
	}
	bpf_ct_release(ct);
	return ret;
}

#endif /* __ONC_CONNTRACK_H */
