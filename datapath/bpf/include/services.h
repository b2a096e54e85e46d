/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Services, balanced at the socket: the maps and the translation of the
 * cgroup programs (services.c). A ClusterIP:port is rewritten to a backend pod when
 * a socket connects or sends, and back when it reads a reply or asks for
 * its peer, so Service traffic is pod-to-pod on the wire.
 *
 * Several agents may share one kernel and one cgroup root (the lab, kind),
 * each with its own maps. A program acts only on sockets whose network
 * namespace its agent registered in onc_lb_netns: its node's host and pods.
 */
#ifndef __ONC_SERVICES_H
#define __ONC_SERVICES_H

#include <linux/in.h>
#include "common.h"

#define ONC_ECONNREFUSED 111

/* The cgroup programs' verdicts: 1 lets the call proceed. */
#define SYS_PROCEED 1
#define SYS_REJECT 0

#define LB_MAX_SERVICES 65536
#define LB_MAX_BACKENDS (2 * 262144) /* two banks */

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
 * Not preallocated: a preallocated hash recycles an updated element's
 * memory at once, so a program still reading it could mix two services.
 * Programs copy the value right after the lookup all the same.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, struct lb_backend_key);
	__type(value, struct lb_addr);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_backend SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_BACKENDS / 2);
	__type(key, struct lb_member_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_member SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lb_aff_key);
	__type(value, struct lb_aff);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_aff SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct lb_revnat_key);
	__type(value, struct lb_revnat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_lb_revnat SEC(".maps");

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

/* Is the socket in a network namespace of this node? */
static __always_inline int lb_owned(__u64 netns)
{
	return bpf_map_lookup_elem(&onc_lb_netns, &netns) != NULL;
}

/* TCP and UDP of AF_INET sockets only. A dual-stack (AF_INET6) socket's
 * datagrams to a v4-mapped ClusterIP pass sendmsg4, but their replies pass
 * recvmsg6, which ONC does not attach: such sockets are left to kube-proxy
 * whole. */
static __always_inline int lb_balanced(const struct bpf_sock_addr *ctx)
{
	return ctx->family == ONC_AF_INET &&
	       (ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_UDP);
}

/* The backend an affinity entry names, if it is recent and still serves. */
static __always_inline int lb_affine(const struct lb_aff_key *key, const struct lb_svc *svc,
				     __u64 now, struct lb_aff *out)
{
	struct lb_member_key member = { .svc_id = svc->id };
	struct lb_aff *aff = bpf_map_lookup_elem(&onc_lb_aff, key);

	if (!aff)
		return 0;
	*out = *aff;
	if (now - out->last_ns > (__u64)svc->aff_timeout * 1000000000ULL)
		return 0;
	member.be = out->be;
	return bpf_map_lookup_elem(&onc_lb_member, &member) != NULL;
}

/* Records (or refreshes) what a socket's traffic to a backend was
 * addressed to; written only when it changes, as unconnected UDP comes
 * here for every datagram. */
static __always_inline void lb_remember(const struct lb_revnat_key *key, const struct lb_revnat *val)
{
	struct lb_revnat *old = bpf_map_lookup_elem(&onc_lb_revnat, key);

	if (old && old->vip.ip == val->vip.ip && old->vip.port == val->vip.port &&
	    old->svc_id == val->svc_id)
		return;
	bpf_map_update_elem(&onc_lb_revnat, key, val, BPF_ANY);
}

/*
 * Translates the destination of connect() or sendmsg() when it is a
 * Service: a backend is picked (by affinity, else at random for TCP and by
 * socket for UDP, so one socket's datagrams meet one backend) and the
 * reverse translation recorded for recvmsg() and getpeername(). A Service
 * without backends refuses at once, as kube-proxy's REJECT does.
 */
static __always_inline int lb_translate(struct bpf_sock_addr *ctx,
					enum lb_stat translated, enum lb_stat refused)
{
	struct lb_svc_key key = {
		.vip = ctx->user_ip4,
		.port = (__be16)ctx->user_port,
		.proto = (__u8)ctx->protocol,
		.scope = LB_SCOPE_SOCKET,
	};
	struct lb_backend_key slot = {};
	struct lb_revnat_key rkey = {};
	struct lb_revnat rval = {};
	struct lb_aff_key akey = {};
	struct lb_aff aff = {};
	struct lb_addr *be;
	struct lb_svc *found;
	struct lb_svc svc;
	__u64 sock, now, netns;
	int sticky = 0;

	if (!lb_balanced(ctx))
		return SYS_PROCEED;
	found = bpf_map_lookup_elem(&onc_lb_svc, &key);
	if (!found)
		return SYS_PROCEED;
	netns = bpf_get_netns_cookie(ctx);
	if (!lb_owned(netns))
		return SYS_PROCEED;
	svc = *found;
	if (!svc.count) {
		count(&onc_lb_stats, refused, 1);
		lb_count_svc(svc.id, 1);
		bpf_set_retval(-ONC_ECONNREFUSED);
		return SYS_REJECT;
	}
	sock = bpf_get_socket_cookie(ctx);
	now = bpf_ktime_get_ns();
	if (svc.flags & LB_SVC_AFFINITY) {
		akey.netns = netns;
		akey.svc_id = svc.id;
		sticky = lb_affine(&akey, &svc, now, &aff);
		if (sticky)
			count(&onc_lb_stats, LB_STAT_AFFINITY_HIT, 1);
	}
	if (!sticky) {
		slot.svc_id = svc.id;
		slot.bank = svc.bank;
		slot.slot = (ctx->protocol == IPPROTO_UDP ? (__u32)sock :
			     bpf_get_prandom_u32()) % svc.count;
		be = bpf_map_lookup_elem(&onc_lb_backend, &slot);
		if (!be) {
			count(&onc_lb_stats, LB_STAT_NO_SLOT, 1);
			return SYS_PROCEED;
		}
		aff.be = *be;
	}
	rkey.sock = sock;
	rkey.be = aff.be;
	rkey.proto = key.proto;
	rval.vip.ip = key.vip;
	rval.vip.port = key.port;
	rval.svc_id = svc.id;
	lb_remember(&rkey, &rval);
	/* A new choice, or a remembered one last refreshed over a second ago:
	 * datagrams need not rewrite the entry each. */
	if ((svc.flags & LB_SVC_AFFINITY) && (!sticky || now - aff.last_ns > 1000000000ULL)) {
		aff.last_ns = now;
		bpf_map_update_elem(&onc_lb_aff, &akey, &aff, BPF_ANY);
	}
	ctx->user_ip4 = rkey.be.ip;
	ctx->user_port = rkey.be.port;
	count(&onc_lb_stats, translated, 1);
	lb_count_svc(svc.id, 0);
	return SYS_PROCEED;
}

/*
 * Makes a backend's address read as the Service's it was dialled by. Only
 * sockets this node translated have entries (socket cookies are unique on
 * the kernel), so no ownership check: a pod forgotten meanwhile still gets
 * its replies right.
 */
static __always_inline void lb_reverse(struct bpf_sock_addr *ctx, enum lb_stat reversed)
{
	struct lb_revnat_key key = {
		.be.ip = ctx->user_ip4,
		.be.port = (__be16)ctx->user_port,
		.proto = (__u8)ctx->protocol,
	};
	struct lb_revnat *rev;

	if (!lb_balanced(ctx))
		return;
	key.sock = bpf_get_socket_cookie(ctx);
	rev = bpf_map_lookup_elem(&onc_lb_revnat, &key);
	if (!rev)
		return;
	ctx->user_ip4 = rev->vip.ip;
	ctx->user_port = rev->vip.port;
	count(&onc_lb_stats, reversed, 1);
}

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
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct sock_common *udp_sk; /* a struct udp_sock, which begins with it */
} __attribute__((preserve_access_index));

/* Linux 6.5. Weak: the object still loads on older kernels, where the agent
 * never runs the iterator. */
extern int bpf_sock_destroy(struct sock_common *sk) __ksym __weak;

#endif /* __ONC_SERVICES_H */
