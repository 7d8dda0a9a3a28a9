#!/usr/bin/env bash
# Helm and the prometheus-operator CRDs for the chart's test (tests/unit/deploy), each taken
# once from the Go module proxy into ~/.cache/memstream, as scripts/bootstrap.sh keeps
# llama.cpp's wheel. Needs Go >= 1.25 (on PATH or in /usr/local/go/bin); Helm's first build
# takes a few minutes on 2 cores.
#   scripts/helm.sh ARGS...   helm ARGS... (built from helm.sh/helm/v4 if missing)
#   scripts/helm.sh --path    build Helm if missing, print its path
#   scripts/helm.sh --crds    fetch the CRDs if missing (the example/prometheus-operator-crd
#                             folder of github.com/prometheus-operator/prometheus-operator's
#                             module), print their folder
set -euo pipefail

helm_version=v4.3.2
crds_version=v0.85.0  # the module proxy serves this version of the operator's root module
cache="${MEMSTREAM_CACHE:-$HOME/.cache/memstream}"
helm="$cache/helm-$helm_version/helm"
crds="$cache/prometheus-operator-crds-$crds_version"

go_tool() {
  local go
  go=$(command -v go || true)
  [ -n "$go" ] || go=/usr/local/go/bin/go
  if [ ! -x "$go" ]; then
    echo "scripts/helm.sh needs Go (https://go.dev/dl/): none on PATH or in /usr/local/go" >&2
    exit 1
  fi
  echo "$go"
}

# Each is made in a scratch folder and moved in place: one cut short leaves nothing behind.
if [ "${1:-}" = --crds ]; then
  if [ ! -d "$crds" ]; then
    go=$(go_tool)
    echo "fetching the prometheus-operator CRDs $crds_version (kept in $crds) ..." >&2
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/crds.XXXXXX")
    module=github.com/prometheus-operator/prometheus-operator@$crds_version
    dir=$(cd "$tmp" && "$go" mod download -json "$module" \
          | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
    if [ -z "$dir" ] || [ ! -d "$dir/example/prometheus-operator-crd" ]; then
      rm -rf "$tmp"
      echo "go mod download $module gave no example/prometheus-operator-crd" >&2
      exit 1
    fi
    cp "$dir"/example/prometheus-operator-crd/*.yaml "$tmp/"
    chmod -R u+w "$tmp"
    mv "$tmp" "$crds"
  fi
  echo "$crds"
  exit 0
fi

if [ ! -x "$helm" ]; then
  go=$(go_tool)
  echo "building Helm $helm_version once from helm.sh/helm/v4 (a few minutes; kept in" \
       "$(dirname "$helm")) ..." >&2
  mkdir -p "$(dirname "$helm")"
  tmp=$(mktemp -d "$(dirname "$helm")/build.XXXXXX")
  if ! GOBIN="$tmp" GOFLAGS="${GOFLAGS:-} -trimpath" \
       "$go" install "helm.sh/helm/v4/cmd/helm@$helm_version"; then
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/helm" "$helm"
  rm -rf "$tmp"
fi

if [ "${1:-}" = --path ]; then
  echo "$helm"
  exit 0
fi
exec "$helm" "$@"
