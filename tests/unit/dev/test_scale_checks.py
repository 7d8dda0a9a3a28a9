"""The scale benchmark's reading of the workers' logs (benchmarks/scale_checks.py): a
partition move is timed from the happening, and from the assignment that gave the
partition to its new owner (a SIGKILL's detection, the session timeout, left out)."""

from __future__ import annotations

import pytest

from benchmarks.scale_checks import Happening, LogLine, move_summary, move_times, takes

pytestmark = pytest.mark.unit


def line(at: float, text: str) -> LogLine:
    return LogLine(at, 1, "INFO", text)


def test_a_take_is_timed_from_the_assignment_that_gave_it_the_partition():
    lines = [
        line(100.0, "apply loop: partitions [0, 1] (new [0, 1], being taken [0, 1])"),
        line(101.0, "shard 0: restored, 10 change(s) folded in 0.90s"),
        line(130.0, "apply loop: partitions [0, 1, 2] (new [2], being taken [2])"),
        line(131.5, "shard 2: promoted, 3 change(s) folded in 0.40s"),
        line(132.0, "shard 1: caught up, 0 change(s) folded in 0.10s"),  # no new assignment
    ]
    found = takes("w1", lines)
    assert [(t.partition, t.kind, t.assigned_at) for t in found] == [
        (0, "restored", 100.0), (2, "promoted", 130.0), (1, "caught up", 100.0)]
    assert found[1].changes == 3 and found[1].seconds == 0.4


def test_move_rows_and_summary_count_both_times():
    lines = [line(130.0, "apply loop: partitions [2] (new [2], being taken [2])"),
             line(131.5, "shard 2: promoted, 3 change(s) folded in 0.40s")]
    h = Happening("sigkill", "w2", at=120.0)
    h.before = {2: "w2"}
    h.after = {2: "w1"}
    rows = move_times([h], takes("w1", lines))
    assert rows[0]["seconds"] == 11.5 and rows[0]["from_assignment_s"] == 1.5
    summary = move_summary(rows)
    assert summary["promoted"]["p50_s"] == 11.5
    assert summary["promoted"]["from_assignment_p50_s"] == 1.5
    assert summary["restored"]["from_assignment_p50_s"] is None
