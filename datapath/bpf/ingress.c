//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Ingress fast path: tc ingress of the uplink. A VXLAN packet of a flow the
 * slow path established, from the node that owns the sender's CIDR, to a
 * local pod loses its outer headers, gets the pod's MACs and goes straight
 * into the pod (bpf_redirect_peer): no VXLAN device, no routing, no netfilter.
 * Before anything else, every frame for the VXLAN port passes the overlay
 * guard (overlay.h), which drops what no peer may send.
 */
#include "include/onc.h"
#include "include/overlay.h"
#include "include/parse.h"

SEC("tc")
int onc_ingress_fast(struct __sk_buff *skb)
{
	void *data, *end;
	struct onc_config *cfg = config();
	struct local_pod *pod;
	struct cidr_val *peer;
	struct flow_key key = {};
	struct iphdr *outer;
	struct ethhdr *eth;
	struct l4 p;
	__u32 ifindex;
	int drop;

	if (!cfg)
		return TC_ACT_OK;
	drop = overlay_guard(skb, cfg);
	if (drop) {
		count(drop);
		return TC_ACT_SHOT;
	}
	/* After the guard, which may have pulled data. */
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	outer = parse_vxlan(data, end, cfg);
	if (!outer || !is_ipv4(data + ONC_ENCAP_LEN, end) ||
	    parse_l4(data, end, ONC_HDR_LEN, &p)) {
		count(STAT_INGRESS_MISS_NOT_VXLAN);
		return TC_ACT_OK;
	}
	if (p.tcp_flags) {
		if (p.tcp_flags & TCP_SYN) { /* a SYN-ACK too: the reply of a new connection */
			flow_in(&key, &p);
			flow_forget(&key);
		}
		count(STAT_INGRESS_MISS_TCP_FLAGS);
		return TC_ACT_OK;
	}
	if (!cfg->enabled) {
		count(STAT_INGRESS_MISS_DISABLED);
		return TC_ACT_OK;
	}
	if (is_host(p.ip->saddr)) {
		count(STAT_INGRESS_MISS_HOST);
		return TC_ACT_OK;
	}
	peer = peer_of(p.ip->saddr);
	if (!peer || peer->node_ip != outer->saddr) {
		count(STAT_INGRESS_MISS_NO_PEER);
		return TC_ACT_OK;
	}
	pod = bpf_map_lookup_elem(&onc_local, &p.ip->daddr);
	if (!pod) {
		count(STAT_INGRESS_MISS_NO_POD);
		return TC_ACT_OK;
	}
	flow_in(&key, &p);
	if (!flow_allowed(&key, cfg->epoch)) {
		count(STAT_INGRESS_MISS_FLOW);
		return TC_ACT_OK;
	}
	if (p.ip->ttl <= 1) {
		count(STAT_INGRESS_MISS_TTL);
		return TC_ACT_OK;
	}
	ip_dec_ttl(p.ip);
	ifindex = pod->ifindex;

	if (bpf_skb_adjust_room(skb, -ONC_ENCAP_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO))
		goto err;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > end)
		goto err;
	__builtin_memcpy(eth->h_dest, pod->pod_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, pod->host_mac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);

	count(STAT_INGRESS_HIT);
	return bpf_redirect_peer(ifindex, 0);
err:
	count(STAT_INGRESS_ERROR);
	return TC_ACT_SHOT;
}
