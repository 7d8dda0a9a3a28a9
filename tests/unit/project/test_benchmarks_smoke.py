"""Benchmarks cannot rot (benchmarks/run_all.py's registry): those that need no broker run
here at their smoke size and must finish and print their JSON line with its keys (no
figure is asserted: a benchmark is not a timed test); the broker ones run in
tests/integration/test_benchmarks_smoke.py. Benchmarks import nothing from tests/."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks.run_all import (
    BENCHMARKS,
    ROOT,
    Bench,
    by_name,
    dig,
    last_json,
    markdown,
    merged,
    run_one,
)

pytestmark = pytest.mark.unit
LOCAL = [b for b in BENCHMARKS if not b.broker]


def check(bench: Bench, result: dict) -> None:
    assert result["exit"] == 0, (bench.name, result["stderr_tail"])
    found = result["json"]
    assert found is not None, f"{bench.name}: no JSON object on the last stdout line"
    missing = [k for k in bench.keys if dig(found, k) is None]
    assert not missing, f"{bench.name}: JSON without {missing}"


@pytest.mark.parametrize("bench", LOCAL, ids=[b.name for b in LOCAL])
def test_a_benchmark_without_a_broker_runs_at_its_smoke_size(bench):
    command = bench.command(smoke=True, bootstrap=None)
    assert command is not None
    check(bench, run_one(bench, command, bench.timeout_s))


def test_every_benchmark_script_is_registered_and_names_its_keys():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    # libraries and tools: chaos_loop.py runs chaos.py's CI scenario again and again,
    # read_serve.py is read_load.py's server process, archive_load.py retrieval.py's turns
    others = {"__init__", "changegen", "scale_checks", "run_all", "chaos_loop", "smoke",
              "read_serve", "archive_load"}
    assert scripts - others == {b.name for b in BENCHMARKS}
    assert all(b.keys for b in BENCHMARKS), [b.name for b in BENCHMARKS if not b.keys]


def test_benchmarks_import_nothing_from_the_tests():
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+tests\b", text, re.M), path.name


def test_the_last_stdout_line_is_the_json_object_or_nothing():
    assert last_json('table\n{"a": {"b": 1}}\n\n') == {"a": {"b": 1}}
    assert last_json('{"a": 1}\ntable after') is None
    assert last_json("[1, 2]") is None and last_json("") is None
    assert dig({"a": {"b": 1}}, "a.b") == 1 and dig({"a": 1}, "a.b") is None


def test_commands_take_the_broker_only_where_they_should(tmp_path: Path):
    (chaos,) = by_name(["chaos"])
    full = chaos.command(smoke=False, bootstrap="h:1")
    assert full is not None and "--bootstrap" not in full  # its own broker, restarted
    smoke = chaos.command(smoke=True, bootstrap="h:1")
    assert smoke is not None and smoke[-2:] == ["--bootstrap", "h:1"]
    (locomo,) = by_name(["locomo"])
    assert locomo.command(smoke=False, bootstrap=None) is None  # no data: skipped
    assert "--data" in (locomo.command(smoke=False, bootstrap=None,
                                       locomo_data=tmp_path / "x.json") or [])
    with pytest.raises(SystemExit):
        by_name(["nope"])


def test_a_benchmark_that_fails_is_reported_with_its_exit_and_stderr(tmp_path: Path):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('half a table')\nsys.exit('AttributeError: x')\n")
    result = run_one(Bench("broken"), [sys.executable, str(script)], 30.0)
    assert result["exit"] == 1 and result["json"] is None
    assert "AttributeError" in result["stderr_tail"]


def test_a_second_run_of_the_day_adds_to_its_file(tmp_path: Path):
    path = tmp_path / "2026-12-02.json"
    first = {"date": "2026-12-02", "smoke": False, "runs": [
        {"name": "ingest", "exit": 0}, {"name": "retrieval", "exit": 1}],
        "machine": {"cpus": 2, "python": "3.11", "commit": "a", "load_start": 1.0,
                    "load_end": 2.0}}
    path.write_text(json.dumps(first))
    second = {**first, "runs": [{"name": "retrieval", "exit": 0, "command": "r",
                                 "seconds": 1.0, "load_before": 1.0, "load_after": 1.0,
                                 "headline": {"target.p99_ms": 9.5}}]}
    both = merged(path, second)
    assert [(r["name"], r["exit"]) for r in both["runs"]] == [("ingest", 0), ("retrieval", 0)]
    assert merged(tmp_path / "none.json", second) == second
    table = markdown(second)
    assert "| retrieval | `r` | 1.0 | 1.0 / 1.0 | target.p99_ms: 9.5 |" in table
    assert "2 cores" in table
