//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup sock_ops: records a TCP socket in the bypass map when it reaches
 * ESTABLISHED and both its ends are pods of this node, and forgets its
 * metadata when it closes (the kernel unlinks the socket from the map
 * itself). The handshake went through netfilter, so a pair policy denies
 * never gets here.
 */
#include "include/bypass.h"

static __always_inline void bp_record(struct bpf_sock_ops *skops, __u8 role)
{
	struct bpf_sock *sk = skops->sk;
	struct bp_conn conn = { .role = role };
	struct bp_key key = {};
	struct bp_cfg *cfg;
	__u64 *owner;

	if (!sk || !bp_key_of(skops, &key))
		return;
	/* Only this agent's pods, each in its own namespace: not the host,
	 * not hostNetwork pods, not another agent's pods on a shared kernel. */
	owner = bpf_map_lookup_elem(&onc_bp_pods, &key.local_ip);
	if (!owner || *owner != bpf_get_netns_cookie(skops))
		return;
	/* A pod talking to itself goes over lo, never policed: leave it. */
	if (key.local_ip == key.remote_ip)
		return;
	if (!bpf_map_lookup_elem(&onc_bp_pods, &key.remote_ip)) {
		bp_count(BP_STAT_SKIP_REMOTE, 1);
		return;
	}
	cfg = bp_config();
	if (!cfg || cfg->mode == BP_MODE_OFF) {
		bp_count(BP_STAT_SKIP_OFF, 1);
		return;
	}
	if (cfg->paused) {
		bp_count(BP_STAT_SKIP_PAUSED, 1);
		return;
	}
	if (skops->data_segs_in || skops->data_segs_out) {
		bp_count(BP_STAT_SKIP_EARLY_DATA, 1);
		return;
	}
	/* BPF_ANY: an entry under this key can only be a socket that was reset
	 * while its application keeps the file open (the kernel unlinks it at
	 * close); its addresses and ports are free for a new connection. Left
	 * in place, it would swallow the new peer's sends. */
	/* The direction state sk_msg keeps, made now: a socket sk_msg could not
	 * remember a decision for might redirect after sending by the stack. */
	if (!bpf_sk_storage_get(&onc_bp_dir, sk, 0, BPF_SK_STORAGE_GET_F_CREATE)) {
		bp_count(BP_STAT_RECORD_FAILED, 1);
		return;
	}
	conn.since_ns = bpf_ktime_get_ns();
	conn.cookie = bpf_get_socket_cookie(skops);
	if (bpf_map_update_elem(&onc_bp_conn, &key, &conn, BPF_ANY)) {
		bp_count(BP_STAT_RECORD_FAILED, 1);
		return;
	}
	if (bpf_sock_hash_update(skops, &onc_bp_sock, &key, BPF_ANY)) {
		bpf_map_delete_elem(&onc_bp_conn, &key);
		bp_count(BP_STAT_RECORD_FAILED, 1);
		return;
	}
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	bp_count(BP_STAT_RECORDED, 1);
}

static __always_inline void bp_closed(struct bpf_sock_ops *skops)
{
	struct bp_key key = {};

	if (bp_key_of(skops, &key))
		bpf_map_delete_elem(&onc_bp_conn, &key);
}

SEC("sockops")
int onc_sock_ops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		bp_record(skops, BP_ROLE_CLIENT);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		bp_record(skops, BP_ROLE_SERVER);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] == BPF_TCP_CLOSE)
			bp_closed(skops);
		break;
	}
	return 1;
}
