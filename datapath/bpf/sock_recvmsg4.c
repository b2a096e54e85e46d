//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup recvmsg4: a UDP reply from a backend reads as coming from the
 * ClusterIP:port it was sent to, as resolvers and other clients check.
 */
#include "include/lb.h"

SEC("cgroup/recvmsg4")
int onc_sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, LB_STAT_RECVMSG_REVERSED);
	return SYS_PROCEED;
}
