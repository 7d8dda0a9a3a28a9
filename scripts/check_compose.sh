#!/usr/bin/env bash
# Checks docker-compose.yml (or the files given) as `docker compose config -q` would, where
# no compose client runs: scripts/compose_check is a small Go program on the compose-spec
# loader that command is built on (interpolation, anchors and merges, the Compose
# Specification's JSON schema and its rules). Built once (Go, ~20 s, its modules from the
# Go module proxy) and kept in ~/.cache/memstream/bin, one binary per source version.
#   scripts/check_compose.sh [--build] [COMPOSE_FILE...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/scripts/compose_check"
build_only=0
if [ "${1:-}" = "--build" ]; then build_only=1; shift; fi

digest=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)
bin="$HOME/.cache/memstream/bin/compose_check-$digest"
if [ ! -x "$bin" ]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  [ -x "$go" ] || { echo "check_compose: needs Go (1.22+) to build $src" >&2; exit 2; }
  echo "building the compose checker once (kept in $bin) ..." >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$src" && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" "$go" build -trimpath \
     -o "$bin.tmp" .) && mv "$bin.tmp" "$bin"
fi
[ "$build_only" = 1 ] && exit 0
[ "$#" -gt 0 ] || set -- "$root/docker-compose.yml"
# The secrets the file requires (${VAR:?...}): placeholders, never the caller's values.
env MEMSTREAM_ADMIN_KEY=check MEMSTREAM_METRICS_KEY=check MEMSTREAM_CLUSTER_SECRET=check \
  "$bin" "$@"
