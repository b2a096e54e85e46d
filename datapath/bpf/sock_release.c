//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup sock_release: a closing socket's reverse translation goes with
 * it. A connected socket has one, keyed by its peer; an unconnected UDP
 * socket's entries (one per backend it sent to) age out of the LRU.
 */
#include "include/lb.h"

SEC("cgroup/sock_release")
int onc_sock_release(struct bpf_sock *sk)
{
	struct lb_revnat_key key = {};

	if (sk->family != ONC_AF_INET || (sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP) ||
	    !sk->dst_ip4)
		return SYS_PROCEED;
	key.sock = bpf_get_socket_cookie(sk);
	key.be.ip = sk->dst_ip4;
	key.be.port = sk->dst_port;
	key.proto = (__u8)sk->protocol;
	if (bpf_map_delete_elem(&onc_lb_revnat, &key) == 0)
		lb_count(LB_STAT_RELEASED);
	return SYS_PROCEED;
}
