/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow events: what the programs tell the agent about single flows, as
 * records (agent/flows, docs/observability.md). Only drop sites and
 * once-per-connection sites emit; a fast-path hit never reaches this file.
 *
 * An event first asks its class's per-CPU budget (a token bucket:
 * onc_ev_interval_ns apart on average, onc_ev_burst at once); only then
 * does it read headers, pass the drops' per-flow dedupe (one per flow and
 * reason a second) and reserve its record in onc_events, a ring buffer the
 * agent reads, where it is filled in place and submitted. An event the
 * budget holds back is counted in the next one emitted (suppressed).
 * onc_ev_stats counts what became of them all.
 *
 * That order is the cheapest under a flood that still keeps the dedupe's
 * meaning. Many flows (a spoofer varying its ports) spend the budget, and
 * every drop after costs a per-CPU lookup and a counter: no clock beyond
 * it, no header read, no shared LRU. One flow again and again finds its
 * entry with a lookup (no write, no ring) and spends nothing, so it
 * leaves the budget to the others; a drop is remembered only when its
 * event is sent, so the LRU is written at the budget's rate at most.
 * Under a flood past the budget, the suppressed count is of drops not
 * looked at, repeats of a flow included.
 *
 * The fast path's object owns these maps (pinned by name); the services
 * and bypass objects share them as the services object shares the flow
 * cache (bpf.FlowCache), so one ring carries every object's events. An
 * upgrade from a version without them adopts the other pins and creates
 * these beside them.
 */
#ifndef __ONC_FLOWS_H
#define __ONC_FLOWS_H

#include <linux/in.h>
#include "common.h"

/* Event classes: each has a budget of its own. */
enum onc_ev_class {
	EV_DROP,      /* a packet dropped, or a socket call refused, by reason */
	EV_OPEN,      /* a connection opened on the fast path */
	EV_LEARN,     /* a flow became usable on the fast path (both ways learned) */
	EV_TRANSLATE, /* the socket LB gave a connection a backend */
	EV_UPLINK,    /* the uplink LB gave a client outside a backend */
	EV_REFUSE,    /* the socket LB refused a call: the Service has no backend */
	EV_PAIR,      /* the bypass paired a connection's two sockets */
	EV_FALLBACK,  /* a bypassed direction went to the stack for good, by reason */
	EV_CLASS_MAX,
};

/* The counters enum an event's reason is a value of, so a record's reason
 * and its counter have one name: EV_TABLE_<enum name in capitals>. */
enum onc_ev_table {
	EV_TABLE_ONC_STAT,
	EV_TABLE_LB_STAT,
	EV_TABLE_LB6_STAT,
	EV_TABLE_LB_UPLINK_STAT,
	EV_TABLE_LB6_UPLINK_STAT,
	EV_TABLE_LB_DSR_STAT,
	EV_TABLE_LB6_DSR_STAT,
	EV_TABLE_BP_STAT,
};

/* A flow as an event names it: IPv4 addresses in the first 4 bytes of
 * their 16. A socket call's event has only a destination. */
struct flow_tuple {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u16 reason; /* a value of the table's enum; 0 for a class that has none */
	__u8 family;  /* ONC_AF_INET or ONC_AF_INET6 */
	__u8 proto;
	__u8 table;   /* enum onc_ev_table */
	__u8 pad[3];
};

/* Who an event is about: the drops' dedupe key. */
struct flow_ev_key {
	struct flow_tuple t;
	__u32 ifindex; /* the interface the packet came in by (tc), else 0 */
	__u64 cookie;  /* the network namespace of the socket (socket LB), else 0 */
};

/* One event, as the agent decodes it (datapath/flows/events.go). x is
 * the third end: the backend (translate, uplink) or the outer source of a
 * frame (overlay drops). */
struct flow_event {
	struct flow_ev_key k;
	__u8 xaddr[16];
	__be16 xport;
	__u8 xfamily;     /* 0: no third end */
	__u8 class;       /* enum onc_ev_class */
	__u32 suppressed; /* events of this class the budget held back on this CPU since the last one emitted */
	__u64 ts_ns;      /* bpf_ktime_get_ns */
};

/*
 * A class's state on one CPU: its budget and, for the tc programs' drops,
 * the dedupe key being built. The budget is unlocked: a socket call
 * preempted between reading and writing it (cgroup programs run
 * preemptible) can at worst let one more event through or misplace a
 * suppressed count; no event is shared, each is its own ring record.
 *
 * The key is here, not on the stack, because the tc programs have none to
 * spare (the IPv6 uplink's deepest calls use the verifier's 512 bytes to
 * the last). It is safe there: tc programs run with bottom halves off, so no
 * other runs on this CPU until the one filling it is done with it (nothing
 * in between sends a packet), and only they use EV_DROP's. The socket
 * calls, preemptible, build their refusals' keys on the stack.
 */
struct flow_ev_budget {
	__u64 tat; /* the budget's theoretical arrival time (GCRA), in ktime ns */
	__u32 suppressed;
	__u32 pad;
	struct flow_ev_key k; /* EV_DROP's, by ev_drop */
	__u64 now;            /* EV_DROP's: the time of k's drop */
	/* No room: only so these reach BTF, where the agent reads the
	 * tables' names (bpf.LoadEventNames) and its tests the event's
	 * layout. */
	enum onc_ev_table tables[0];
	struct flow_event events[0];
};

/* What became of the events, per CPU; the agent reads them by name. */
enum flows_stat {
	FLOWS_STAT_EMITTED,
	FLOWS_STAT_SUPPRESSED, /* held back by the budget: counted in the next event */
	FLOWS_STAT_DEDUPED,    /* a drop of a flow and reason that sent one within the second */
	FLOWS_STAT_LOST,       /* the ring was full: the agent reads too slowly */
	FLOWS_STAT_MAX,
};

/* Set by the agent before loading: the budget's mean spacing (0: no
 * events at all, and the verifier prunes every emit) and burst. */
volatile const __u64 onc_ev_interval_ns = 0;
volatile const __u32 onc_ev_burst = 0;

#define EV_DEDUPE_NS 1000000000ULL
/* Above this much unread, an event wakes the reader; below, the reader's
 * poll deadline (100 ms) finds it: few wakeups under load. */
#define EV_WAKEUP_BYTES (64 * 1024)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EV_CLASS_MAX);
	__type(key, enum onc_ev_class);
	__type(value, struct flow_ev_budget);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_ev_budget SEC(".maps");

/*
 * The drops' dedupe: flow, reason, interface or netns -> when its last
 * event went. Written only for an event emitted, so at most at the
 * budget's rate per CPU: the common LRU's lock is rarely taken. Per-CPU
 * LRU lists (BPF_F_NO_COMMON_LRU) would split the entries between the
 * CPUs, 128 each on a 128-CPU node, fewer than one second of one CPU's
 * budget: the dedupe would forget flows within its second.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_ev_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_ev_seen SEC(".maps");

ONC_COUNTERS(onc_ev_stats, flows_stat, FLOWS_STAT_MAX);

/* ev_state is class's state on this CPU; NULL when events are off. */
static __always_inline struct flow_ev_budget *ev_state(__u32 class)
{
	if (!onc_ev_interval_ns)
		return NULL;
	return bpf_map_lookup_elem(&onc_ev_budget, &class);
}

/* ev_room says whether b has room for an event at now; if not, the event
 * is counted as suppressed. A generic cell rate algorithm, which keeps one
 * timestamp and needs no division: each event takes one interval, and a
 * burst fits within burst - 1 of them ahead of now. */
static __always_inline int ev_room(struct flow_ev_budget *b, __u64 now)
{
	if (b->tat > now && b->tat - now > (onc_ev_burst - 1) * onc_ev_interval_ns) {
		b->suppressed++;
		count(&onc_ev_stats, FLOWS_STAT_SUPPRESSED, 1);
		return 0;
	}
	return 1;
}

/* ev_budget is class's budget on this CPU if it has room for one more
 * event now (the clock read into *now), else NULL, the event counted as
 * suppressed. It spends nothing: ev_submit does, so that a drop the dedupe
 * stops costs none of it. */
static __always_inline struct flow_ev_budget *ev_budget(__u32 class, __u64 *now)
{
	struct flow_ev_budget *b = ev_state(class);

	if (!b)
		return NULL;
	*now = bpf_ktime_get_ns();
	return ev_room(b, *now) ? b : NULL;
}

/* ev_reserve is a zeroed event of class, reserved in the ring, or NULL
 * when the ring is full (lost; the budget is not spent). It reads the
 * clock again rather than keep the budget's reading: the uplink has no
 * stack to spare across the call. */
static __always_inline struct flow_event *ev_reserve(__u32 class)
{
	struct flow_event *e = bpf_ringbuf_reserve(&onc_events, sizeof(*e), 0);

	if (!e) {
		count(&onc_ev_stats, FLOWS_STAT_LOST, 1);
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->class = class;
	e->ts_ns = bpf_ktime_get_ns();
	return e;
}

/* ev_submit spends one of b's tokens on e, filled, and hands it to the
 * reader with the count of those b held back before it. */
static __always_inline void ev_submit(struct flow_event *e, struct flow_ev_budget *b)
{
	__u64 now = e->ts_ns, flags = BPF_RB_NO_WAKEUP;

	b->tat = (b->tat > now ? b->tat : now) + onc_ev_interval_ns;
	e->suppressed = b->suppressed;
	b->suppressed = 0;
	if (bpf_ringbuf_query(&onc_events, BPF_RB_AVAIL_DATA) > EV_WAKEUP_BYTES)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(e, flags);
	count(&onc_ev_stats, FLOWS_STAT_EMITTED, 1);
}

/*
 * ev_reserve_drop reserves, as ev_reserve, the event of the drop k names
 * (class: EV_DROP or EV_REFUSE), unless the same flow and reason sent one
 * within the second: deduped, with the budget unspent and no record
 * reserved. An event reserved is remembered. k and now are on the stack
 * or in EV_DROP's budget: a kernel before 6.0 takes no map key from the
 * ring.
 */
static __always_inline struct flow_event *ev_reserve_drop(__u32 class, const struct flow_ev_key *k, const __u64 *now)
{
	__u64 *last = bpf_map_lookup_elem(&onc_ev_seen, k);
	struct flow_event *e;

	if (last && *now - *last < EV_DEDUPE_NS) {
		count(&onc_ev_stats, FLOWS_STAT_DEDUPED, 1);
		return NULL;
	}
	e = ev_reserve(class);
	if (!e)
		return NULL;
	__builtin_memcpy(&e->k, k, sizeof(*k));
	if (last)
		*last = *now;
	else
		bpf_map_update_elem(&onc_ev_seen, k, now, BPF_ANY);
	return e;
}

/* ev_load_ip fills t's addresses, protocol and ports from the IP header at
 * off in skb, IPv4 or IPv6; what cannot be read stays zero. */
static __always_inline void ev_load_ip(struct __sk_buff *skb, __u32 off, struct flow_tuple *t)
{
	__u8 b;
	__u32 l4;

	if (bpf_skb_load_bytes(skb, off, &b, 1))
		return;
	if (b >> 4 == 4) {
		if (bpf_skb_load_bytes(skb, off + 12, t->saddr, 4) || bpf_skb_load_bytes(skb, off + 16, t->daddr, 4) ||
		    bpf_skb_load_bytes(skb, off + 9, &t->proto, 1))
			return;
		t->family = ONC_AF_INET;
		l4 = off + (b & 0xf) * 4;
	} else if (b >> 4 == 6) {
		if (bpf_skb_load_bytes(skb, off + 8, t->saddr, 32) || bpf_skb_load_bytes(skb, off + 6, &t->proto, 1))
			return;
		t->family = ONC_AF_INET6;
		l4 = off + 40;
	} else {
		return;
	}
	if (t->proto == IPPROTO_TCP || t->proto == IPPROTO_UDP || t->proto == IPPROTO_SCTP)
		bpf_skb_load_bytes(skb, l4, &t->sport, 4); /* sport, dport */
}

/*
 * ev_drop emits a drop of skb's packet, whose IP header is at off, for
 * reason (a value of table's enum); outer, if not 0, is the offset of the
 * IP header of the frame that carried it (overlay drops), whose source is
 * the event's third end.
 */
static __always_inline void ev_drop(struct __sk_buff *skb, __u32 off, __u32 outer, __u8 table, __u16 reason)
{
	struct flow_ev_budget *b = ev_state(EV_DROP);
	struct flow_event *e;
	__u8 v;

	if (!b)
		return;
	/* The clock goes to the state: the uplink has no stack to spare. */
	b->now = bpf_ktime_get_ns();
	if (!ev_room(b, b->now))
		return;
	__builtin_memset(&b->k, 0, sizeof(b->k));
	b->k.ifindex = skb->ifindex;
	b->k.t.table = table;
	b->k.t.reason = reason;
	ev_load_ip(skb, off, &b->k.t);
	e = ev_reserve_drop(EV_DROP, &b->k, &b->now);
	if (!e)
		return;
	if (outer && !bpf_skb_load_bytes(skb, outer, &v, 1)) {
		if (v >> 4 == 4 && !bpf_skb_load_bytes(skb, outer + 12, e->xaddr, 4))
			e->xfamily = ONC_AF_INET;
		else if (v >> 4 == 6 && !bpf_skb_load_bytes(skb, outer + 8, e->xaddr, 16))
			e->xfamily = ONC_AF_INET6;
	}
	ev_submit(e, b);
}

/* ev_addr copies an address of fam6's family into an event's slot, a
 * 32-bit word at a time (both are so aligned): byte by byte, the copies
 * would take the uplink's registers and then its stack. */
static __always_inline void ev_addr(__u8 *slot, const void *a, int fam6)
{
	const __u32 *from = a;
	__u32 *to = (__u32 *)slot;

	to[0] = from[0];
	if (fam6) {
		to[1] = from[1];
		to[2] = from[2];
		to[3] = from[3];
	}
}

/* ev_ends fills k's flow: from saddr:sport (NULL: none) to daddr:dport,
 * of proto, addresses of fam6's family, and the caller's netns. */
static __always_inline void ev_ends(struct flow_ev_key *k, __u64 netns, int fam6, __u8 proto, const void *saddr,
				    __be16 sport, const void *daddr, __be16 dport)
{
	struct flow_tuple *t = &k->t;

	k->cookie = netns;
	t->family = fam6 ? ONC_AF_INET6 : ONC_AF_INET;
	t->proto = proto;
	if (saddr)
		ev_addr(t->saddr, saddr, fam6);
	t->sport = sport;
	ev_addr(t->daddr, daddr, fam6);
	t->dport = dport;
}

/*
 * ev_three emits class's event of a flow from saddr:sport to daddr:dport
 * (proto; a socket call's has no source) with a third end, x:xport (NULL:
 * none), all of fam6's family; reason is a value of table, for a class
 * that has one (a fallback's, a refusal's). A refusal (EV_REFUSE) is a
 * drop: it passes the dedupe. class is a constant at every call: the
 * compiler keeps one of the two ways.
 */
static __always_inline void ev_three(__u32 class, __u64 netns, int fam6, __u8 proto, const void *saddr,
				     __be16 sport, const void *daddr, __be16 dport, const void *x, __be16 xport,
				     __u8 table, __u16 reason)
{
	struct flow_ev_budget *b;
	struct flow_event *e;
	__u64 now;

	b = ev_budget(class, &now);
	if (!b)
		return;
	if (class == EV_REFUSE) {
		struct flow_ev_key k = {};

		ev_ends(&k, netns, fam6, proto, saddr, sport, daddr, dport);
		k.t.table = table;
		k.t.reason = reason;
		e = ev_reserve_drop(class, &k, &now);
	} else {
		e = ev_reserve(class);
		if (e) {
			ev_ends(&e->k, netns, fam6, proto, saddr, sport, daddr, dport);
			e->k.t.table = table;
			e->k.t.reason = reason;
		}
	}
	if (!e)
		return;
	if (x) {
		ev_addr(e->xaddr, x, fam6);
		e->xport = xport;
		e->xfamily = e->k.t.family;
	}
	ev_submit(e, b);
}

#endif /* __ONC_FLOWS_H */
