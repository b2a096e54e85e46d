#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a fixed number of executions
# (FUZZ_EXECS, default 10000) and fails if any finds a crash or runs short.
# Targets are found with `go test -list`, so a new one is picked up by
# itself. A crash is written to the package's testdata/fuzz/<Target>/ (keep
# it: it is then a regression input). Fuzzing longer, one target:
#   go test -run '^$' -fuzz '^FuzzCNIRequest$' -fuzztime 5m ./agent
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
execs=${FUZZ_EXECS:-10000}

# The fuzzing cache (interesting inputs found on the way) and the targets'
# temporary files live here and go at the end, a crash's too.
work=$(mktemp -d "${TMPDIR:-/tmp}/onc-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work

# Packages with a fuzz target: a cheap grep, then go test -list decides.
pkgs=()
while read -r pkg dir; do
	if grep -qs '^func Fuzz' "$dir"/*_test.go; then
		pkgs+=("$pkg")
	fi
done < <("$GO" list -f '{{.ImportPath}} {{.Dir}}' ./...)

start=$SECONDS
failed=()
printf '%-22s %-40s %10s %8s\n' TARGET PACKAGE EXECS SECONDS
for pkg in "${pkgs[@]}"; do
	list=$("$GO" test -list '^Fuzz' "$pkg")
	for target in $(grep '^Fuzz' <<<"$list"); do
		log=$work/$target.log
		t0=$SECONDS
		status=ok
		"$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime="${execs}x" "$pkg" \
			-test.fuzzcachedir="$work/cache" >"$log" 2>&1 || status=failed
		# The coordinator's last status line has the total.
		n=$(grep -ao 'execs: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
		n=${n:-0}
		if [ "$status" = ok ] && [ "$n" -lt "$execs" ]; then
			status="ran only $n executions"
		fi
		printf '%-22s %-40s %10s %8s\n' "$target" "${pkg#github.com/onc-net/onc/}" "$n" "$((SECONDS - t0))"
		if [ "$status" != ok ]; then
			grep -av '^fuzz: elapsed' "$log" | tail -40 >&2
			failed+=("$target ($pkg): $status")
		fi
	done
done
echo "fuzzing took $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAIL: %s\n' "${failed[@]}" >&2
	exit 1
fi
