#!/usr/bin/env bash
# The light client's own test (clients/python, memstream-client), in a venv that has only it:
#   1. `pip install ./clients/python` into a fresh venv pulls at most 10 packages in all
#      (every package `pip list` shows but pip/setuptools/wheel, the client itself included);
#   2. there, the client imports without aiokafka and no part of the server is importable;
#   3. with the kafka extra (aiokafka, cryptography: Kafka writes and memstream.consumer)
#      added, the count is reported, memstream.consumer imports without the server, and with
#      pytest added, clients/python/tests pass (the consumer's unit tests among them).
# The venv is kept (MEMSTREAM_CLIENT_VENV, default ~/.cache/memstream/client-venv) and made
# again from scratch whenever clients/python or VERSION changes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
venv=${MEMSTREAM_CLIENT_VENV:-$HOME/.cache/memstream/client-venv}
max_packages=10
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stamp=$( (cat VERSION; find clients/python -type f -not -path '*/__pycache__/*' \
  -not -path '*/build/*' -not -path '*.egg-info/*' -print0 | sort -z | xargs -0 cat) \
  | sha256sum | cut -d' ' -f1)
if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$stamp" ]; then
  echo "client venv up to date: $venv" >&2
else
  echo "making the client's venv from scratch: $venv ..." >&2
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # built from a copy: the source folder stays clean (no build/, no egg-info)
  src=$work
  cp -rL clients/python "$src/python"
  rm -rf "$src/python/build" "$src/python"/*.egg-info  # a build left in the checkout is stale
  "$venv/bin/python" -m pip install -q "$src/python"
  mapfile -t pulled < <("$venv/bin/python" -m pip list --format=freeze \
    | grep -viE '^(pip|setuptools|wheel)==')
  echo "pip install ./clients/python pulled ${#pulled[@]} packages: ${pulled[*]}" >&2
  if [ "${#pulled[@]}" -gt "$max_packages" ]; then
    echo "the client pulls more than $max_packages packages" >&2
    exit 1
  fi
  # the base install: the client works without the kafka extra, the server is not there
  (cd "$src" && "$venv/bin/python" - <<'EOF'
import importlib.util
import sys

import memstream.client
import memstream.contract.http_api.api  # noqa: F401

assert "aiokafka" not in sys.modules, "the base install imported aiokafka"
for extra in ("aiokafka", "cryptography"):
    assert importlib.util.find_spec(extra) is None, f"the base install pulled {extra}"
assert not hasattr(sys.modules["memstream"], "__file__") or \
    sys.modules["memstream"].__file__ is None, "memstream must be a namespace package here"
for server in ("memstream.web", "memstream.core", "memstream.topics", "memstream.worker"):
    assert importlib.util.find_spec(server) is None, f"{server} is importable"
try:
    import memstream.web  # noqa: F401
except ImportError:
    pass
else:
    raise AssertionError("import memstream.web succeeded in the client's venv")
print(f"memstream-client {memstream.client.__version__}: no server importable")
EOF
  )
  "$venv/bin/python" -m pip install -q "$src/python[kafka]"
  mapfile -t pulled < <("$venv/bin/python" -m pip list --format=freeze \
    | grep -viE '^(pip|setuptools|wheel)==')
  echo "pip install './clients/python[kafka]' pulled ${#pulled[@]} packages: ${pulled[*]}" >&2
  (cd "$src" && "$venv/bin/python" - <<'EOF'
import importlib.util

import memstream.consumer

for server in ("memstream.core", "memstream.topics", "memstream.memory", "memstream.web"):
    assert importlib.util.find_spec(server) is None, f"{server} is importable"
print(f"memstream.consumer ({len(memstream.consumer.__all__)} names): no server importable")
EOF
  )
  "$venv/bin/python" -m pip install -q pytest pytest-asyncio
  echo "$stamp" >"$venv/.stamp"
fi
# from outside the repository: only the installed client is importable
cd "$work"
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/clients/python" \
  -c "$root/clients/python/pyproject.toml" "$root/clients/python/tests"
