#!/usr/bin/env bash
# Debian packages the offline kind bed needs: a Docker engine (started by
# e2e/kind/dockerd.sh in its own network namespace, never as a host
# service), debootstrap for base images, and a static C compiler for pause.
set -euo pipefail
declare -A need=([dockerd]=docker.io [debootstrap]=debootstrap [musl-gcc]=musl-tools [jq]=jq)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep package scripts from starting dockerd or containerd on the host: a
# host dockerd rewrites iptables (FORWARD policy DROP) under everyone.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
