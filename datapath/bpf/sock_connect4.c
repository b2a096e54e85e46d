//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup connect4: TCP and connected UDP to a ClusterIP connect to a
 * backend pod instead; no packet of the connection carries the ClusterIP.
 */
#include "include/lb.h"

SEC("cgroup/connect4")
int onc_sock_connect4(struct bpf_sock_addr *ctx)
{
	return lb_translate(ctx, LB_STAT_CONNECT_TRANSLATED, LB_STAT_CONNECT_REFUSED);
}
