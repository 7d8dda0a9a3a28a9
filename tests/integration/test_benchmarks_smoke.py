"""The benchmarks that need a broker, each at its smoke size against the test broker
(benchmarks/run_all.py's registry): each must finish and print its JSON line with its
keys. Renaming an attribute a benchmark uses fails here, not in a user's hands. They run
three at a time (much of a smoke run is waiting for a worker or the broker), once per
module; each test checks one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from benchmarks.run_all import BENCHMARKS, run_one
from tests.unit.project.test_benchmarks_smoke import check

pytestmark = pytest.mark.integration
WITH_BROKER = [b for b in BENCHMARKS if b.broker]
AT_ONCE = 3


@pytest.fixture(scope="module")
def results(kafka_bootstrap: str) -> dict[str, dict[str, Any]]:
    def run(bench: Any) -> dict[str, Any]:
        command = bench.command(smoke=True, bootstrap=kafka_bootstrap)
        assert command is not None
        # more time than alone: two others run beside it
        return run_one(bench, command, 2 * bench.timeout_s)

    slowest_first = sorted(WITH_BROKER, key=lambda b: -b.timeout_s)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return dict(zip([b.name for b in slowest_first], pool.map(run, slowest_first),
                        strict=True))


@pytest.mark.parametrize("bench", WITH_BROKER, ids=[b.name for b in WITH_BROKER])
def test_a_benchmark_with_a_broker_runs_at_its_smoke_size(bench, results):
    check(bench, results[bench.name])
