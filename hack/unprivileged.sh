#!/usr/bin/env bash
# Runs a command in this tree (default: make unit) as an unprivileged user
# (ONC_USER, default oncdev, made with useradd if absent), to show the
# unit tier needs no root. Run it as root. The user gets its own Go build
# cache; its modules come from root's module cache, served read-only as a
# file proxy, so nothing is downloaded.
#   hack/unprivileged.sh                 # make unit
#   hack/unprivileged.sh go test ./cni/  # anything else
set -euo pipefail
cd "$(dirname "$0")/.."
user=${ONC_USER:-oncdev}
id -u "$user" >/dev/null 2>&1 || useradd -m "$user"
home=$(getent passwd "$user" | cut -d: -f6)
proxy=$home/goproxy
# The unprivileged user cannot read root's module cache: copy what it
# downloaded (the proxy layout), newer files only.
mkdir -p "$proxy"
cp -ru "$(go env GOMODCACHE)/cache/download/." "$proxy/"
chown -R "$user:" "$proxy"
[ $# -gt 0 ] || set -- make unit
# runuser keeps no root environment: pass what the build needs explicitly.
exec runuser -u "$user" -- env -i HOME="$home" PATH="$(dirname "$(go env GOROOT)/bin/go"):/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" \
	GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -modcacherw" GOPROXY="file://$proxy" GOSUMDB=off \
	"$@"
