#!/usr/bin/env bash
# The test command: install, start the real Kafka broker, run unit + integration tests
# (side by side), stop the broker. Fails if any integration test was skipped. With
# arguments: one pytest run of the given selection, e.g. ./scripts/test.sh tests/unit -x
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh --test  # the dev extras, chromium and llama.cpp too

port=${MEMSTREAM_TEST_KAFKA_PORT:-19092}
export MEMSTREAM_KAFKA_PORT=$port MEMSTREAM_KAFKA_CONTROLLER_PORT=$((port + 1))
started=0
if [ -z "${MEMSTREAM_TEST_BOOTSTRAP:-}" ]; then
  if ! .venv/bin/memstream broker status >/dev/null 2>&1; then
    .venv/bin/memstream broker start
    started=1
  fi
  export MEMSTREAM_TEST_BOOTSTRAP="127.0.0.1:${port}"
fi
stop_broker() {
  if [ "$started" = 1 ]; then
    MEMSTREAM_KAFKA_PORT=$port .venv/bin/memstream broker stop || true
  fi
}
trap stop_broker EXIT
# The test processes read only what they are told; keep broker settings out of them.
unset MEMSTREAM_KAFKA_PORT MEMSTREAM_KAFKA_CONTROLLER_PORT

export MEMSTREAM_REQUIRE_INTEGRATION=1
.venv/bin/ruff check .
.venv/bin/mypy memstream
.venv/bin/lint-imports --no-cache --no-logo  # the layer contracts of pyproject.toml
.venv/bin/python scripts/import_graph.py --check >/dev/null || {
  .venv/bin/python scripts/import_graph.py | tail -5; echo "import cycles (above)"; exit 1; }
./scripts/check_compose.sh  # docker-compose.yml, as `docker compose config -q` checks it
if [ "$#" -gt 0 ]; then  # a selection: one run
  .venv/bin/python -m pytest -m "unit or integration" "$@"
  exit
fi
./scripts/test_client.sh  # the light client alone, in a venv of its own (clients/python)
# The unit tests need no service and mostly compute; the integration tests mostly wait on
# the broker and their workers (barriers). Side by side they take ~the integration time
# alone. The unit run's report is printed after the integration run's.
unit_log=$(mktemp) unit_tmp=$(mktemp -d)
# its own session (setsid), so an interrupted run ends it with every process it started;
# bounded, so a hung unit test fails the run instead of hanging it; the tools bootstrap
# installed (Helm, the Strimzi schemas) must be there: their tests fail, never skip
MEMSTREAM_REQUIRE_INTEGRATION=0 MEMSTREAM_REQUIRE_TOOLS=1 setsid timeout -k 10 1500 .venv/bin/python -m pytest -m unit \
  -p no:cacheprovider --basetemp="$unit_tmp" >"$unit_log" 2>&1 &
unit_pid=$!
stop_units() {
  if [ -n "${unit_pid:-}" ]; then kill -- "-$unit_pid" 2>/dev/null || true; fi
  rm -rf "$unit_log" "$unit_tmp"
  stop_broker
}
trap stop_units EXIT
integration=0
# Two processes, a module to each at a time (--dist loadfile): a module's tests share its
# worker and event loop; the tests' ports come from a block per process (conftest.free_port).
.venv/bin/python -m pytest -m integration -n 2 --dist loadfile --durations=15 || integration=$?
unit=0
wait "$unit_pid" || unit=$?
unit_pid=
echo "=== unit tests (ran alongside) ==="
cat "$unit_log"
[ "$unit" = 124 ] && echo "unit tests: timed out after 1500 s"
echo "unit: exit $unit, integration: exit $integration"
[ "$unit" = 0 ] && [ "$integration" = 0 ]
