"""Suite-wide rules: every test is marked unit or integration, and where integration tests
are required (the README's test command sets MEMSTREAM_REQUIRE_INTEGRATION=1) a skipped or
missing integration test fails the run."""

from __future__ import annotations

import os

import pytest

LAST = "tests/integration/test_benchmarks_smoke.py"  # the busiest module: last in a run of
# one process. Under pytest-xdist (scripts/test.sh) the scheduler hands out the largest
# modules first whatever this order, so there it starts at once (measured no slower).


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [i.nodeid for i in items
                if not (i.get_closest_marker("unit") or i.get_closest_marker("integration"))]
    if unmarked:
        raise pytest.UsageError(f"tests without a unit/integration marker: {unmarked[:5]}")
    items.sort(key=lambda i: i.nodeid.startswith(LAST))  # stable: the rest keep their order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("MEMSTREAM_REQUIRE_INTEGRATION") != "1":
        return
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller
        return  # sees every worker's reports and judges the run
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = [r for r in reporter.stats.get("skipped", []) if "integration" in r.keywords]
    ran = [r for key in ("passed", "failed", "error")
           for r in reporter.stats.get(key, [])
           if getattr(r, "when", "call") == "call" and "integration" in r.keywords]
    if skipped or not ran:
        reporter.write_line(
            f"FAIL: integration tests required: {len(ran)} ran, {len(skipped)} skipped",
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
