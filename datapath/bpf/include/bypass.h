/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The intra-node bypass: the maps of its sockops and sk_msg programs
 * (bypass.c).
 *
 * A TCP connection whose two ends are pods of this node is recorded, once
 * ESTABLISHED, in a SOCKHASH keyed by its addresses and ports (one map per
 * address family, IPv4 and IPv6). Each send is then queued straight onto
 * the peer socket's receive queue, skipping both TCP/IP stacks. The
 * handshake took the stack (and netfilter, so policy judged it); anything
 * not recorded, and any miss, takes the stack as before.
 *
 * Several agents may share one kernel and one cgroup (the lab, kind), each
 * with its own pinned maps: a program only records sockets of network
 * namespaces its agent registered in onc_bp_pods (onc_bp_pods6).
 */
#ifndef __ONC_BYPASS_H
#define __ONC_BYPASS_H

#include <bpf/bpf_core_read.h>
#include "common.h"
#include "flows.h"

/* One end of a connection as that end sees it; ports in network order.
 * A dual-stack (AF_INET6) socket talking IPv4 has the same key as an
 * AF_INET one: Go servers listening on ":port" are such sockets. */
struct bp_key {
	__be32 local_ip;
	__be32 remote_ip;
	__be16 local_port;
	__be16 remote_port;
};

/* The same for an IPv6 connection, in maps of its own beside IPv4's (a
 * pinned map keeps its layout across upgrades). The addresses are the
 * context's words, in network order. */
struct bp_key6 {
	__be32 local_ip[4];
	__be32 remote_ip[4];
	__be16 local_port;
	__be16 remote_port;
};

/* A pod's IPv6 address, the key of onc_bp_pods6. */
struct bp_in6 {
	__u8 addr[16];
};

/* A recorded socket's metadata, for onctl and revocation. */
enum bp_role {
	BP_ROLE_CLIENT = 1, /* it connected */
	BP_ROLE_SERVER = 2, /* it was accepted */
};

struct bp_conn {
	__u64 since_ns; /* bpf_ktime_get_ns() at ESTABLISHED */
	__u64 cookie;   /* socket cookie: names it to SOCK_DESTROY */
	__u8 role;      /* enum bp_role */
	__u8 pad[7];
};

/*
 * How one socket sends, decided on its first message and kept: redirected
 * bytes overtake stack bytes still queued at the peer, so a direction may
 * go from bypass to stack but never back.
 */
enum bp_dir {
	BP_DIR_UNDECIDED = 0,
	BP_DIR_BYPASS = 1,
	BP_DIR_STACK = 2,
};

struct bp_sock {
	__u8 dir; /* enum bp_dir */
};

enum bp_mode {
	BP_MODE_OFF = 0, /* the zero value: nothing is bypassed until the agent says */
	BP_MODE_ON = 1,
	BP_MODE_SIZE = 2, /* a direction is bypassed if its first message is >= min_size */
};

struct bp_cfg {
	__u8 mode;   /* enum bp_mode */
	__u8 paused; /* no new socket is recorded (policy revocation under way) */
	__u8 pad[2];
	__u32 min_size;
	/* Bypassed bytes a receiver may hold unread before its peer sends by
	 * the stack, where TCP flow control holds the sender back. */
	__u32 max_queued;
};

/* Counters (per CPU); onctl decodes them by these names. */
enum bp_stat {
	BP_STAT_RECORDED,          /* sockets added to the map */
	BP_STAT_RECORD_FAILED,
	BP_STAT_SKIP_REMOTE,       /* peer not a pod of this node */
	BP_STAT_SKIP_OFF,          /* bypass off at ESTABLISHED */
	BP_STAT_SKIP_PAUSED,       /* a policy change was being applied */
	BP_STAT_SKIP_EARLY_DATA,   /* data already went by the stack (TFO) */
	BP_STAT_REDIRECTED_MSGS,
	BP_STAT_REDIRECTED_BYTES,
	BP_STAT_STACK_MSGS,        /* messages of recorded sockets sent by the stack */
	BP_STAT_STACK_BYTES,
	BP_STAT_FALLBACK_MISS,     /* the peer was not in the map at the first send */
	BP_STAT_FALLBACK_SMALL,    /* first message under the size threshold */
	BP_STAT_FALLBACK_OFF,      /* bypass switched off: the direction went to the stack */
	BP_STAT_FALLBACK_STATE,    /* sent after shutdown: the stack gives the error */
	BP_STAT_FALLBACK_PEER_FULL, /* the receiver held max_queued unread bytes */
	BP_STAT_MAX,
};

#define BP_MAX_SOCKETS 65536

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, BP_MAX_SOCKETS);
	__type(key, struct bp_key);
	__type(value, __u64); /* 8 bytes: a lookup from user space returns the socket cookie */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_sock SEC(".maps");

/* Not LRU: revocation finds sockets through it, so an entry must not go
 * while its socket is in onc_bp_sock. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BP_MAX_SOCKETS);
	__type(key, struct bp_key);
	__type(value, struct bp_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_conn SEC(".maps");

/* This node's pods: address -> cookie of the pod's network namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __be32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_pods SEC(".maps");

/* IPv6 connections: onc_bp_sock's, onc_bp_conn's and onc_bp_pods's
 * counterparts, the same sk_msg program on the SOCKHASH. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, BP_MAX_SOCKETS);
	__type(key, struct bp_key6);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_sock6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, BP_MAX_SOCKETS);
	__type(key, struct bp_key6);
	__type(value, struct bp_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_conn6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct bp_in6);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_pods6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct bp_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_dir SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bp_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_bp_cfg SEC(".maps");

ONC_COUNTERS(onc_bp_stats, bp_stat, BP_STAT_MAX);

static __always_inline struct bp_cfg *bp_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&onc_bp_cfg, &zero);
}

/*
 * sock_ops and sk_msg give the remote port in network order in the upper
 * half of a u32 (on little endian) and the local port in host order.
 */
static __always_inline __be16 bp_remote_port(__u32 remote_port)
{
	return (__be16)(remote_port >> 16);
}

static __always_inline __be16 bp_local_port(__u32 local_port)
{
	return bpf_htons((__u16)local_port);
}

static __always_inline int bp_v4mapped(__u32 w0, __u32 w1, __u32 w2)
{
	return w0 == 0 && w1 == 0 && w2 == bpf_htonl(0xffff);
}

/* A context field read where it is written: clang would otherwise merge
 * the IPv4 and IPv6 reads below into one load through a computed context
 * pointer, which the verifier refuses. */
#define bp_ctx_read(field) (*(volatile __u32 *)&(field))

/* The families of bp_key_of. */
#define BP_KEY4 4
#define BP_KEY6 6

/* A key's ports from the context's fields. */
#define bp_set_ports(key, local, remote)                  \
	do {                                              \
		(key)->local_port = bp_local_port(local);    \
		(key)->remote_port = bp_remote_port(remote); \
	} while (0)

/* A socket's addresses and ports as a key: key for IPv4, or IPv4 mapped
 * into a dual-stack socket (BP_KEY4); key6 for IPv6 (BP_KEY6); 0 for
 * anything else. ctx is a bpf_sock_ops or an sk_msg_md, which name these
 * fields alike. */
#define bp_key_of(ctx, key, key6)                                                       \
	({                                                                              \
		__u32 __family = bp_ctx_read((ctx)->family);                            \
		__u32 __l4 = bp_ctx_read((ctx)->local_ip4);                             \
		__u32 __r4 = bp_ctx_read((ctx)->remote_ip4);                            \
		__u32 __l0 = bp_ctx_read((ctx)->local_ip6[0]);                          \
		__u32 __l1 = bp_ctx_read((ctx)->local_ip6[1]);                          \
		__u32 __l2 = bp_ctx_read((ctx)->local_ip6[2]);                          \
		__u32 __l3 = bp_ctx_read((ctx)->local_ip6[3]);                          \
		__u32 __r0 = bp_ctx_read((ctx)->remote_ip6[0]);                         \
		__u32 __r1 = bp_ctx_read((ctx)->remote_ip6[1]);                         \
		__u32 __r2 = bp_ctx_read((ctx)->remote_ip6[2]);                         \
		__u32 __r3 = bp_ctx_read((ctx)->remote_ip6[3]);                         \
		__u32 __lp = bp_ctx_read((ctx)->local_port);                            \
		__u32 __rp = bp_ctx_read((ctx)->remote_port);                           \
		int __lmapped = bp_v4mapped(__l0, __l1, __l2);                          \
		int __rmapped = bp_v4mapped(__r0, __r1, __r2);                          \
		int __kind = 0;                                                         \
		if (__family == ONC_AF_INET) {                                          \
			(key)->local_ip = __l4;                                         \
			(key)->remote_ip = __r4;                                        \
			__kind = BP_KEY4;                                               \
		} else if (__family == ONC_AF_INET6 && __lmapped && __rmapped) {        \
			(key)->local_ip = __l3;                                         \
			(key)->remote_ip = __r3;                                        \
			__kind = BP_KEY4;                                               \
		} else if (__family == ONC_AF_INET6 && !__lmapped && !__rmapped) {      \
			(key6)->local_ip[0] = __l0;                                     \
			(key6)->local_ip[1] = __l1;                                     \
			(key6)->local_ip[2] = __l2;                                     \
			(key6)->local_ip[3] = __l3;                                     \
			(key6)->remote_ip[0] = __r0;                                    \
			(key6)->remote_ip[1] = __r1;                                    \
			(key6)->remote_ip[2] = __r2;                                    \
			(key6)->remote_ip[3] = __r3;                                    \
			__kind = BP_KEY6;                                               \
		}                                                                       \
		bp_set_ports(key, __lp, __rp);                                          \
		bp_set_ports(key6, __lp, __rp);                                         \
		__kind;                                                                 \
	})

/* The key of the other end of the connection key names, of either family. */
#define bp_peer_of(key, peer)                                                                   \
	do {                                                                                    \
		__builtin_memcpy(&(peer)->local_ip, &(key)->remote_ip, sizeof((key)->remote_ip)); \
		__builtin_memcpy(&(peer)->remote_ip, &(key)->local_ip, sizeof((key)->local_ip));  \
		(peer)->local_port = (key)->remote_port;                                        \
		(peer)->remote_port = (key)->local_port;                                        \
	} while (0)

/* Both keys are the two addresses then the two ports: bp_ev finds the
 * ports after the addresses, whatever their length. */
_Static_assert(__builtin_offsetof(struct bp_key, local_port) == 2 * sizeof(__u32), "bp_key: ports after the addresses");
_Static_assert(__builtin_offsetof(struct bp_key6, local_port) == 8 * sizeof(__u32), "bp_key6: ports after the addresses");

/*
 * bp_ev emits class's event of the connection key names, a key of n-word
 * addresses (bp_key: 1, bp_key6: 4), from its local end to its remote one,
 * or the other way (from_remote); reason is a bp_stat, for a fallback.
 */
static __always_inline void bp_ev(__u32 class, const void *key, int n, int from_remote, __u16 reason)
{
	const __u32 *local = key, *remote = local + n;
	const __be16 *ports = (const __be16 *)(remote + n); /* local, remote */

	if (from_remote)
		ev_three(class, 0, n == 4, IPPROTO_TCP, remote, ports[1], local, ports[0], NULL, 0, EV_TABLE_BP_STAT,
			 reason);
	else
		ev_three(class, 0, n == 4, IPPROTO_TCP, local, ports[0], remote, ports[1], NULL, 0, EV_TABLE_BP_STAT,
			 reason);
}

/* Whether two addresses of n 32-bit words are equal. */
static __always_inline int bp_same_addr(const __u32 *a, const __u32 *b, int n)
{
#pragma unroll
	for (int i = 0; i < n; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

#endif /* __ONC_BYPASS_H */
