/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The fast path (fastpath.c): its maps, keys, settings and counters, which
 * the overlay guard (overlay.h) shares.
 *
 * Every map is pinned by name under the agent's bpffs directory, so an
 * agent restart reuses them without dropping a packet.
 */
#ifndef __ONC_FASTPATH_H
#define __ONC_FASTPATH_H

#include <linux/in6.h>
#include <linux/pkt_cls.h>
#include "common.h"
#include "flow_cache.h"

/* The ECN field of the IP TOS byte; CE is both bits set. */
#define ONC_ECN_MASK 3
#define ONC_ECN_ECT0 2

/* Outer Ethernet + IPv4 + UDP + VXLAN, then the inner Ethernet header. */
#define ONC_ENCAP_LEN 50
#define ONC_HDR_LEN (ONC_ENCAP_LEN + 14)

/* Remote pod -> the node it was last seen behind. */
struct egress_val {
	__be32 node_ip;
};

/* Remote node -> the headers the kernel put on packets to it. */
struct encap_val {
	__u8 hdr[ONC_HDR_LEN];
	__u32 ifindex; /* the uplink they left by */
};

/* Pod CIDR of a peer that runs the fast path -> that peer's node IP. */
struct cidr_key {
	__u32 prefixlen;
	__be32 addr;
};

struct cidr_val {
	__be32 node_ip;
};

/* An IPv6 pod CIDR of a peer that runs the fast path (onc_peers6); the
 * value is its node's IPv4 tunnel endpoint. */
struct cidr6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/*
 * This node's settings, fixed while an agent runs: the agent sets them in
 * the object before loading it (datapath/fastpath), so no packet looks
 * them up in a map. Programs are loaded afresh by each agent (only maps
 * and links are pinned), so a restart with other settings takes them.
 */
volatile const __u32 onc_vni = 0;           /* host order */
volatile const __be16 onc_vxlan_port = 0;
volatile const __be32 onc_node_ip = 0;      /* this node's IPv4 tunnel endpoint (0: none) */
volatile const __be32 onc_pod_net = 0;      /* this node's pod CIDR: with the node itself, the only */
volatile const __be32 onc_pod_mask = 0;     /* inner destinations of frames from peers (the guard) */
/* This node's IPv6 pod CIDR, the only inner destination of IPv6 frames
 * from peers; an all-zero mask when the node has none (the agent refuses
 * a /0, which would look the same). */
volatile const __be32 onc_pod6_net[4] = {};
volatile const __be32 onc_pod6_mask[4] = {};

/* Which connections may open on the fast path (flow_setup): none, those of
 * pods onc_open (onc_open6 for IPv6 addresses) says are open, or every
 * local pod's (no NetworkPolicy runs on this node); set by the agent
 * before loading. */
#define CONN_SETUP_OFF 0
#define CONN_SETUP_OPEN_PODS 1
#define CONN_SETUP_EVERY_POD 2
volatile const __u8 onc_conn_setup = CONN_SETUP_OFF;

/* Whether this kernel's bpf_skb_adjust_room sets an IPv6 skb protocol on
 * decapsulation (Linux 6.3, probed by the agent): then a peer's IPv6
 * packet goes straight into the pod; else through the pod's veth, whose
 * crossing sets it. */
volatile const __u8 onc_decap_ipv6 = 0;

/*
 * Linux 6.3's flag for a decapsulation that leaves an IPv6 packet where
 * the outer header was IPv4: it sets the skb's protocol, which nothing
 * downstream recomputes (bpf_redirect_peer hands the packet to the pod
 * as it is, bpf_redirect_neigh looks the next hop up by it). The build's
 * UAPI headers may predate it; older kernels refuse it (onc_decap_ipv6).
 */
#define ONC_ADJ_ROOM_DECAP_L3_IPV6 (1ULL << 8)

/* Counters (per CPU); onctl stats decodes them by these names. */
enum onc_stat {
	STAT_EGRESS_HIT,
	STAT_EGRESS_MISS_NOT_IP,      /* not IPv4 TCP/UDP, or fragment */
	STAT_EGRESS_MISS_TCP_FLAGS,   /* SYN, FIN or RST that conntrack must see (flow_setup) */
	STAT_EGRESS_MISS_DISABLED,
	STAT_EGRESS_MISS_SPOOF,       /* source is not the pod behind this veth */
	STAT_EGRESS_MISS_HOST,        /* to a node's own address */
	STAT_EGRESS_MISS_NO_PEER,     /* destination not in a fast-path peer's CIDR */
	STAT_EGRESS_MISS_FLOW,        /* flow not established both ways (or old epoch) */
	STAT_EGRESS_MISS_DEST,        /* no learned node for the destination, or a stale one */
	STAT_EGRESS_MISS_ENCAP,       /* no learned header for the node */
	STAT_EGRESS_MISS_TTL,
	STAT_EGRESS_ERROR,
	STAT_INGRESS_HIT,
	STAT_INGRESS_MISS_NOT_VXLAN,
	STAT_INGRESS_MISS_TCP_FLAGS,
	STAT_INGRESS_MISS_DISABLED,
	STAT_INGRESS_MISS_HOST,       /* from a node's own address */
	STAT_INGRESS_MISS_NO_PEER,    /* inner source not a fast-path peer's, or from another node */
	STAT_INGRESS_MISS_NO_POD,     /* inner destination not a local pod */
	STAT_INGRESS_MISS_FLOW,
	STAT_INGRESS_MISS_TTL,
	STAT_INGRESS_ERROR,
	STAT_LEARN_EGRESS,            /* a marked packet taught the cache something */
	STAT_LEARN_INGRESS,
	STAT_LEARN_PAUSED,
	STAT_LEARN_KNOWN,             /* a marked packet of a flow already learned: nothing written */
	/* The overlay guard's drops (overlay.h), fast path on or off. */
	STAT_OVERLAY_DROP_UNKNOWN_SENDER, /* outer source not a peer's tunnel endpoint */
	STAT_OVERLAY_DROP_INNER_SOURCE,   /* inner source the sending peer may not speak for */
	STAT_OVERLAY_DROP_INNER_DESTINATION, /* inner destination neither in this node's pod CIDRs nor the node */
	STAT_OVERLAY_DROP_MALFORMED,      /* fragment, options, VLAN tag, other VNI or destination, inner not IP */
	STAT_OVERLAY_DROP_FROM_POD,       /* a pod sent to the VXLAN port */
	STAT_EGRESS_OPEN,             /* a SYN that opened its connection on the fast path */
	STAT_INGRESS_OPEN,
	STAT_INGRESS_MISS_REPLY,      /* a SYN not opened: no learned header back to the client's node */
	STAT_MAX,
	/* IPv6 packets count in onc_stats6 (the same counters): egress
	 * not_ip there is an IPv6 packet not TCP or UDP right after the fixed
	 * header (ICMPv6, extension headers, fragments). The overlay guard's
	 * drops count in onc_stats. */
};

/*
 * Per-node maps are sized for ONC_MAX_NODES nodes: one encap header and one
 * peer CIDR per remote node, and a host address per node (onc_hosts has
 * room for two: it held gateways too, and keeps its layout so that an
 * upgrade adopts it). A cluster beyond it fails loudly in the agent's peer
 * sync.
 */
#define ONC_MAX_NODES 16384

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __be32);
	__type(value, struct egress_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_egress SEC(".maps");

/* Remote IPv6 pod -> the node it was last seen behind. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct onc_in6);
	__type(value, struct egress_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_egress6 SEC(".maps");

/* One header per node, whichever family its inner packets are: the inner
 * Ethernet header's type is stored as IPv4's and set per packet. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ONC_MAX_NODES);
	__type(key, __be32);
	__type(value, struct encap_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_encap SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, ONC_MAX_NODES);
	__type(key, struct cidr_key);
	__type(value, struct cidr_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, ONC_MAX_NODES);
	__type(key, struct cidr6_key);
	__type(value, struct cidr_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_peers6 SEC(".maps");

/* Nodes' own addresses: traffic to them takes the slow path. (A peer's
 * gateway address is not one: see datapath/peers.go.) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * ONC_MAX_NODES);
	__type(key, __be32);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_hosts SEC(".maps");

/*
 * Who may send on the overlay: a peer's tunnel endpoint followed by an
 * IPv4 inner source prefix it may speak for (its pod CIDR, its node
 * address), looked up longest-prefix with the frame's outer and inner
 * sources. Each peer also has an entry of its endpoint alone (prefixlen
 * 32, may_send 0), so a miss tells an unknown sender from a known one
 * speaking for others.
 */
struct sender_key {
	__u32 prefixlen; /* 32 + the inner prefix's length */
	__be32 peer;     /* outer source: the peer's tunnel endpoint */
	__be32 inner;    /* inner source prefix */
};

struct sender_val {
	__u8 may_send;
};

#define ONC_SENDERS_PER_NODE 3

/* A sender map: every one is an LPM trie of the same size, keyed by one
 * of the key layouts (outer endpoint family × inner source family). */
#define ONC_SENDER_MAP(name, key_type)                                     \
	struct {                                                           \
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);                       \
		__uint(max_entries, ONC_SENDERS_PER_NODE * ONC_MAX_NODES); \
		__type(key, key_type);                                     \
		__type(value, struct sender_val);                          \
		__uint(map_flags, BPF_F_NO_PREALLOC);                      \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                       \
	} name SEC(".maps")

ONC_SENDER_MAP(onc_senders, struct sender_key);

/*
 * The same for IPv6 inner sources (the tunnel endpoint stays IPv4): each
 * peer's endpoint alone again (prefixlen 32, may_send 0), and its IPv6
 * pod CIDR (sized as onc_senders: room for a node's IPv6 address once
 * nodes have one). A map of its own rather than onc_senders with 16-byte inner
 * addresses: onc_senders is pinned, and a pinned map whose layout changed
 * makes an upgrade replace every map of the object (bpf.LoadPinned), the
 * flow cache and the connections the fast path opened with it. A new map
 * is simply created beside the adopted ones; the new programs run only
 * after the first peer sync filled both (datapath.Node.attachUplink).
 */
struct sender6_key {
	__u32 prefixlen; /* 32 + the inner prefix's length */
	__be32 peer;     /* outer source: the peer's tunnel endpoint */
	__u8 inner[16];  /* inner IPv6 source prefix */
};

ONC_SENDER_MAP(onc_senders6, struct sender6_key);

/*
 * Local pods no NetworkPolicy isolates, in either direction: a new
 * connection they make or take cannot be denied on this node, so its SYN
 * may take the fast path; and a packet of it that ever falls to the slow
 * path is picked up there (conntrack's loose tracking), where ONC's policy
 * table would drop it for an isolated pod. The policy datapath removes a
 * pod before the rules that isolate it take effect, and adds it only
 * after the ones that stop isolating it did.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __be32);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_open SEC(".maps");

/* The same for local pods' IPv6 addresses (a map of its own, added beside
 * the pinned ones, as onc_senders6 is). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct onc_in6);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_open6 SEC(".maps");

ONC_COUNTERS(onc_stats, onc_stat, STAT_MAX);
ONC_COUNTERS(onc_stats6, onc_stat, STAT_MAX);

/*
 * Where the fast path's programs pass on a packet that is none of theirs
 * but may be another feature's to send past the stack: a pod's packet to
 * no fast-path peer (HOOK_POD_TO_NO_PEER: a reply to a client outside)
 * and a peer's frame to no pod of this node (HOOK_OVERLAY_TO_NO_POD: a
 * backend's reply to a flow this node masqueraded). The uplink load
 * balancer fills both (datapath/services). An empty slot, and the packet
 * takes the slow path. Pinned, so that the slots outlive the agent that
 * filled them (an unpinned program array is emptied when its last process
 * exits): a connection the uplink opened on the fast path has no conntrack
 * entry, and a reply of it that took the slow path while agents change
 * would leave masqueraded. The earlier agent's programs, on the same
 * pinned maps, serve until the next one fills the slots or, with the
 * uplink load balancer off, empties them.
 */
enum onc_hook {
	HOOK_POD_TO_NO_PEER,
	HOOK_OVERLAY_TO_NO_POD,
	HOOK_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, HOOK_MAX);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} onc_hooks SEC(".maps");

static __always_inline int is_host(__be32 addr)
{
	return bpf_map_lookup_elem(&onc_hosts, &addr) != NULL;
}

static __always_inline struct cidr_val *peer_of(__be32 addr)
{
	struct cidr_key k = { .prefixlen = 32, .addr = addr };

	return bpf_map_lookup_elem(&onc_peers, &k);
}

static __always_inline struct cidr_val *peer6_of(const struct in6_addr *addr)
{
	struct cidr6_key k = { .prefixlen = 128 };

	__builtin_memcpy(k.addr, addr, sizeof(k.addr));
	return bpf_map_lookup_elem(&onc_peers6, &k);
}

#endif /* __ONC_FASTPATH_H */
