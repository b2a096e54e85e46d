#!/usr/bin/env bash
# Sourced by .ci/run: puts a Go toolchain at least as new as go.mod's on
# PATH, fetching it from the Go module proxy if the machine has none.
want=$(awk '/^go /{print $2; exit}' go.mod)
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" = "$want" ]; then
  return 0 2>/dev/null || exit 0
fi
dir=/usr/local/onc-go/go$want
if [ ! -x "$dir/bin/go" ]; then
  echo "fetching Go $want from the module proxy"
  command -v curl >/dev/null && command -v unzip >/dev/null || { apt-get update -qq && apt-get install -y -qq curl unzip >/dev/null; }
  tmp=$(mktemp -d)
  curl -fsSL -o "$tmp/go.zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go$want.linux-amd64.zip"
  unzip -q "$tmp/go.zip" -d "$tmp"
  mkdir -p "$(dirname "$dir")"
  mv "$tmp/golang.org/toolchain@v0.0.1-go$want.linux-amd64" "$dir"
  chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
  rm -rf "$tmp"
fi
export PATH="$dir/bin:$PATH"
