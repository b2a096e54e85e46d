#!/usr/bin/env bash
# A Docker engine for the kind bed, isolated from the host: its own network
# namespace (Docker's iptables rules and bridges stay there), data root,
# socket and pid file. Usage: dockerd.sh start|stop.
# kind, docker and kubectl must run inside the namespace too:
#   ip netns exec onc-kind env DOCKER_HOST=unix:///run/onc-kind/docker.sock kind ...
set -euo pipefail
NS=onc-kind
RUN=/run/onc-kind
DATA=/var/lib/onc-kind/docker
SOCK=$RUN/docker.sock
here="$(cd "$(dirname "$0")" && pwd)"

start() {
  mkdir -p "$RUN" "$DATA"
  if [ -S "$SOCK" ] && DOCKER_HOST=unix://$SOCK ip netns exec $NS docker version >/dev/null 2>&1; then
    return 0
  fi
  ip netns list | grep -qw $NS || { ip netns add $NS; ip -n $NS link set lo up; }
  install -m 0755 "$here/runc-wrapper" "$RUN/runc-wrapper"
  # `ip netns exec` mounts a fresh /sys: attach the host's cgroup v1
  # hierarchies again (same options = same hierarchy) before dockerd starts.
  ip netns exec $NS /bin/sh -c '
    mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
    for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
      mkdir -p /sys/fs/cgroup/$c; mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
    done
    mkdir -p /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
    mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
    mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
    exec dockerd --data-root '"$DATA"' --exec-root '"$RUN"'/exec --pidfile '"$RUN"'/dockerd.pid \
      -H unix://'"$SOCK"' --add-runtime onc-runc='"$RUN"'/runc-wrapper --default-runtime onc-runc \
      --cgroup-parent onc-kind --storage-driver overlay2' > "$RUN/dockerd.log" 2>&1 &
  for _ in $(seq 100); do
    DOCKER_HOST=unix://$SOCK ip netns exec $NS docker version >/dev/null 2>&1 && return 0
    sleep 0.3
  done
  echo "dockerd did not start; log $RUN/dockerd.log:" >&2; tail -20 "$RUN/dockerd.log" >&2; exit 1
}

stop() {
  if [ -f "$RUN/dockerd.pid" ]; then
    pid=$(cat "$RUN/dockerd.pid")
    if [ "$(readlink /proc/"$pid"/exe 2>/dev/null)" = "$(command -v dockerd)" ]; then
      kill "$pid"; for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
  fi
  ip netns del $NS 2>/dev/null || true
}

"$@"
