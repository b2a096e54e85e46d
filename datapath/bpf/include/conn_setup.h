/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Connection setup on the fast path, shared by every program that hands a
 * local pod's TCP packets past the stack: the fast path's, for peers'
 * pods over the overlay (fastpath.c), and the uplink load balancer's, for
 * clients outside (services.c). A SYN no policy of this node can deny
 * opens its connection in onc_filter, recording which end opened it; the
 * connection's later packets, SYN-ACK, FIN and RST included, ride the
 * fast path on this node, since conntrack never saw it open. The agent
 * hands such a connection over to conntrack whenever the fast path lets
 * go of it while it may still be alive (datapath/fastpath, setup.go).
 *
 * Both families share the code: each helper takes its family's maps (the
 * filter, onc_filter or onc_filter6; the closes, onc_fin or onc_fin6; the
 * open pods, onc_open or onc_open6) and a key of that family, and is
 * inlined, so that every map pointer stays the constant the verifier
 * needs. flow_* are IPv4's, flow6_* IPv6's.
 */
#ifndef __ONC_CONN_SETUP_H
#define __ONC_CONN_SETUP_H

#include "fastpath.h"
#include "parse.h"

/* What a TCP packet that opens or closes a connection may do (flow_setup). */
enum flow_setup {
	SETUP_NONE, /* not one: data, or UDP */
	SETUP_SLOW, /* the slow path, so that conntrack sees it */
	SETUP_OPEN, /* a SYN the fast path may open its connection with */
	SETUP_RIDE, /* of a connection the fast path opened: it rides along */
};

/*
 * conn_setup decides the way of a packet with SYN, FIN or RST (ctl, the
 * packet's flags of TCP_CTL; ack, its ACK bit), k its flow's key and
 * local_ip the local pod's address in it, and forgets what the cache
 * holds for a connection a SYN starts anew (filter_forget). egress: the
 * local pod sent it. A SYN may open its connection on the fast path when
 * no policy isolates the local pod (open; every pod where no
 * NetworkPolicy runs: onc_conn_setup) and learning runs; every later
 * packet of that connection, SYN-ACK and FIN included, then rides the
 * fast path on this node: conntrack has no entry for it, so the slow path
 * would find them invalid. Everything else opens and closes through
 * conntrack.
 */
static __always_inline int conn_setup(void *filter, void *fin, void *open, const void *k, const void *local_ip,
				      __u8 ctl, __u8 ack, const struct onc_config *cfg, int egress)
{
	__u8 syn_ack = ctl == TCP_SYN && ack;
	struct flow_val *v;
	__u8 closing;

	if (!ctl)
		return SETUP_NONE;
	if (ctl == TCP_SYN && !syn_ack) {
		filter_forget(filter, fin, k);
		if (onc_conn_setup == CONN_SETUP_OFF || !cfg || !cfg->enabled || !cfg->learning)
			return SETUP_SLOW;
		if (onc_conn_setup == CONN_SETUP_EVERY_POD || bpf_map_lookup_elem(open, local_ip))
			return SETUP_OPEN;
		return SETUP_SLOW;
	}
	v = bpf_map_lookup_elem(filter, k);
	if (!cfg || !v || !v->opener || v->epoch != cfg->epoch)
		goto slow;
	/* A SYN-ACK answers the SYN that opened the connection, from its
	 * other end, before any FIN or remote RST: the entry of an earlier
	 * connection on the same addresses and ports (one refused leaves its
	 * remote RST's mark) must not carry a new one that netfilter
	 * translated onto them. */
	if (syn_ack && (v->closing || v->opener != (egress ? FLOW_OPENED_BY_REMOTE : FLOW_OPENED_BY_LOCAL)))
		goto slow;
	/* The local pod's RST marks nothing: flow_close_step forgets the
	 * connection if it ends it, and one that does not (SYN_SENT's bare
	 * RST to a bad ACK) changes nothing. */
	closing = v->closing;
	if ((ctl & TCP_RST) && !egress)
		closing |= FLOW_CLOSING_REMOTE_RST;
	else if (ctl & TCP_FIN)
		closing |= egress ? FLOW_CLOSING_LOCAL_FIN : FLOW_CLOSING_REMOTE_FIN;
	if (closing != v->closing)
		v->closing = closing;
	return SETUP_RIDE;
slow:
	if (ctl & TCP_SYN) /* a SYN-ACK of a connection conntrack saw open */
		filter_forget(filter, fin, k);
	return SETUP_SLOW;
}

/* flow_setup is conn_setup for an IPv4 flow, flow6_setup for an IPv6 one. */
static __always_inline int flow_setup(const struct flow_key *k, __u8 ctl, __u8 ack,
				      const struct onc_config *cfg, int egress)
{
	return conn_setup(&onc_filter, &onc_fin, &onc_open, k, &k->local_ip, ctl, ack, cfg, egress);
}

static __always_inline int flow6_setup(const struct flow_key6 *k, __u8 ctl, __u8 ack,
				       const struct onc_config *cfg, int egress)
{
	return conn_setup(&onc_filter6, &onc_fin6, &onc_open6, k, k->local_ip, ctl, ack, cfg, egress);
}

/*
 * conn_close_step follows the close of a connection the fast path opened
 * (k its key, v its entry in filter, NULL if none; fin the closes of
 * filter's family), one packet at a time: seg is the packet's TCP
 * segment, out whether the local pod sent it. It returns 1 when the
 * packet ends the connection, having forgotten it in the flow cache
 * (filter_forget; the uplink's caller forgets its own records): left in the
 * LRU maps, the records of closed connections would pile up until a burst
 * of short connections evicted the only record of a long idle one, whose
 * next packets the slow path cannot carry. The end is the ACK of the
 * second of the two FINs once the first is acknowledged too (not merely
 * the first packet after both: after a half-close an ACK of data crosses
 * the second FIN, and in a simultaneous close each end acknowledges the
 * other's), or an RST the local pod sends with ACK (an abort) or after its
 * own FIN (its socket gone, a late packet answered). Not its bare RST
 * before its FIN: Linux sends one in SYN_SENT to a SYN-ACK with a bad ACK
 * (which anyone could forge) and keeps the connection. An RST from the
 * other end is not trusted to end it either: anyone outside could forge
 * one with a client's address, and the pod's stack ignores one outside its
 * window, so the connection may go on; flow_setup marks it, and the pod's
 * next packet, which says it lives, clears the mark.
 */
static __always_inline int conn_close_step(void *filter, void *fin, const void *k, struct flow_val *v, int out,
					   const struct tcp_seg *seg)
{
	int d = out ? FLOW_DIR_OUT : FLOW_DIR_IN, o = out ? FLOW_DIR_IN : FLOW_DIR_OUT;
	struct flow_fin f = {}, *cur;

	if (!v || !v->opener)
		return 0;
	if (seg->flags & TCP_RST) {
		if (!out || (!(seg->flags & TCP_ACK) && !(v->closing & FLOW_CLOSING_LOCAL_FIN)))
			return 0;
		filter_forget(filter, fin, k);
		return 1;
	}
	if (out && (v->closing & FLOW_CLOSING_REMOTE_RST))
		v->closing &= ~FLOW_CLOSING_REMOTE_RST;
	if (!(v->closing & (FLOW_CLOSING_LOCAL_FIN | FLOW_CLOSING_REMOTE_FIN)))
		return 0;
	cur = bpf_map_lookup_elem(fin, k);
	if (cur)
		f = *cur;
	/* BIG TCP leaves the IPv4 total length or the IPv6 payload length 0,
	 * which makes len wrap: no end to expect then. */
	if ((seg->flags & TCP_FIN) && seg->len < 0x10000) {
		f.end[d] = seg->seq + seg->len + 1;
		f.sent[d] = 1;
	}
	/* Nothing follows a FIN, so the ACK of one is exactly its end: a FIN
	 * forged from outside (another end) is then never acknowledged by
	 * the pod's duplicate ACKs, which carry what it really expects. */
	if ((seg->flags & TCP_ACK) && f.sent[o] && seg->ack == f.end[o])
		f.acked[o] = 1;
	if (f.acked[FLOW_DIR_OUT] && f.acked[FLOW_DIR_IN]) {
		filter_forget(filter, fin, k);
		return 1;
	}
	if (!cur || cur->sent[d] != f.sent[d] || cur->end[d] != f.end[d] || cur->acked[o] != f.acked[o])
		bpf_map_update_elem(fin, k, &f, BPF_ANY);
	return 0;
}

/* flow_close_step is conn_close_step for an IPv4 flow, flow6_close_step
 * for an IPv6 one. */
static __always_inline int flow_close_step(const struct flow_key *k, struct flow_val *v, int out,
					   const struct tcp_seg *seg)
{
	return conn_close_step(&onc_filter, &onc_fin, k, v, out, seg);
}

static __always_inline int flow6_close_step(const struct flow_key6 *k, struct flow_val *v, int out,
					    const struct tcp_seg *seg)
{
	return conn_close_step(&onc_filter6, &onc_fin6, k, v, out, seg);
}

/* conn_open records in filter a connection the fast path opens (k its
 * key): allowed both ways in this epoch, and who opened it. flow_open and
 * flow6_open are IPv4's and IPv6's. */
static __always_inline int conn_open(void *filter, const void *k, __u32 epoch, __u8 opener)
{
	struct flow_val v = { .epoch = epoch, .egress = 1, .ingress = 1, .opener = opener };

	return bpf_map_update_elem(filter, k, &v, BPF_ANY);
}

static __always_inline int flow_open(const struct flow_key *k, __u32 epoch, __u8 opener)
{
	return conn_open(&onc_filter, k, epoch, opener);
}

static __always_inline int flow6_open(const struct flow_key6 *k, __u32 epoch, __u8 opener)
{
	return conn_open(&onc_filter6, k, epoch, opener);
}

#endif /* __ONC_CONN_SETUP_H */
