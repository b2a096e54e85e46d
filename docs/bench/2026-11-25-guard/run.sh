#!/bin/bash
# The overlay guard's cost: the bench at 33b0a44 (OLD, a worktree of it
# built with make build) and at the guard's commit, interleaved before,
# after, before, after; 5 repetitions each. compare.py pools each version.
set -u
for round in 1 2; do
  for v in before after; do
    if [ $v = before ]; then b=OLD/bin; else b=bin; fi
    echo "== $(date -u +%T) round $round $v"
    $b/onc-bench --kube-bin $KUBE_BIN --netperf .tools/netperf/usr/bin --flannel= --tests TCP_RR,UDP_RR,TCP_STREAM       --services=false --intranode=false --redis-requests 0 --reps 5 --out bench-results/$v-$round > bench-results/$v-$round.log 2>&1 || echo "FAILED $v $round"
  done
done
echo "== $(date -u +%T) done"
