/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Services, balanced at the socket: the maps and the translation of the
 * cgroup programs (services.c). A ClusterIP:port is rewritten to a backend pod when
 * a socket connects or sends, and back when it reads a reply or asks for
 * its peer, so Service traffic is pod-to-pod on the wire.
 *
 * Both families: each has its own maps (onc_lb_* keyed by IPv4 addresses,
 * onc_lb6_* by IPv6 ones; service ids are shared, so onc_lb_svc_stats
 * serves both), and one translation, written once, keys either. A
 * dual-stack (AF_INET6) socket that names an IPv4-mapped address
 * (::ffff:a.b.c.d) reaches the IPv4 Service: the IPv4 maps are looked
 * up, and the backend is written back IPv4-mapped.
 *
 * Several agents may share one kernel and one cgroup root (the lab, kind),
 * each with its own maps. A program acts only on sockets whose network
 * namespace its agent registered in onc_lb_netns: its node's host and pods.
 */
#ifndef __ONC_SERVICES_H
#define __ONC_SERVICES_H

#include <linux/in.h>
#include <linux/in6.h>
#include "common.h"
#include "flows.h"

#define ONC_ECONNREFUSED 111

/* The cgroup programs' verdicts: 1 lets the call proceed. */
#define SYS_PROCEED 1
#define SYS_REJECT 0

#define LB_MAX_SERVICES 65536
#define LB_MAX_BACKENDS (2 * 262144) /* two banks */

#define LB_NSEC_PER_SEC 1000000000ULL

/* Who an entry serves: this node's sockets (translated at connect() and
 * sendmsg()) or packets from outside the cluster (on the uplink). */
enum lb_scope {
	LB_SCOPE_SOCKET,
	LB_SCOPE_UPLINK,
};

struct lb_svc_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 scope; /* enum lb_scope */
};

#define LB_SVC_AFFINITY 1
#define LB_SVC_SOURCE_RANGES 2   /* uplink: only clients in onc_lb_source_ranges */
#define LB_SVC_KEEP_CLIENT 4     /* uplink: no SNAT (externalTrafficPolicy Local) */
#define LB_SVC_DROP_WHEN_EMPTY 8 /* uplink: no backends drops, not refuses */
#define LB_SVC_DSR 16            /* uplink: a backend on another node answers the client itself */

struct lb_svc {
	__u32 id;           /* stable while the service exists; indexes the maps below */
	__u16 count;        /* backends in the active bank; 0: refuse */
	__u8 bank;          /* which of the two backend banks is live */
	__u8 flags;         /* LB_SVC_* */
	__u32 aff_timeout;  /* seconds */
};

/*
 * A service's backends live in two banks. The agent writes the idle bank
 * in full, then flips lb_svc.bank and count in one map update: a socket
 * connecting meanwhile sees the old set or the new, never half of one.
 */
struct lb_backend_key {
	__u32 svc_id;
	__u16 slot;
	__u8 bank;
	__u8 pad;
};

struct lb_addr {
	__be32 ip;
	__be16 port;
	__u8 pad[2];
};

/* Is a backend still in an affinity service's set? */
struct lb_member_key {
	__u32 svc_id;
	struct lb_addr be;
};

/* ClientIP affinity: per client network namespace, as a pod is one client. */
struct lb_aff_key {
	__u64 netns;
	__u32 svc_id;
	__u32 pad;
};

struct lb_aff {
	struct lb_addr be;
	__u64 last_ns; /* bpf_ktime_get_ns() of the last connection */
};

/* What a socket's traffic to a backend was addressed to. */
struct lb_revnat_key {
	__u64 sock;
	struct lb_addr be;
	__u8 proto;
	__u8 pad[7];
};

struct lb_revnat {
	struct lb_addr vip;
	__u32 svc_id;
};

struct lb_svc_stat {
	__u64 translated;
	__u64 refused;
};

/* Counters (per CPU); onctl decodes them by these names. */
enum lb_stat {
	LB_STAT_CONNECT_TRANSLATED,
	LB_STAT_CONNECT_REFUSED,
	LB_STAT_SENDMSG_TRANSLATED,
	LB_STAT_SENDMSG_REFUSED,
	LB_STAT_NO_SLOT,          /* a backend slot was missing: left to kube-proxy */
	LB_STAT_AFFINITY_HIT,
	LB_STAT_RECVMSG_REVERSED,
	LB_STAT_GETPEERNAME_REVERSED,
	LB_STAT_RELEASED,
	LB_STAT_MAX,
};

/* Sockets of these network namespaces are this node's. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __be32); /* the pod's address; 0 for the host */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_netns SEC(".maps");

/*
 * The tables the agent writes (services, backends, affinity members):
 * hashes pinned by name, not preallocated. A preallocated hash recycles
 * an updated element's memory at once, so a program still reading it
 * could mix two services; programs copy the value right after the lookup
 * all the same.
 */
#define LB_TABLE(name, entries, key_type, value_type) \
	struct {                                       \
		__uint(type, BPF_MAP_TYPE_HASH);       \
		__uint(max_entries, entries);          \
		__type(key, key_type);                 \
		__type(value, value_type);             \
		__uint(map_flags, BPF_F_NO_PREALLOC);  \
		__uint(pinning, LIBBPF_PIN_BY_NAME);   \
	} name SEC(".maps")

/* The tables the programs write (affinity, reverse translation): LRU
 * hashes pinned by name. */
#define LB_LRU(name, entries, key_type, value_type) \
	struct {                                     \
		__uint(type, BPF_MAP_TYPE_LRU_HASH); \
		__uint(max_entries, entries);        \
		__type(key, key_type);               \
		__type(value, value_type);           \
		__uint(pinning, LIBBPF_PIN_BY_NAME); \
	} name SEC(".maps")

LB_TABLE(onc_lb_svc, LB_MAX_SERVICES, struct lb_svc_key, struct lb_svc);
LB_TABLE(onc_lb_backend, LB_MAX_BACKENDS, struct lb_backend_key, struct lb_addr);
LB_TABLE(onc_lb_member, LB_MAX_BACKENDS / 2, struct lb_member_key, __u8);
LB_LRU(onc_lb_aff, 65536, struct lb_aff_key, struct lb_aff);
LB_LRU(onc_lb_revnat, 262144, struct lb_revnat_key, struct lb_revnat);

/* Indexed by lb_svc.id; shared by CPUs, so updated atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct lb_svc_stat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_svc_stats SEC(".maps");

ONC_COUNTERS(onc_lb_stats, lb_stat, LB_STAT_MAX);

static __always_inline void lb_count_svc(__u32 id, int refused)
{
	struct lb_svc_stat *s = bpf_map_lookup_elem(&onc_lb_svc_stats, &id);

	if (!s)
		return;
	if (refused)
		__sync_fetch_and_add(&s->refused, 1);
	else
		__sync_fetch_and_add(&s->translated, 1);
}

/*
 * IPv6: the same tables keyed by IPv6 addresses, in maps of their own, so
 * that the IPv4 ones keep their layout and an upgrade adopts them. Both
 * scopes: the uplink's IPv6 maps of its own are services_uplink6.h's.
 */

/* An IPv6 address and port. The translation below holds an address of
 * either family so: an IPv4 one in ip[0], the rest zero. */
struct lb6_addr {
	__be32 ip[4];
	__be16 port;
	__u8 pad[2];
};

struct lb6_svc_key {
	__be32 vip[4];
	__be16 port;
	__u8 proto;
	__u8 scope; /* enum lb_scope */
};

struct lb6_member_key {
	__u32 svc_id;
	struct lb6_addr be;
};

struct lb6_aff {
	struct lb6_addr be;
	__u32 pad;
	__u64 last_ns;
};

struct lb6_revnat_key {
	__u64 sock;
	struct lb6_addr be;
	__u8 proto;
	__u8 pad[3];
};

struct lb6_revnat {
	struct lb6_addr vip;
	__u32 svc_id;
};

/*
 * Counters of the IPv6 hooks (per CPU), named as lb_stat's with a 6; an
 * AF_INET6 socket's release counts here. A dual-stack socket's call to an
 * IPv4-mapped ClusterIP counts with the hook it passed: connect6 and
 * getpeername6 here, sendmsg4 (where the kernel sends such a datagram) in
 * lb_stat.
 */
enum lb6_stat {
	LB_STAT_CONNECT6_TRANSLATED,
	LB_STAT_CONNECT6_REFUSED,
	LB_STAT_SENDMSG6_TRANSLATED,
	LB_STAT_SENDMSG6_REFUSED,
	LB_STAT_NO_SLOT6,
	LB_STAT_AFFINITY_HIT6,
	LB_STAT_RECVMSG6_REVERSED,
	LB_STAT_GETPEERNAME6_REVERSED,
	LB_STAT_RELEASED6,
	LB_STAT6_MAX,
};

LB_TABLE(onc_lb6_svc, LB_MAX_SERVICES, struct lb6_svc_key, struct lb_svc);
LB_TABLE(onc_lb6_backend, LB_MAX_BACKENDS, struct lb_backend_key, struct lb6_addr);
LB_TABLE(onc_lb6_member, LB_MAX_BACKENDS / 2, struct lb6_member_key, __u8);
LB_LRU(onc_lb6_aff, 65536, struct lb_aff_key, struct lb6_aff);
LB_LRU(onc_lb6_revnat, 262144, struct lb6_revnat_key, struct lb6_revnat);

ONC_COUNTERS(onc_lb6_stats, lb6_stat, LB_STAT6_MAX);

/*
 * Ending connected UDP sockets whose backend left their Service
 * (onc_sock_udp_destroy in services.c). A connected UDP socket keeps
 * sending to the backend chosen at connect(); when that backend leaves,
 * the agent lists it here, with the service it left, and runs the
 * iterator in each of its network namespaces.
 */

/* Service id and backend: a backend that left that service. Keyed like
 * onc_lb_member, as a backend may stay in another service. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_BACKENDS / 2);
	__type(key, struct lb_member_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} onc_lb_gone SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_BACKENDS / 2);
	__type(key, struct lb6_member_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} onc_lb6_gone SEC(".maps");

/* Is the socket in a network namespace of this node? */
static __always_inline int lb_owned(__u64 netns)
{
	return bpf_map_lookup_elem(&onc_lb_netns, &netns) != NULL;
}

/*
 * TCP and UDP of AF_INET and AF_INET6 sockets. A dual-stack (AF_INET6)
 * socket passes the IPv4 hooks too: sendmsg4 for its datagrams to an
 * IPv4-mapped address (the kernel sends them as IPv4), connect4 for a UDP
 * connect() to an AF_INET address. Its replies and its peer read back
 * through recvmsg6 and getpeername6, IPv4-mapped.
 */
static __always_inline int lb_balanced(const struct bpf_sock_addr *ctx)
{
	return (ctx->family == ONC_AF_INET || ctx->family == ONC_AF_INET6) &&
	       (ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_UDP);
}

/*
 * The translation is written once for both families. In each helper
 * below fam6 says which family's maps to key: a constant where it is
 * used (the callers branch once, on the address), so the compiler keeps
 * one branch and the verifier sees one map per call.
 */

static __always_inline void lb_from4(struct lb6_addr *to, __be32 ip, __be16 port)
{
	to->ip[0] = ip;
	to->port = port;
}

static __always_inline struct lb_addr lb_to4(const struct lb6_addr *a)
{
	struct lb_addr out = { .ip = a->ip[0], .port = a->port };

	return out;
}

/* Holds an AF_INET6 address that is IPv4-mapped (::ffff:a.b.c.d) as an
 * IPv4 one; returns whether it is IPv6 (keys the IPv6 maps). */
static __always_inline int lb_unmap(struct lb6_addr *a)
{
	if (a->ip[0] || a->ip[1] || a->ip[2] != bpf_htonl(0xffff))
		return 1;
	a->ip[0] = a->ip[3];
	a->ip[2] = 0;
	a->ip[3] = 0;
	return 0;
}

/* No address: an unconnected socket's peer. */
static __always_inline int lb_unset(const struct lb6_addr *a)
{
	return !(a->ip[0] | a->ip[1] | a->ip[2] | a->ip[3]);
}

/* The socket-scope entry of a frontend. */
static __always_inline struct lb_svc *lb_service(int fam6, const struct lb6_addr *vip, __u8 proto)
{
	struct lb_svc_key k4 = { .vip = vip->ip[0], .port = vip->port, .proto = proto, .scope = LB_SCOPE_SOCKET };
	struct lb6_svc_key k6 = { .port = vip->port, .proto = proto, .scope = LB_SCOPE_SOCKET };

	if (!fam6)
		return bpf_map_lookup_elem(&onc_lb_svc, &k4);
	__builtin_memcpy(k6.vip, vip->ip, sizeof(k6.vip));
	return bpf_map_lookup_elem(&onc_lb6_svc, &k6);
}

/* The backend in a slot; -1 if the slot is missing. */
static __always_inline int lb_backend(int fam6, const struct lb_backend_key *slot, struct lb6_addr *be)
{
	void *found = bpf_map_lookup_elem(fam6 ? (void *)&onc_lb6_backend : (void *)&onc_lb_backend, slot);
	const struct lb_addr *b4 = found;

	if (!found)
		return -1;
	if (fam6)
		*be = *(const struct lb6_addr *)found;
	else
		lb_from4(be, b4->ip, b4->port);
	return 0;
}

/* Is (svc_id, be) listed in m4 or m6, maps keyed like onc_lb_member and
 * onc_lb6_member? */
static __always_inline int lb_listed(int fam6, void *m4, void *m6, __u32 svc_id, const struct lb6_addr *be)
{
	struct lb_member_key k4 = { .svc_id = svc_id, .be = lb_to4(be) };
	struct lb6_member_key k6 = { .svc_id = svc_id, .be = *be };

	return bpf_map_lookup_elem(fam6 ? m6 : m4, fam6 ? (void *)&k6 : (void *)&k4) != NULL;
}

/* The backend an affinity entry names, if it is recent and still serves;
 * *last is when the client last connected through it. */
static __always_inline int lb_affine(int fam6, const struct lb_aff_key *key, const struct lb_svc *svc,
				     __u64 now, struct lb6_addr *be, __u64 *last)
{
	void *found = bpf_map_lookup_elem(fam6 ? (void *)&onc_lb6_aff : (void *)&onc_lb_aff, key);
	const struct lb6_aff *a6 = found;
	const struct lb_aff *a4 = found;

	if (!found)
		return 0;
	if (fam6) {
		*be = a6->be;
		*last = a6->last_ns;
	} else {
		lb_from4(be, a4->be.ip, a4->be.port);
		*last = a4->last_ns;
	}
	if (now - *last > (__u64)svc->aff_timeout * LB_NSEC_PER_SEC)
		return 0;
	return lb_listed(fam6, &onc_lb_member, &onc_lb6_member, svc->id, be);
}

static __always_inline void lb_affinity_put(int fam6, const struct lb_aff_key *key, const struct lb6_addr *be,
					    __u64 now)
{
	struct lb_aff a4 = { .be = lb_to4(be), .last_ns = now };
	struct lb6_aff a6 = { .be = *be, .last_ns = now };

	bpf_map_update_elem(fam6 ? (void *)&onc_lb6_aff : (void *)&onc_lb_aff, key,
			    fam6 ? (void *)&a6 : (void *)&a4, BPF_ANY);
}

/* A socket's reverse entry for a backend, as either family's map keys it. */
union lb_revnat_any_key {
	struct lb_revnat_key v4;
	struct lb6_revnat_key v6;
};

union lb_revnat_any {
	struct lb_revnat v4;
	struct lb6_revnat v6;
};

/* Fills k, zeroed, and returns the map it keys. */
static __always_inline void *lb_revnat_key(int fam6, __u64 sock, const struct lb6_addr *be, __u8 proto,
					   union lb_revnat_any_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	if (fam6) {
		k->v6.sock = sock;
		k->v6.be = *be;
		k->v6.proto = proto;
		return &onc_lb6_revnat;
	}
	k->v4.sock = sock;
	k->v4.be = lb_to4(be);
	k->v4.proto = proto;
	return &onc_lb_revnat;
}

/* What a socket's traffic to a backend was addressed to, and for which
 * service; 0 if the socket has no entry for it. */
static __always_inline int lb_recall(int fam6, __u64 sock, const struct lb6_addr *be, __u8 proto,
				     struct lb6_addr *vip, __u32 *svc_id)
{
	union lb_revnat_any_key k;
	const union lb_revnat_any *rev = bpf_map_lookup_elem(lb_revnat_key(fam6, sock, be, proto, &k), &k);

	if (!rev)
		return 0;
	if (fam6) {
		*vip = rev->v6.vip;
		*svc_id = rev->v6.svc_id;
	} else {
		lb_from4(vip, rev->v4.vip.ip, rev->v4.vip.port);
		*svc_id = rev->v4.svc_id;
	}
	return 1;
}

/* Records (or refreshes) what a socket's traffic to a backend was
 * addressed to; written only when it changes, as unconnected UDP comes
 * here for every datagram: whether it wrote. */
static __always_inline int lb_remember(int fam6, __u64 sock, const struct lb6_addr *be, __u8 proto,
					const struct lb6_addr *vip, __u32 svc_id)
{
	union lb_revnat_any_key k;
	void *m = lb_revnat_key(fam6, sock, be, proto, &k);
	const union lb_revnat_any *old = bpf_map_lookup_elem(m, &k);
	union lb_revnat_any val;

	__builtin_memset(&val, 0, sizeof(val));
	if (fam6) {
		val.v6.vip = *vip;
		val.v6.svc_id = svc_id;
		if (old && old->v6.svc_id == svc_id && old->v6.vip.port == vip->port &&
		    !((old->v6.vip.ip[0] ^ vip->ip[0]) | (old->v6.vip.ip[1] ^ vip->ip[1]) |
		      (old->v6.vip.ip[2] ^ vip->ip[2]) | (old->v6.vip.ip[3] ^ vip->ip[3])))
			return 0;
	} else {
		val.v4.vip = lb_to4(vip);
		val.v4.svc_id = svc_id;
		if (old && old->v4.svc_id == svc_id && old->v4.vip.ip == vip->ip[0] && old->v4.vip.port == vip->port)
			return 0;
	}
	bpf_map_update_elem(m, &k, &val, BPF_ANY);
	return 1;
}

/* Deletes a socket's reverse entry for a backend; 1 if there was one. */
static __always_inline int lb_revnat_delete(int fam6, __u64 sock, const struct lb6_addr *be, __u8 proto)
{
	union lb_revnat_any_key k;

	return bpf_map_delete_elem(lb_revnat_key(fam6, sock, be, proto, &k), &k) == 0;
}

/* hook6: the call passed an IPv6 hook (or is an AF_INET6 socket's
 * release), whose counters are onc_lb6_stats. */
static __always_inline void lb_count(int hook6, __u32 stat)
{
	count(hook6 ? (void *)&onc_lb6_stats : (void *)&onc_lb_stats, stat, 1);
}

/* The address a socket call names, from an IPv4 or IPv6 hook; returns
 * whether it keys the IPv6 maps. */
static __always_inline int lb_call_addr(const struct bpf_sock_addr *ctx, int hook6, struct lb6_addr *a)
{
	a->port = (__be16)ctx->user_port;
	if (!hook6) {
		a->ip[0] = ctx->user_ip4;
		return 0;
	}
	a->ip[0] = ctx->user_ip6[0];
	a->ip[1] = ctx->user_ip6[1];
	a->ip[2] = ctx->user_ip6[2];
	a->ip[3] = ctx->user_ip6[3];
	return lb_unmap(a);
}

/* Makes the call name a instead; an IPv4 one to an IPv6 hook's socket
 * IPv4-mapped. */
static __always_inline void lb_set_call_addr(struct bpf_sock_addr *ctx, int hook6, int fam6,
					     const struct lb6_addr *a)
{
	ctx->user_port = a->port;
	if (!hook6) {
		ctx->user_ip4 = a->ip[0];
		return;
	}
	ctx->user_ip6[0] = fam6 ? a->ip[0] : 0;
	ctx->user_ip6[1] = fam6 ? a->ip[1] : 0;
	ctx->user_ip6[2] = fam6 ? a->ip[2] : bpf_htonl(0xffff);
	ctx->user_ip6[3] = fam6 ? a->ip[3] : a->ip[0];
}

/*
 * Translates the destination of connect() or sendmsg() when it is a
 * Service: a backend is picked (by affinity, else at random for TCP and by
 * socket for UDP, so one socket's datagrams meet one backend) and the
 * reverse translation recorded for recvmsg() and getpeername(). A Service
 * without backends refuses at once, as kube-proxy's REJECT does.
 */
static __always_inline int lb_translate_to(struct bpf_sock_addr *ctx, int hook6, int fam6,
					   const struct lb6_addr *vip, __u32 translated, __u32 refused)
{
	struct lb_backend_key slot = {};
	struct lb_aff_key akey = {};
	struct lb6_addr be = {};
	__u8 proto = (__u8)ctx->protocol;
	__u64 sock, now, netns, last = 0;
	struct lb_svc *found;
	struct lb_svc svc;
	int sticky = 0;

	found = lb_service(fam6, vip, proto);
	if (!found)
		return SYS_PROCEED;
	netns = bpf_get_netns_cookie(ctx);
	if (!lb_owned(netns))
		return SYS_PROCEED;
	svc = *found;
	if (!svc.count) {
		lb_count(hook6, refused);
		lb_count_svc(svc.id, 1);
		ev_three(EV_REFUSE, netns, fam6, proto, NULL, 0, vip->ip, vip->port, NULL, 0,
			 hook6 ? EV_TABLE_LB6_STAT : EV_TABLE_LB_STAT, refused);
		bpf_set_retval(-ONC_ECONNREFUSED);
		return SYS_REJECT;
	}
	sock = bpf_get_socket_cookie(ctx);
	now = bpf_ktime_get_ns();
	if (svc.flags & LB_SVC_AFFINITY) {
		akey.netns = netns;
		akey.svc_id = svc.id;
		sticky = lb_affine(fam6, &akey, &svc, now, &be, &last);
		if (sticky)
			lb_count(hook6, hook6 ? LB_STAT_AFFINITY_HIT6 : LB_STAT_AFFINITY_HIT);
	}
	if (!sticky) {
		slot.svc_id = svc.id;
		slot.bank = svc.bank;
		slot.slot = (proto == IPPROTO_UDP ? (__u32)sock : bpf_get_prandom_u32()) % svc.count;
		if (lb_backend(fam6, &slot, &be)) {
			lb_count(hook6, hook6 ? LB_STAT_NO_SLOT6 : LB_STAT_NO_SLOT);
			return SYS_PROCEED;
		}
	}
	/* A connection's, or an unconnected UDP socket's first datagram to
	 * this backend: one event, not one per datagram. */
	if (lb_remember(fam6, sock, &be, proto, vip, svc.id))
		ev_three(EV_TRANSLATE, netns, fam6, proto, NULL, 0, vip->ip, vip->port, be.ip, be.port, 0, 0);
	/* A new choice, or a remembered one last refreshed over a second ago:
	 * datagrams need not rewrite the entry each. */
	if ((svc.flags & LB_SVC_AFFINITY) && (!sticky || now - last > LB_NSEC_PER_SEC))
		lb_affinity_put(fam6, &akey, &be, now);
	lb_set_call_addr(ctx, hook6, fam6, &be);
	lb_count(hook6, translated);
	lb_count_svc(svc.id, 0);
	return SYS_PROCEED;
}

/* connect() or sendmsg() through an IPv4 hook or, with hook6, an IPv6 one. */
static __always_inline int lb_translate(struct bpf_sock_addr *ctx, int hook6, __u32 translated, __u32 refused)
{
	struct lb6_addr vip = {};

	if (!lb_balanced(ctx))
		return SYS_PROCEED;
	if (lb_call_addr(ctx, hook6, &vip))
		return lb_translate_to(ctx, hook6, 1, &vip, translated, refused);
	return lb_translate_to(ctx, hook6, 0, &vip, translated, refused);
}

/*
 * Makes a backend's address read as the Service's it was dialled by. Only
 * sockets this node translated have entries (socket cookies are unique on
 * the kernel), so no ownership check: a pod forgotten meanwhile still gets
 * its replies right.
 */
static __always_inline void lb_reverse_from(struct bpf_sock_addr *ctx, int hook6, int fam6,
					    const struct lb6_addr *be, __u32 reversed)
{
	struct lb6_addr vip = {};
	__u32 svc_id;

	if (!lb_recall(fam6, bpf_get_socket_cookie(ctx), be, (__u8)ctx->protocol, &vip, &svc_id))
		return;
	lb_set_call_addr(ctx, hook6, fam6, &vip);
	lb_count(hook6, reversed);
}

static __always_inline void lb_reverse(struct bpf_sock_addr *ctx, int hook6, __u32 reversed)
{
	struct lb6_addr be = {};

	if (!lb_balanced(ctx))
		return;
	if (lb_call_addr(ctx, hook6, &be))
		lb_reverse_from(ctx, hook6, 1, &be, reversed);
	else
		lb_reverse_from(ctx, hook6, 0, &be, reversed);
}

/* Counters of their own, so that onc_lb_stats keeps its size and an
 * upgrade adopts the pinned maps. */
enum lb_destroy_stat {
	LB_DESTROY_STAT_UDP_DESTROYED,
	LB_DESTROY_STAT_UDP_DESTROY_FAILED, /* bpf_sock_destroy refused: should stay 0 */
	LB_DESTROY_STAT_MAX,
};

ONC_COUNTERS(onc_lb_destroy_stats, lb_destroy_stat, LB_DESTROY_STAT_MAX);

/* The kernel's types, read through BTF (CO-RE): only the fields used. */
struct sock_common {
	unsigned short skc_family;
	__be32 skc_daddr;
	__be16 skc_dport;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct sock_common *udp_sk; /* a struct udp_sock, which begins with it */
} __attribute__((preserve_access_index));

/* Linux 6.5. Weak: the object still loads on older kernels, where the agent
 * never runs the iterator. */
extern int bpf_sock_destroy(struct sock_common *sk) __ksym __weak;

#endif /* __ONC_SERVICES_H */
