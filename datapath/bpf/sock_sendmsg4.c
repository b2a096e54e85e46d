//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup sendmsg4: a datagram of an unconnected UDP socket to a ClusterIP
 * is sent to a backend pod instead.
 */
#include "include/lb.h"

SEC("cgroup/sendmsg4")
int onc_sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, LB_STAT_SENDMSG_TRANSLATED, LB_STAT_SENDMSG_REFUSED);
}
