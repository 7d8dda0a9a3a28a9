#!/usr/bin/env bash
# Strimzi's resource schemas for the Strimzi manifest's test (tests/unit/deploy): the npm
# package @kubernetes-models/strimzi-kafka-operator (MIT; ajv validators compiled from
# Strimzi's CRDs), installed once with `npm ci` from scripts/strimzi_schemas/package-lock.json
# into ~/.cache/memstream, as scripts/helm.sh keeps Helm; offline from then on. Needs
# Node.js >= 20 and npm.
#   scripts/strimzi_schemas.sh          check the JSON array of resources on stdin
#                                       (scripts/strimzi_schemas/validate.mjs: one line per
#                                       problem; exit 1 on a problem, 2 on a kind it lacks)
#   scripts/strimzi_schemas.sh --path   install if missing, print the node_modules folder
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)/strimzi_schemas"
version=1.0.1  # as pinned in scripts/strimzi_schemas/package.json
cache="${MEMSTREAM_CACHE:-$HOME/.cache/memstream}"
dest="$cache/strimzi-models-$version"

# Made in a scratch folder and moved in place: one cut short leaves nothing behind.
if [ ! -f "$dest/node_modules/@kubernetes-models/strimzi-kafka-operator/package.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "scripts/strimzi_schemas.sh needs Node.js >= 20 and npm (Debian: apt-get install" \
         "nodejs npm)" >&2
    exit 1
  fi
  echo "installing Strimzi's schemas (@kubernetes-models/strimzi-kafka-operator@$version," \
       "kept in $dest) ..." >&2
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/strimzi-models.XXXXXX")
  cp "$here/package.json" "$here/package-lock.json" "$tmp/"
  # the package asks for Node >= 22 (engines); its validators run on 20: not refused
  if ! (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
          --engine-strict=false >&2); then
    rm -rf "$tmp"
    exit 1
  fi
  rm -rf "$dest"
  mv "$tmp" "$dest"
fi

if [ "${1:-}" = --path ]; then
  echo "$dest/node_modules"
  exit 0
fi
exec node "$here/validate.mjs" "$dest/node_modules"
