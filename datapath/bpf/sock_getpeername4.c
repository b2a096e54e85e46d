//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup getpeername4: a socket connected through a Service reports the
 * ClusterIP:port it dialled, not the backend it reached.
 */
#include "include/lb.h"

SEC("cgroup/getpeername4")
int onc_sock_getpeername4(struct bpf_sock_addr *ctx)
{
	lb_reverse(ctx, LB_STAT_GETPEERNAME_REVERSED);
	return SYS_PROCEED;
}
