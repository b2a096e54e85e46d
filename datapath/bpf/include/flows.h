/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Flow events: what the programs tell the agent about single flows, as
 * records (agent/flows, docs/observability.md). Only drop sites and
 * once-per-connection sites emit; a fast-path hit never reaches this file.
 *
 * An event is built in a per-CPU scratch slot of its class (no stack: the
 * uplink programs sit close to the 512-byte limit), passes the per-flow
 * dedupe (drops: one per flow and reason a second) and the class's
 * per-CPU budget (a token bucket: onc_ev_interval_ns apart on average,
 * onc_ev_burst at once), and is copied to onc_events, a ring buffer the
 * agent reads. An event the budget holds back is counted in the next one
 * emitted (suppressed). onc_ev_stats counts what became of them all.
 *
 * The fast path's object owns these maps (pinned by name); the services
 * object shares them as it shares the flow cache (bpf.FlowCache), so one
 * ring carries both objects' events. An upgrade from a version without
 * them adopts the other pins and creates these beside them.
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

/* A class's budget on one CPU, and its scratch event. */
struct flow_ev_slot {
	__u64 tat;  /* the budget's theoretical arrival time (GCRA), in ktime ns */
	__u64 seen; /* scratch for the dedupe's value */
	__u32 suppressed;
	__u32 pad;
	struct flow_event ev;
	/* No room: only so the enum reaches BTF, where the agent reads the
	 * tables' names (bpf.LoadEventNames). */
	enum onc_ev_table tables[0];
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
	__type(value, struct flow_ev_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_ev_slots SEC(".maps");

/* The drops' dedupe: flow, reason, interface or netns -> when its last
 * event went. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_ev_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_ev_seen SEC(".maps");

ONC_COUNTERS(onc_ev_stats, flows_stat, FLOWS_STAT_MAX);

/* ev_start is class's scratch event, zeroed, with its class and time; NULL
 * when events are off. */
static __always_inline struct flow_ev_slot *ev_start(__u32 class)
{
	struct flow_ev_slot *s;

	if (!onc_ev_interval_ns)
		return NULL;
	s = bpf_map_lookup_elem(&onc_ev_slots, &class);
	if (!s)
		return NULL;
	__builtin_memset(&s->ev, 0, sizeof(s->ev));
	s->ev.class = class;
	s->ev.ts_ns = bpf_ktime_get_ns();
	return s;
}

/* ev_send emits s's event if the budget allows: a generic cell rate
 * algorithm, which keeps one timestamp and needs no division. */
static __always_inline void ev_send(struct flow_ev_slot *s)
{
	__u64 now = s->ev.ts_ns, tat = s->tat > now ? s->tat : now;
	__u64 flags = BPF_RB_NO_WAKEUP;

	/* Each event takes one interval: a burst fits within burst - 1 of them
	 * ahead of now. */
	if (tat - now > (onc_ev_burst - 1) * onc_ev_interval_ns) {
		s->suppressed++;
		count(&onc_ev_stats, FLOWS_STAT_SUPPRESSED, 1);
		return;
	}
	s->tat = tat + onc_ev_interval_ns;
	s->ev.suppressed = s->suppressed;
	if (bpf_ringbuf_query(&onc_events, BPF_RB_AVAIL_DATA) > EV_WAKEUP_BYTES)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&onc_events, &s->ev, sizeof(s->ev), flags)) {
		count(&onc_ev_stats, FLOWS_STAT_LOST, 1);
		return; /* the suppressed count waits for the next one */
	}
	s->suppressed = 0;
	count(&onc_ev_stats, FLOWS_STAT_EMITTED, 1);
}

/* ev_send_drop emits a drop unless the same flow and reason sent one
 * within the second. */
static __always_inline void ev_send_drop(struct flow_ev_slot *s)
{
	__u64 *last = bpf_map_lookup_elem(&onc_ev_seen, &s->ev.k);

	if (last && s->ev.ts_ns - *last < EV_DEDUPE_NS) {
		count(&onc_ev_stats, FLOWS_STAT_DEDUPED, 1);
		return;
	}
	s->seen = s->ev.ts_ns;
	bpf_map_update_elem(&onc_ev_seen, &s->ev.k, &s->seen, BPF_ANY);
	ev_send(s);
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
	struct flow_ev_slot *s = ev_start(EV_DROP);
	__u8 b;

	if (!s)
		return;
	s->ev.k.ifindex = skb->ifindex;
	s->ev.k.t.table = table;
	s->ev.k.t.reason = reason;
	ev_load_ip(skb, off, &s->ev.k.t);
	if (outer && !bpf_skb_load_bytes(skb, outer, &b, 1)) {
		if (b >> 4 == 4 && !bpf_skb_load_bytes(skb, outer + 12, s->ev.xaddr, 4))
			s->ev.xfamily = ONC_AF_INET;
		else if (b >> 4 == 6 && !bpf_skb_load_bytes(skb, outer + 8, s->ev.xaddr, 16))
			s->ev.xfamily = ONC_AF_INET6;
	}
	ev_send_drop(s);
}

/* ev_addr copies an address of fam6's family into an event's slot. */
static __always_inline void ev_addr(__u8 *slot, const void *a, int fam6)
{
	if (fam6)
		__builtin_memcpy(slot, a, 16);
	else
		__builtin_memcpy(slot, a, 4);
}

/*
 * ev_three emits class's event of a flow from saddr:sport to daddr:dport
 * (proto; a socket call's has no source) with a third end, x:xport (NULL:
 * none), all of fam6's family. A refusal (EV_REFUSE) is a drop: reason,
 * a value of table, and the dedupe.
 */
static __always_inline void ev_three(__u32 class, __u64 netns, int fam6, __u8 proto, const void *saddr,
				     __be16 sport, const void *daddr, __be16 dport, const void *x, __be16 xport,
				     __u8 table, __u16 reason)
{
	struct flow_ev_slot *s = ev_start(class);
	struct flow_tuple *t;

	if (!s)
		return;
	t = &s->ev.k.t;
	s->ev.k.cookie = netns;
	t->family = fam6 ? ONC_AF_INET6 : ONC_AF_INET;
	t->proto = proto;
	if (saddr)
		ev_addr(t->saddr, saddr, fam6);
	t->sport = sport;
	ev_addr(t->daddr, daddr, fam6);
	t->dport = dport;
	if (x) {
		ev_addr(s->ev.xaddr, x, fam6);
		s->ev.xport = xport;
		s->ev.xfamily = t->family;
	}
	if (class != EV_REFUSE) {
		ev_send(s);
		return;
	}
	t->table = table;
	t->reason = reason;
	ev_send_drop(s);
}

#endif /* __ONC_FLOWS_H */
