#!/usr/bin/env bash
# Puts netperf/netserver (Debian non-free) into .tools/netperf/ without
# changing the machine's apt sources: a private source list and state dir.
set -euo pipefail
dest=${1:-.tools/netperf}
[ -x "$dest/usr/bin/netperf" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free" > "$work/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work" -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" download netperf >/dev/null)
mkdir -p "$dest"
dpkg -x "$work"/netperf_*.deb "$dest"
echo "netperf installed in $dest"
