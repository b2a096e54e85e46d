#!/usr/bin/env bash
# Builds Kubernetes commands from source through the Go module proxy (this
# machine has no registry) into a cache that outlives clones, and skips the
# ones already there. Usage: hack/kube-build.sh DIR NAME...
# NAME is a cmd/ name (kube-apiserver, kubectl, ...), e2e.test, a
# test/images/ program (agnhost, regression-issue-74839) or ginkgo (the
# runner e2e.test's version of Ginkgo, for parallel runs).
set -euo pipefail
out=$1; shift
mod="$(cd "$(dirname "$0")/../e2e/kind/kube" && pwd)"
ver=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$mod/go.mod")
ldflags="-s -w"
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $v.gitVersion=$ver -X $v.gitMajor=1 -X $v.gitMinor=$(echo "$ver" | cut -d. -f2)"
  ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$out"
cd "$mod"
for name in "$@"; do
  [ -x "$out/$name" ] && continue
  echo "building $name $ver (cached in $out)"
  case $name in
    e2e.test) CGO_ENABLED=0 go test -c -mod=mod -ldflags "$ldflags" -o "$out/$name.tmp" k8s.io/kubernetes/test/e2e ;;
    agnhost | regression-issue-74839) CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$out/$name.tmp" "k8s.io/kubernetes/test/images/$name" ;;
    ginkgo) CGO_ENABLED=0 go build -mod=mod -o "$out/$name.tmp" github.com/onsi/ginkgo/v2/ginkgo ;;
    *) CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$out/$name.tmp" "k8s.io/kubernetes/cmd/$name" ;;
  esac
  mv "$out/$name.tmp" "$out/$name"
done
