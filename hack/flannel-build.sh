#!/usr/bin/env bash
# Builds Flannel for the bench's comparison (make flannel-bins) from the Go
# module proxy into DIR: flanneld, and in DIR/cni the CNI plugins
# kube-flannel's pods are made with. Skips what is already there (delete
# DIR after changing a version below). Needs gcc and libc6-dev
# (make prereqs).
#  - flanneld v0.26.7 needs cgo (its udp backend has C); later releases
#    depend on modules the proxy does not serve.
#  - The flannel CNI plugin moved to flannel-io/cni-plugin, which the proxy
#    does not serve; its last release in containernetworking/plugins is
#    v0.9.1 (CNI spec up to 0.4.0). bridge and host-local are current.
set -euo pipefail
out=${1:-.tools/flannel}
flannel=v0.26.7 plugin=v0.9.1 plugins=v1.9.1
mkdir -p "$out/cni"
out=$(cd "$out" && pwd)
if [ ! -x "$out/flanneld" ]; then
  echo "building flanneld $flannel into $out"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  GOBIN=$tmp CGO_ENABLED=1 go install \
    -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel" "github.com/flannel-io/flannel@$flannel"
  mv "$tmp/flannel" "$out/flanneld"
fi
if [ ! -x "$out/cni/flannel" ]; then
  GOBIN=$out/cni CGO_ENABLED=0 go install "github.com/containernetworking/plugins/plugins/meta/flannel@$plugin"
fi
for p in main/bridge ipam/host-local; do
  [ -x "$out/cni/${p#*/}" ] && continue
  GOBIN=$out/cni CGO_ENABLED=0 go install "github.com/containernetworking/plugins/plugins/$p@$plugins"
done
