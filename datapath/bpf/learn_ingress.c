//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Ingress learning: tc egress of a pod's host-side veth (packets about to
 * enter the pod). If the slow path marked the packet as part of an
 * ESTABLISHED flow that came in over onc.vxlan from a fast-path peer,
 * remember that the flow may enter.
 */
#include "include/onc.h"
#include "include/parse.h"

SEC("tc")
int onc_learn_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct onc_config *cfg = config();
	struct flow_key key = {};
	struct l4 p;

	if (!cfg || !(skb->mark & cfg->mark))
		return TC_ACT_OK;
	skb->mark &= ~cfg->mark; /* ONC's bit never reaches the pod */
	/* Off, the fast path learns nothing (it flushes when switched on). */
	if (!cfg->enabled || !is_ipv4(data, end) || parse_l4(data, end, sizeof(struct ethhdr), &p))
		return TC_ACT_OK;
	if (!cfg->learning) {
		count(STAT_LEARN_PAUSED);
		return TC_ACT_OK;
	}
	if (!learnable(&p))
		return TC_ACT_OK;
	if (is_host(p.ip->saddr) || !peer_of(p.ip->saddr) || !bpf_map_lookup_elem(&onc_local, &p.ip->daddr))
		return TC_ACT_OK;
	flow_in(&key, &p);
	count(flow_learn(&key, cfg->epoch, 0) ? STAT_LEARN_INGRESS : STAT_LEARN_KNOWN);
	return TC_ACT_OK;
}
