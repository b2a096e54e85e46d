#!/usr/bin/env bash
# Builds the ClusterNetworkPolicy conformance runner of the kind bed
# (e2e/kind/npa: the upstream suite of the network-policy-api release its
# go.mod pins) as a test binary, through the Go module proxy, into a cache
# that outlives clones (the Makefile keys DIR by the release and the
# module's files); skips it if already there.
# Usage: hack/npa-build.sh DIR (the binary is DIR/npa-conformance.test).
set -euo pipefail
out=$1
mod="$(cd "$(dirname "$0")/../e2e/kind/npa" && pwd)"
[ -x "$out/npa-conformance.test" ] && exit 0
echo "building the ClusterNetworkPolicy conformance runner (cached in $out)"
mkdir -p "$out"
cd "$mod"
CGO_ENABLED=0 go test -c -tags conformance -trimpath -o "$out/npa-conformance.test.tmp" .
mv "$out/npa-conformance.test.tmp" "$out/npa-conformance.test"
