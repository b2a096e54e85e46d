//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The intra-node bypass: a sockops program records each ESTABLISHED TCP
 * socket whose two ends are pods of this node, and an sk_msg program on
 * that map queues each of its sends onto the peer socket (include/bypass.h).
 * Both tell the agent, through the fast path's flow events ring
 * (include/flows.h), of a connection paired and of a direction that went
 * to the stack for good: once each, never per message.
 */
#include "include/bypass.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/*
 * cgroup sock_ops: records a TCP socket in its family's bypass map when it
 * reaches ESTABLISHED and both its ends are pods of this node, and forgets its
 * metadata when it closes (the kernel unlinks the socket from the map
 * itself). The handshake went through netfilter, so a pair policy denies
 * never gets here.
 *
 * bp_record_in records one socket of either family: key is its key in
 * socks and conns, peer its peer's, local and remote its addresses (n
 * 32-bit words each, keys of pods), all of its family.
 */
static __always_inline void bp_record_in(struct bpf_sock_ops *skops, __u8 role, void *pods, void *conns, void *socks,
					 void *key, const void *peer, const __u32 *local, const __u32 *remote, int n)
{
	struct bpf_sock *sk = skops->sk;
	struct bp_conn conn = { .role = role };
	struct bp_cfg *cfg;
	__u64 *owner;

	if (!sk)
		return;
	/* Only this agent's pods, each in its own namespace: not the host,
	 * not hostNetwork pods, not another agent's pods on a shared kernel. */
	owner = bpf_map_lookup_elem(pods, local);
	if (!owner || *owner != bpf_get_netns_cookie(skops))
		return;
	/* A pod talking to itself goes over lo, never policed: leave it. */
	if (bp_same_addr(local, remote, n))
		return;
	if (!bpf_map_lookup_elem(pods, remote)) {
		count(&onc_bp_stats, BP_STAT_SKIP_REMOTE, 1);
		return;
	}
	cfg = bp_config();
	if (!cfg || cfg->mode == BP_MODE_OFF) {
		count(&onc_bp_stats, BP_STAT_SKIP_OFF, 1);
		return;
	}
	if (cfg->paused) {
		count(&onc_bp_stats, BP_STAT_SKIP_PAUSED, 1);
		return;
	}
	if (skops->data_segs_in || skops->data_segs_out) {
		count(&onc_bp_stats, BP_STAT_SKIP_EARLY_DATA, 1);
		return;
	}
	/* BPF_ANY: an entry under this key can only be a socket that was reset
	 * while its application keeps the file open (the kernel unlinks it at
	 * close); its addresses and ports are free for a new connection. Left
	 * in place, it would swallow the new peer's sends. */
	/* The direction state sk_msg keeps, made now: a socket sk_msg could not
	 * remember a decision for might redirect after sending by the stack. */
	if (!bpf_sk_storage_get(&onc_bp_dir, sk, 0, BPF_SK_STORAGE_GET_F_CREATE)) {
		count(&onc_bp_stats, BP_STAT_RECORD_FAILED, 1);
		return;
	}
	conn.since_ns = bpf_ktime_get_ns();
	conn.cookie = bpf_get_socket_cookie(skops);
	if (bpf_map_update_elem(conns, key, &conn, BPF_ANY)) {
		count(&onc_bp_stats, BP_STAT_RECORD_FAILED, 1);
		return;
	}
	if (bpf_sock_hash_update(skops, socks, key, BPF_ANY)) {
		bpf_map_delete_elem(conns, key);
		count(&onc_bp_stats, BP_STAT_RECORD_FAILED, 1);
		return;
	}
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	count(&onc_bp_stats, BP_STAT_RECORDED, 1);
	/* The socket recorded second pairs the connection: one event, client
	 * to server. The handshake orders the two (the client is ESTABLISHED
	 * before it sends the ACK that makes the server so), so the server
	 * finds the client here, never the other way. */
	if (bpf_map_lookup_elem(conns, peer))
		bp_ev(EV_PAIR, key, n, role == BP_ROLE_SERVER, 0);
}

/* IPv4 sockets (and dual-stack ones talking IPv4) go to the IPv4 maps,
 * IPv6 ones to the IPv6 maps. */
static __always_inline void bp_record(struct bpf_sock_ops *skops, __u8 role)
{
	struct bp_key key = {}, peer = {};
	struct bp_key6 key6 = {}, peer6 = {};

	switch (bp_key_of(skops, &key, &key6)) {
	case BP_KEY4:
		bp_peer_of(&key, &peer);
		bp_record_in(skops, role, &onc_bp_pods, &onc_bp_conn, &onc_bp_sock, &key, &peer, &key.local_ip,
			     &key.remote_ip, 1);
		break;
	case BP_KEY6:
		bp_peer_of(&key6, &peer6);
		bp_record_in(skops, role, &onc_bp_pods6, &onc_bp_conn6, &onc_bp_sock6, &key6, &peer6, key6.local_ip,
			     key6.remote_ip, 4);
		break;
	}
}

static __always_inline void bp_closed(struct bpf_sock_ops *skops)
{
	struct bp_key key = {};
	struct bp_key6 key6 = {};

	switch (bp_key_of(skops, &key, &key6)) {
	case BP_KEY4:
		bpf_map_delete_elem(&onc_bp_conn, &key);
		break;
	case BP_KEY6:
		bpf_map_delete_elem(&onc_bp_conn6, &key6);
		break;
	}
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

/*
 * sk_msg on the bypass map: each send of a recorded socket is queued on
 * the peer socket's receive queue, or left to the stack. The verdict is
 * always SK_PASS: a message the program does not redirect is sent as if
 * no program were there.
 */
#define BP_TCP_ESTABLISHED 1
#define BP_TCP_CLOSE_WAIT 8

/* The kernel's view, read through BTF (CO-RE): only the fields used. */
struct sk_psock___bp {
	__u32 msg_tot_len; /* bytes queued by redirects, unread */
} __attribute__((preserve_access_index));

struct sock___bp {
	void *sk_user_data; /* the psock of a socket in a sockmap */
} __attribute__((preserve_access_index));

struct sk_msg___bp {
	struct sock___bp *sk_redir;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* Bytes the redirect target holds unread. A redirect charges the receiver
 * without looking at its receive buffer, so a reader that stalls would let
 * its peer queue until the whole host's TCP memory runs short. */
static __always_inline __u32 bp_peer_queued(struct sk_msg_md *md)
{
	struct sk_msg___bp *msg = bpf_cast_to_kern_ctx(md);
	struct sk_psock___bp *psock;
	struct sock___bp *peer;

	peer = BPF_CORE_READ(msg, sk_redir);
	if (!peer)
		return 0;
	/* The pointer's low bits are flags (SK_USER_DATA_PTRMASK). */
	psock = (void *)((unsigned long)BPF_CORE_READ(peer, sk_user_data) & ~7UL);
	if (!psock)
		return 0;
	return BPF_CORE_READ(psock, msg_tot_len);
}

static __always_inline int bp_stack(struct sk_msg_md *msg)
{
	count(&onc_bp_stats, BP_STAT_STACK_MSGS, 1);
	count(&onc_bp_stats, BP_STAT_STACK_BYTES, msg->size);
	return SK_PASS;
}

/* bp_fall_back sends the socket key names (of n-word addresses) by the
 * stack from now on, for reason why: counted and reported. */
static __always_inline void bp_fall_back(struct bp_sock *st, const void *key, int n, enum bp_stat why)
{
	st->dir = BP_DIR_STACK;
	count(&onc_bp_stats, why, 1);
	bp_ev(EV_FALLBACK, key, n, 0, why);
}

/* One send of a socket of either family: key is its key (n-word
 * addresses), peer the key of the other end in socks, its family's
 * SOCKHASH. */
static __always_inline int bp_send(struct sk_msg_md *msg, struct bpf_sock *sk, void *socks, const void *key,
				   void *peer, int n)
{
	struct bp_cfg *cfg;
	struct bp_sock *st;

	/* Made when sock_ops recorded the socket. */
	st = bpf_sk_storage_get(&onc_bp_dir, sk, 0, 0);
	if (!st)
		return bp_stack(msg);
	if (st->dir == BP_DIR_STACK)
		return bp_stack(msg);
	/* tcp_bpf_sendmsg does not check for SHUT_WR: after it, the stack
	 * must send (and fail with EPIPE), as it would without the bypass. */
	if (sk->state != BP_TCP_ESTABLISHED && sk->state != BP_TCP_CLOSE_WAIT) {
		count(&onc_bp_stats, BP_STAT_FALLBACK_STATE, 1);
		return bp_stack(msg);
	}
	cfg = bp_config();
	if (!cfg || cfg->mode == BP_MODE_OFF) {
		bp_fall_back(st, key, n, BP_STAT_FALLBACK_OFF);
		return bp_stack(msg);
	}
	if (st->dir == BP_DIR_UNDECIDED && cfg->mode == BP_MODE_SIZE && msg->size < cfg->min_size) {
		bp_fall_back(st, key, n, BP_STAT_FALLBACK_SMALL);
		return bp_stack(msg);
	}
	/* On a miss the helper sets no target, and SK_PASS means the stack. */
	if (bpf_msg_redirect_hash(msg, socks, peer, BPF_F_INGRESS) != SK_PASS) {
		bp_fall_back(st, key, n, BP_STAT_FALLBACK_MISS);
		return bp_stack(msg);
	}
	count(&onc_bp_stats, BP_STAT_REDIRECTED_MSGS, 1);
	count(&onc_bp_stats, BP_STAT_REDIRECTED_BYTES, msg->size);
	/* This message still goes; the next ones take the stack (bypass to
	 * stack keeps the order), where flow control bounds the queue. */
	if (cfg->max_queued && bp_peer_queued(msg) + msg->size > cfg->max_queued) {
		bp_fall_back(st, key, n, BP_STAT_FALLBACK_PEER_FULL);
		return SK_PASS;
	}
	st->dir = BP_DIR_BYPASS;
	return SK_PASS;
}

/* Attached to both SOCKHASHes: a socket's family names its peer's map. */
SEC("sk_msg")
int onc_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	struct bp_key key = {}, peer = {};
	struct bp_key6 key6 = {}, peer6 = {};

	if (!sk)
		return SK_PASS;
	switch (bp_key_of(msg, &key, &key6)) {
	case BP_KEY4:
		bp_peer_of(&key, &peer);
		return bp_send(msg, sk, &onc_bp_sock, &key, &peer, 1);
	case BP_KEY6:
		bp_peer_of(&key6, &peer6);
		return bp_send(msg, sk, &onc_bp_sock6, &key6, &peer6, 4);
	}
	return SK_PASS;
}
