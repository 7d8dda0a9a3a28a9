"""The benchmarks that need a broker, each at its smoke size against the test broker
(benchmarks/run_all.py's registry): each must finish and print its JSON line with its
keys. Renaming an attribute a benchmark uses fails here, not in a user's hands. They run
three at a time (much of a smoke run is waiting for a worker or the broker), once per
module; each test checks one. chaos.py runs a second time on a 3-node cluster of its own
(``MEMSTREAM_TEST_CLUSTER_PORT``, default 19692: the cluster test's ports, after it): one
partition leader SIGKILLed and back after 1 s, the librdkafka producer placing records by
CRC-32, no worker kill (the first chaos smoke has it): ~55 s alone."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from benchmarks.run_all import BENCHMARKS, by_name, run_one
from tests.unit.project.test_benchmarks_smoke import check

pytestmark = pytest.mark.integration
CLUSTER_PORT = os.environ.get("MEMSTREAM_TEST_CLUSTER_PORT", "19692")
(_CHAOS,) = by_name(["chaos"])
CHAOS_CLUSTER = replace(
    _CHAOS, broker=False, timeout_s=300.0,
    smoke=("--smoke", "--brokers", "3", "--kill-leader", "1", "--leader-down", "1",
           "--kills", "0", "--producer", "librdkafka", "--port", CLUSTER_PORT),
    keys=(*_CHAOS.keys, "brokers", "leader_kills_done", "acked_lost", "acked_uncovered",
          "misplaced_acked", "misplaced_on_topics", "repartition_records"))
RUNS = {**{b.name: b for b in BENCHMARKS if b.broker},
        "chaos-3-brokers-librdkafka": CHAOS_CLUSTER}
AT_ONCE = 3


@pytest.fixture(scope="module")
def results(kafka_bootstrap: str) -> dict[str, dict[str, Any]]:
    def run(name: str) -> dict[str, Any]:
        bench = RUNS[name]
        command = bench.command(smoke=True, bootstrap=kafka_bootstrap)
        assert command is not None
        # more time than alone: two others run beside it
        return run_one(bench, command, 2 * bench.timeout_s)

    slowest_first = sorted(RUNS, key=lambda name: -RUNS[name].timeout_s)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return dict(zip(slowest_first, pool.map(run, slowest_first), strict=True))


@pytest.mark.parametrize("name", list(RUNS))
def test_a_benchmark_with_a_broker_runs_at_its_smoke_size(name, results):
    check(RUNS[name], results[name])
