/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The flow cache's verdicts, shared by every program that sends a flow's
 * packets past the slow path: the fast path's (fastpath.c) and the uplink
 * load balancer's (services.c). A flow may skip routing and netfilter
 * only once netfilter let it through ESTABLISHED both ways in this epoch
 * (onc_filter); the pods a packet may be handed to are onc_local's.
 *
 * The fast path's object owns the maps (pinned by name); the services
 * object is loaded with the same maps (datapath/services), so both judge
 * a flow alike and one eviction reaches both.
 */
#ifndef __ONC_FLOW_CACHE_H
#define __ONC_FLOW_CACHE_H

#include "common.h"
#include "flows.h"

/* A flow seen in both directions. local = the pod on this node; remote = a
 * pod elsewhere, or a client outside the uplink load balancer sent here. */
struct flow_key {
	__be32 local_ip;
	__be32 remote_ip;
	__be16 local_port;
	__be16 remote_port;
	__u8 proto;
	__u8 pad[3];
};

/* The same for IPv6 flows, in maps of their own (onc_filter6): the IPv4
 * maps are pinned, and widening their keys would make an upgrade replace
 * every map of the object, the flows and connections it carries with it. */
struct flow_key6 {
	__u8 local_ip[16];
	__u8 remote_ip[16];
	__be16 local_port;
	__be16 remote_port;
	__u8 proto;
	__u8 pad[3];
};

/* An IPv6 address as a map key. */
struct onc_in6 {
	__u8 addr[16];
};

/*
 * The slow path let this flow through as ESTABLISHED in each direction, or
 * the fast path opened it (opener): its SYN took the fast path because no
 * policy could deny it on this node, so conntrack never saw it, and this is
 * the only record of which end is the client.
 */
struct flow_val {
	__u32 epoch;
	__u8 egress;  /* local -> remote went out (onc.vxlan, or the uplink) */
	__u8 ingress; /* remote -> local came in (onc.vxlan, or the uplink) */
	__u8 opener;  /* FLOW_OPENED_BY_*; 0 when the slow path opened it */
	__u8 closing; /* FLOW_CLOSING_*: what of its close went by, if the fast path opened it */
};

#define FLOW_OPENED_BY_LOCAL 1
#define FLOW_OPENED_BY_REMOTE 2

#define FLOW_CLOSING_LOCAL_FIN 1  /* the local pod sent a FIN */
#define FLOW_CLOSING_REMOTE_FIN 2 /* the remote pod sent one */
/* The remote end sent an RST and the local pod has sent nothing since:
 * reset, or the RST was forged and the pod ignored it (its next packet
 * clears the bit). The local pod's RST that ends a connection forgets it
 * at once (flow_close_step). */
#define FLOW_CLOSING_REMOTE_RST 4

/* What following a connection's close needs of a TCP segment, in host
 * order (parse.h fills it). */
struct tcp_seg {
	__u32 seq;
	__u32 ack;
	__u32 len;  /* payload bytes */
	__u8 flags; /* all of them, ACK included */
};

/* Directions of a connection's packets on this node (flow_close_step). */
#define FLOW_DIR_OUT 0 /* the local pod sent it */
#define FLOW_DIR_IN 1

/* The close of a connection the fast path opened, by direction: the
 * sequence number just past that end's FIN, whether the FIN went by, and
 * whether the other end acknowledged it. */
struct flow_fin {
	__u32 end[2];
	__u8 sent[2];
	__u8 acked[2];
	__u8 pad[2];
};

/* Local pod -> its host-side veth; written by the agent at CNI ADD. */
struct local_pod {
	__u32 ifindex;
	__u8 pod_mac[6];
	__u8 host_mac[6];
};

/* The switches the agent flips while it runs; index 0 of onc_cfg. */
struct onc_config {
	__u32 epoch;      /* filter entries of another epoch are void */
	__u8 enabled;     /* fast path on */
	__u8 learning;    /* 0 while the agent evicts */
	__u8 pad[2];
};

/* The skb->mark bit the slow path sets on ESTABLISHED packets of flows
 * the cache may learn; set by the agent before loading. */
volatile const __u32 onc_mark = 0;

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_filter SEC(".maps");

/* Connections the fast path opened that are closing (flow_close_step):
 * entries live from a connection's first FIN to its end. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_fin);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_fin SEC(".maps");

/* IPv6 flows, as onc_filter: the connections the fast path opens in IPv6
 * are recorded here too (flow6_setup), with their opener. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key6);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_filter6 SEC(".maps");

/* The closes of IPv6 connections the fast path opened, as onc_fin. A map
 * of its own, added beside the pinned ones (an upgrade adopts those and
 * creates this one: see onc_senders6 in fastpath.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key6);
	__type(value, struct flow_fin);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_fin6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __be32);
	__type(value, struct local_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_local SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct onc_in6);
	__type(value, struct local_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_local6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct onc_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_cfg SEC(".maps");

static __always_inline struct onc_config *config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&onc_cfg, &zero);
}

/* ev_conn emits class's event for the flow k, a flow_key6 with fam6 and a
 * flow_key without, as a packet the local pod sent (out) or received. */
static __always_inline void ev_conn(__u32 class, const void *k, int fam6, int out)
{
	const struct flow_key6 *k6 = k;
	const struct flow_key *k4 = k;
	struct flow_ev_budget *b;
	struct flow_event *e;
	struct flow_tuple *t;
	__u64 now;

	b = ev_budget(class, &now);
	if (!b)
		return;
	e = ev_reserve(class);
	if (!e)
		return;
	t = &e->k.t;
	if (fam6) {
		__builtin_memcpy(out ? t->saddr : t->daddr, k6->local_ip, 16);
		__builtin_memcpy(out ? t->daddr : t->saddr, k6->remote_ip, 16);
		t->sport = out ? k6->local_port : k6->remote_port;
		t->dport = out ? k6->remote_port : k6->local_port;
		t->proto = k6->proto;
		t->family = ONC_AF_INET6;
	} else {
		__builtin_memcpy(out ? t->saddr : t->daddr, &k4->local_ip, 4);
		__builtin_memcpy(out ? t->daddr : t->saddr, &k4->remote_ip, 4);
		t->sport = out ? k4->local_port : k4->remote_port;
		t->dport = out ? k4->remote_port : k4->local_port;
		t->proto = k4->proto;
		t->family = ONC_AF_INET;
	}
	ev_submit(e, b);
}

/* A flow may take the fast path when the slow path saw it both ways in
 * this epoch, or the fast path opened it: its entry in filter (onc_filter
 * for k a flow_key, onc_filter6 for a flow_key6), else NULL. */
static __always_inline struct flow_val *filter_allowed(void *filter, const void *k, __u32 epoch)
{
	struct flow_val *v = bpf_map_lookup_elem(filter, k);

	return v && v->egress && v->ingress && v->epoch == epoch ? v : NULL;
}

static __always_inline struct flow_val *flow_allowed(const struct flow_key *k, __u32 epoch)
{
	return filter_allowed(&onc_filter, k, epoch);
}

/*
 * Learn one direction of a flow in filter (as filter_allowed); a flow of
 * an older epoch starts over. Every marked packet of a learned flow comes
 * here: write only what changes, so a busy flow does not keep dirtying a
 * shared cache line. Returns whether anything was written.
 */
static __always_inline int filter_learn(void *filter, const void *k, __u32 epoch, int egress)
{
	struct flow_val *v = bpf_map_lookup_elem(filter, k);
	struct flow_val nv = { .epoch = epoch };

	if (v && v->epoch == epoch) {
		if (egress ? v->egress : v->ingress)
			return 0;
		if (egress)
			v->egress = 1;
		else
			v->ingress = 1;
		if (v->egress && v->ingress)
			ev_conn(EV_LEARN, k, filter == &onc_filter6, 1);
		return 1;
	}
	if (egress)
		nv.egress = 1;
	else
		nv.ingress = 1;
	bpf_map_update_elem(filter, k, &nv, BPF_ANY);
	return 1;
}

static __always_inline int flow_learn(const struct flow_key *k, __u32 epoch, int egress)
{
	return filter_learn(&onc_filter, k, epoch, egress);
}

/*
 * A SYN starts a new connection on a flow's addresses and ports: what the
 * cache holds for them belongs to an old one, and conntrack may treat the
 * new one differently (NAT a clashing source port to another, or DNAT a
 * Service connection whose replies then need the slow path's reverse
 * translation). The new connection learns afresh once established.
 * filter_forget forgets k (a flow_key or flow_key6) in filter and fin,
 * the maps of its family; flow_forget an IPv4 flow.
 */
static __always_inline void filter_forget(void *filter, void *fin, const void *k)
{
	bpf_map_delete_elem(filter, k);
	bpf_map_delete_elem(fin, k);
}

static __always_inline void flow_forget(const struct flow_key *k)
{
	filter_forget(&onc_filter, &onc_fin, k);
}

#endif /* __ONC_FLOW_CACHE_H */
