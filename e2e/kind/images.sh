#!/usr/bin/env bash
# The offline path of the kind bed: builds every image kind, kubeadm and the
# sig-network tests need from Debian's packages and the Go module proxy, as
# this machine has no registry. Users with a registry skip all of it.
# Everything is cached in $CACHE; images are made in the bed's dockerd
# (e2e/kind/dockerd.sh) and skipped when they exist.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CACHE=${CACHE:-/var/cache/onc/kind}
KUBE_BIN=${KUBE_BIN:?KUBE_BIN: directory of kubelet, kubeadm, ... (make kube-bins)}
KUBE_VERSION=${KUBE_VERSION:?}
NODE_IMAGE=${NODE_IMAGE:-onc-kind/node:$KUBE_VERSION}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KIND_VERSION=${KIND_VERSION:?}
ETCD_VERSION=3.6.6
COREDNS_VERSION=1.13.1
PAUSE_VERSION=3.10.1
export DOCKER_HOST=unix:///run/onc-kind/docker.sock DOCKER_BUILDKIT=0
docker() { ip netns exec onc-kind docker "$@"; }
have() { docker image inspect "$1" >/dev/null 2>&1; }
log() { echo "== $*"; }

# Debian root filesystems, made once.
rootfs() { # name packages...
  local dir=$CACHE/rootfs-$1; shift
  [ -d "$dir" ] && return 0
  log "debootstrap $dir"
  rm -rf "$dir.tmp"
  debootstrap --variant=minbase --include="$(IFS=,; echo "$*")" bookworm "$dir.tmp" "$MIRROR" >"$dir.log" 2>&1 \
    || { tail -20 "$dir.log"; exit 1; }
  rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb
  mv "$dir.tmp" "$dir"
}
rootfs base ca-certificates iptables nftables conntrack ipset iproute2 iputils-ping curl wget netcat-openbsd \
  dnsutils procps busybox nginx-light kmod
rootfs node systemd systemd-sysv dbus conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2 \
  pigz bash ca-certificates curl jq procps containerd runc containernetworking-plugins socat ebtables

# Go-built binaries the component images carry.
GOBIN_DIR=$CACHE/gobin
mkdir -p "$GOBIN_DIR"
[ -x "$GOBIN_DIR/coredns" ] || { log "building coredns"; GOBIN=$GOBIN_DIR CGO_ENABLED=0 go install "github.com/coredns/coredns@v$COREDNS_VERSION"; }
[ -x "$GOBIN_DIR/etcd" ] || {
  # etcd's go.mod has replace directives, so `go install pkg@version`
  # refuses it: build it as a dependency of a throwaway module.
  log "building etcd"
  m=$(mktemp -d)
  (cd "$m" && go mod init etcd-build >/dev/null 2>&1 && go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >/dev/null 2>&1 \
    && CGO_ENABLED=0 go build -o "$GOBIN_DIR/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$m"
}
[ -x "$GOBIN_DIR/pause" ] || { log "building pause"; musl-gcc -static -Os -o "$GOBIN_DIR/pause" "$here/pause.c"; }

# The base image: Debian with the network tools the tests exec in pods.
if ! have onc-kind/base:bookworm; then
  log "importing onc-kind/base:bookworm"
  tar -C "$CACHE/rootfs-base" -c . | docker import - onc-kind/base:bookworm >/dev/null
fi

# One image from the base plus one file: name file dest [entrypoint]
img() {
  local name=$1 bin=$2 dest=$3 entry=${4:-}
  have "$name" && return 0
  log "image $name"
  local ctx; ctx=$(mktemp -d)
  cp "$bin" "$ctx/bin"
  {
    echo "FROM onc-kind/base:bookworm"
    echo "COPY bin $dest"
    [ -n "$entry" ] && echo "ENTRYPOINT [\"$entry\"]"
    true
  } > "$ctx/Dockerfile"
  (cd "$ctx" && tar -c .) | docker build -q -t "$name" - >/dev/null
  rm -rf "$ctx"
}
for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  img "registry.k8s.io/$c:$KUBE_VERSION" "$KUBE_BIN/$c" "/usr/local/bin/$c"
done
img "registry.k8s.io/etcd:$ETCD_VERSION-0" "$GOBIN_DIR/etcd" /usr/local/bin/etcd
img "registry.k8s.io/coredns/coredns:v$COREDNS_VERSION" "$GOBIN_DIR/coredns" /coredns /coredns
img "registry.k8s.io/pause:$PAUSE_VERSION" "$GOBIN_DIR/pause" /pause /pause
# agnhost as upstream's image has it: with no arguments it pauses (the
# host-exec pods rely on that), porter's TLS ports serve the certificate
# that ships beside its source, and /coredns is there (the DNS specs run
# their own server with it).
# Rebuilt when what it carries or this script changes (labelled with
# their digest).
agnhost_stamp=$(cat "$KUBE_BIN/agnhost" "$GOBIN_DIR/coredns" "$0" | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "onc.stamp"}}' registry.k8s.io/e2e-test-images/agnhost:2.59 2>/dev/null)" != "$agnhost_stamp" ]; then
  log "image registry.k8s.io/e2e-test-images/agnhost:2.59"
  ctx=$(mktemp -d)
  src=$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBE_VERSION/test/images/agnhost
  cp "$KUBE_BIN/agnhost" "$GOBIN_DIR/coredns" "$src/porter/localhost.crt" "$src/porter/localhost.key" "$ctx/"
  printf '%s\n' 'FROM onc-kind/base:bookworm' 'COPY agnhost coredns localhost.crt localhost.key /' 'RUN mkdir /uploads' \
    'ENTRYPOINT ["/agnhost"]' 'CMD ["pause"]' "LABEL onc.stamp=$agnhost_stamp" > "$ctx/Dockerfile"
  (cd "$ctx" && tar -c .) | docker build -q -t registry.k8s.io/e2e-test-images/agnhost:2.59 - >/dev/null
  rm -rf "$ctx"
fi
# The ClusterNetworkPolicy conformance suite (run.sh, CNP=1) asks for
# agnhost 2.45; what it runs (serve-hostname, netexec, connect, porter,
# bash) is in 2.59: the same image under that tag, moved when 2.59 is rebuilt.
agnhost=$(docker image inspect -f '{{.Id}}' registry.k8s.io/e2e-test-images/agnhost:2.59)
[ "$(docker image inspect -f '{{.Id}}' registry.k8s.io/e2e-test-images/agnhost:2.45 2>/dev/null)" = "$agnhost" ] ||
  docker tag registry.k8s.io/e2e-test-images/agnhost:2.59 registry.k8s.io/e2e-test-images/agnhost:2.45
# busybox, nginx, jessie-dnsutils and distroless-iptables: the Debian base
# already has what the tests run in them (sh, wget, nc, nslookup, dig,
# nginx, sleep, conntrack).
for t in e2e-test-images/busybox:1.36.1-1 e2e-test-images/busybox:1.37.0-1 e2e-test-images/jessie-dnsutils:1.7 \
  build-image/distroless-iptables:v0.8.9; do
  have "registry.k8s.io/$t" || docker tag onc-kind/base:bookworm "registry.k8s.io/$t"
done
img registry.k8s.io/e2e-test-images/regression-issue-74839:1.4 "$KUBE_BIN/regression-issue-74839" \
  /regression-issue-74839 /regression-issue-74839
for t in nginx:1.14-4 nginx:1.15-4; do
  if ! have "registry.k8s.io/e2e-test-images/$t"; then
    printf 'FROM onc-kind/base:bookworm\nCMD ["nginx", "-g", "daemon off;"]\n' | docker build -q -t "registry.k8s.io/e2e-test-images/$t" - >/dev/null
  fi
done
PRELOAD=(registry.k8s.io/kube-apiserver:$KUBE_VERSION registry.k8s.io/kube-controller-manager:$KUBE_VERSION
  registry.k8s.io/kube-scheduler:$KUBE_VERSION registry.k8s.io/kube-proxy:$KUBE_VERSION
  registry.k8s.io/etcd:$ETCD_VERSION-0 registry.k8s.io/coredns/coredns:v$COREDNS_VERSION registry.k8s.io/pause:$PAUSE_VERSION
  registry.k8s.io/e2e-test-images/agnhost:2.59 registry.k8s.io/e2e-test-images/agnhost:2.45
  registry.k8s.io/e2e-test-images/busybox:1.36.1-1
  registry.k8s.io/e2e-test-images/busybox:1.37.0-1 registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7
  registry.k8s.io/e2e-test-images/nginx:1.14-4 registry.k8s.io/e2e-test-images/nginx:1.15-4
  registry.k8s.io/build-image/distroless-iptables:v0.8.9 registry.k8s.io/e2e-test-images/regression-issue-74839:1.4)

# The kind node image: kind's base files on a Debian root with Debian's
# containerd 1.6 and runc, the Kubernetes binaries and every image above
# imported into containerd at first boot, before the kubelet starts.
# Rebuilt when a preloaded image or the node's files change.
stamp=$({ docker image inspect -f '{{.Id}}' "${PRELOAD[@]}"; cat "$here"/node/* "$0"; } | sha256sum | cut -c1-16)
[ "$(docker image inspect -f '{{index .Config.Labels "onc.stamp"}}' "$NODE_IMAGE" 2>/dev/null)" = "$stamp" ] && exit 0
log "node image $NODE_IMAGE"
kind_files=$(go env GOMODCACHE)/sigs.k8s.io/kind@$KIND_VERSION/images/base/files
[ -d "$kind_files" ] || (cd /tmp && go mod download "sigs.k8s.io/kind@$KIND_VERSION")
R=$(mktemp -d -p "$CACHE")
trap 'rm -rf "$R"' EXIT
cp -a "$CACHE/rootfs-node/." "$R/"
install -m 0755 "$kind_files"/usr/local/bin/* "$R/usr/local/bin/"
mkdir -p "$R/kind/bin" "$R/kind/images" "$R/etc/systemd/system/kubelet.service.d" "$R/etc/kubernetes/manifests" "$R/opt/cni/bin"
install -m 0755 "$kind_files"/kind/bin/* "$R/kind/bin/"
install -m 0644 "$kind_files"/etc/crictl.yaml "$R/etc/"
install -m 0644 "$kind_files"/etc/default/kubelet "$R/etc/default/"
install -m 0644 "$kind_files"/etc/sysctl.d/* "$R/etc/sysctl.d/"
for u in kubelet.service kubelet.slice undo-mount-hacks.service; do
  install -m 0644 "$kind_files/etc/systemd/system/$u" "$R/etc/systemd/system/"
done
install -m 0644 "$kind_files"/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"
for b in kubelet kubeadm kubectl; do install -m 0755 "$KUBE_BIN/$b" "$R/usr/bin/"; done
echo "$KUBE_VERSION" > "$R/kind/version"
for p in loopback portmap host-local bridge ptp; do cp "$R/usr/lib/cni/$p" "$R/opt/cni/bin/"; done
install -m 0644 "$here/node/containerd-config.toml" "$R/etc/containerd/config.toml"
chroot "$R" ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > "$R/etc/containerd/cri-base.json"
install -m 0644 "$here/node/onc-preload-images.service" "$R/etc/systemd/system/"
docker save "${PRELOAD[@]}" > "$R/kind/images/preload.tar"
# As kind's base image: no units but ours, no kernel log in the journal.
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
echo "ReadKMsg=no" >> "$R/etc/systemd/journald.conf"
chroot "$R" systemctl enable containerd.service kubelet.service undo-mount-hacks.service onc-preload-images.service >/dev/null 2>&1
chroot "$R" systemctl mask systemd-binfmt.service >/dev/null 2>&1
# docker 20.10's import takes no STOPSIGNAL: add it in a build step.
tar -C "$R" -c . | docker import - "$NODE_IMAGE-rootfs" >/dev/null
printf '%s\n' "FROM $NODE_IMAGE-rootfs" 'ENV container=docker' 'STOPSIGNAL SIGRTMIN+3' "LABEL onc.stamp=$stamp" \
  'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' | docker build -q -t "$NODE_IMAGE" - >/dev/null
docker rmi "$NODE_IMAGE-rootfs" >/dev/null
log "built $NODE_IMAGE"
