#!/usr/bin/env bash
# Builds the OpenTelemetry Collector of the flow export's lab test
# (e2e/otelcol: the OTLP receiver and the file exporter, every collector
# module at one release) through the Go module proxy into a cache that
# outlives clones (the Makefile keys DIR by the release and the module's
# files); skips it if already there.
# Usage: hack/otelcol-build.sh DIR (the binary is DIR/otelcol).
set -euo pipefail
out=$1
mod="$(cd "$(dirname "$0")/../e2e/otelcol" && pwd)"
[ -x "$out/otelcol" ] && exit 0
echo "building otelcol (cached in $out)"
mkdir -p "$out"
cd "$mod"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/otelcol.tmp" .
mv "$out/otelcol.tmp" "$out/otelcol"
