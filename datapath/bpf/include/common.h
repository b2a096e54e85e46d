/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What every ONC object includes: the kernel's types, libbpf's helpers,
 * and the one way a feature keeps its counters.
 *
 * Each feature is one object (fastpath.c, services.c, bypass.c) whose
 * maps are pinned by name in the agent's bpffs directory, so a restarted
 * agent adopts them; the license is declared in each object's .c file.
 */
#ifndef __ONC_COMMON_H
#define __ONC_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ONC_AF_INET 2
#define ONC_AF_INET6 10

/*
 * A feature's counters: a per-CPU array of max entries keyed by its enum
 * of counters, so their names reach BTF and the agent reads them by name
 * (datapath/bpf/counters.go).
 */
#define ONC_COUNTERS(name, stat_enum, max)               \
	struct {                                         \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); \
		__uint(max_entries, max);                \
		__type(key, enum stat_enum);             \
		__type(value, __u64);                    \
		__uint(pinning, LIBBPF_PIN_BY_NAME);     \
	} name SEC(".maps")

/* count adds n to counter stat of a feature's counters. */
static __always_inline void count(void *counters, __u32 stat, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(counters, &stat);

	if (v)
		*v += n;
}

#endif /* __ONC_COMMON_H */
