#!/usr/bin/env bash
# Installs the Debian packages ONC's lab and tests use, when missing.
# Needs root (the lab and the privileged tests do too).
set -euo pipefail

# command -> Debian package
declare -A need=(
  [protoc]=protobuf-compiler   # make generate / verify-generated
  [ip]=iproute2                # lab namespaces
  [iptables]=iptables          # agent masquerade rules
  [nft]=nftables               # NetworkPolicy rules (agent); kube-proxy's nftables mode (bench)
  [etcd]=etcd-server           # datastore tests against a separate etcd process
  [conntrack]=conntrack        # inspecting flows in the lab
  [clang]=clang                # eBPF programs (make generate)
  [llvm-strip]=llvm            # bpf2go strips the objects
  [bpftool]=bpftool            # inspecting loaded programs and maps
  [ethtool]=ethtool            # GRO on the lab's direct underlay
  [redis-server]=redis-server  # the bench's application rows (and TestBenchBed)
  [redis-benchmark]=redis-tools
  [gcc]=gcc                    # flanneld needs cgo (make flannel-bins)
  [promtool]=prometheus        # the metrics tests check every scrape (promtool check metrics)
)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -f /usr/include/stdio.h ] || missing+=(libc6-dev)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing packages: ${missing[*]}; run as root or: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts etcd, redis and prometheus as services on install; ONC's
# tests and bench start their own etcd and redis, and use only prometheus's
# promtool.
if command -v systemctl >/dev/null 2>&1; then
  for unit in etcd redis-server prometheus; do systemctl disable --now "$unit" >/dev/null 2>&1 || true; done
fi
