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
 * flow_setup decides the way of a packet with SYN, FIN or RST (ctl, the
 * packet's flags of TCP_CTL; syn_ack, SYN and ACK alone), and forgets what
 * the cache holds for a connection a SYN starts anew (flow_forget).
 * egress: the local pod sent it. A SYN may open its connection on the
 * fast path when no policy isolates the local pod (onc_open; every pod
 * where no NetworkPolicy runs: onc_conn_setup) and learning runs; every
 * later packet of that connection, SYN-ACK and FIN included, then rides
 * the fast path on this node: conntrack has no entry for it, so the slow
 * path would find them invalid. Everything else opens and closes through
 * conntrack.
 */
static __always_inline int flow_setup(const struct flow_key *k, __u8 ctl, __u8 syn_ack,
				      const struct onc_config *cfg, int egress)
{
	struct flow_val *v;
	__u8 closing;

	if (!ctl)
		return SETUP_NONE;
	if (ctl == TCP_SYN && !syn_ack) {
		flow_forget(k);
		if (onc_conn_setup == CONN_SETUP_OFF || !cfg || !cfg->enabled || !cfg->learning)
			return SETUP_SLOW;
		if (onc_conn_setup == CONN_SETUP_EVERY_POD ||
		    bpf_map_lookup_elem(&onc_open, &k->local_ip))
			return SETUP_OPEN;
		return SETUP_SLOW;
	}
	v = bpf_map_lookup_elem(&onc_filter, k);
	if (!cfg || !v || !v->opener || v->epoch != cfg->epoch)
		goto slow;
	/* A SYN-ACK answers the SYN that opened the connection, from its
	 * other end, before any close: the entry of an earlier connection on
	 * the same addresses and ports must not carry a new one that netfilter
	 * translated onto them. */
	if (syn_ack &&
	    (v->closing || v->opener != (egress ? FLOW_OPENED_BY_REMOTE : FLOW_OPENED_BY_LOCAL)))
		goto slow;
	closing = v->closing;
	if (ctl & TCP_RST)
		closing |= FLOW_CLOSING_RST;
	else if (ctl & TCP_FIN)
		closing |= egress ? FLOW_CLOSING_LOCAL_FIN : FLOW_CLOSING_REMOTE_FIN;
	if (closing != v->closing)
		v->closing = closing;
	return SETUP_RIDE;
slow:
	if (ctl & TCP_SYN) /* a SYN-ACK of a connection conntrack saw open */
		flow_forget(k);
	return SETUP_SLOW;
}

/* flow_open records a connection the fast path opens: allowed both ways in
 * this epoch, and who opened it. */
static __always_inline int flow_open(const struct flow_key *k, __u32 epoch, __u8 opener)
{
	struct flow_val v = { .epoch = epoch, .egress = 1, .ingress = 1, .opener = opener };

	return bpf_map_update_elem(&onc_filter, k, &v, BPF_ANY);
}

#endif /* __ONC_CONN_SETUP_H */
