"""A small chaos run (benchmarks/chaos.py) on the real broker: users with known ground truth
are produced at a steady rate while the worker is SIGKILLed a few times (while running,
during start-up, during recovery). Afterwards every user's live memories, read from the
worker's HTTP view and from the memory-change topic replayed into an empty store, must be
exactly the truth: nothing missing, no stale older value, no duplicate.

The shared test broker is never restarted here; the broker stop/start is the benchmark's
own (``benchmarks/chaos.py`` runs its own broker).
"""

from __future__ import annotations

import pytest

from benchmarks.chaos import bench_settings, check, run_chaos, scenario

pytestmark = pytest.mark.integration


def _clean(outcome) -> None:
    for report in (outcome.http, outcome.replayed):
        c = report.counts()
        assert (c["missing"], c["stale"], c["duplicate"]) == (0, 0, 0), (
            f"{report.view}: {c}; missing {report.missing[:5]}, stale {report.stale[:5]}, "
            f"duplicate {report.duplicate[:5]}; figures {outcome.figures}")


async def test_scenario_without_chaos_is_exactly_the_truth(kafka_bootstrap, tmp_path):
    events, truth = scenario(8, seed=5)
    some_user, t = next((u, t) for u, t in sorted(truth.items()) if t.old)
    old = sorted(t.old)[0]
    # The checker sees each kind of damage (so a clean result below means something).
    damaged = check(truth, {some_user: [*t.live, *t.live, old, "Lives in Atlantis"]})
    assert (len(damaged.missing), len(damaged.stale), damaged.counts()["duplicate"],
            len(damaged.unexpected)) == (sum(len(x.live) for x in truth.values()) - len(t.live),
                                         1, len(t.live), 1)

    outcome = await run_chaos(bench_settings(kafka_bootstrap, tmp_path), events, truth,
                              kills=0, work=tmp_path, rate=200.0, settle_timeout=300)
    assert outcome.figures["sessions_covered"] == outcome.figures["sessions"]
    _clean(outcome)
    assert outcome.figures["decisions_beyond_first_per_job_id"] == 0


async def test_memories_survive_worker_crashes(kafka_bootstrap, tmp_path):
    events, truth = scenario(30, seed=11)
    outcome = await run_chaos(bench_settings(kafka_bootstrap, tmp_path), events, truth,
                              kills=4, work=tmp_path, rate=100.0, seed=11, settle_timeout=600)
    f = outcome.figures
    assert f["kills_done"] == 4 and f["restart"]["restarts"] >= 4
    assert f["sessions_covered"] == f["sessions"], f
    _clean(outcome)
    assert f["replay_failed_changes"] == 0 and f["change_ids_differing_content"] == 0, f
    # downstream's public events: each change's, in the changelog's order per partition
    assert (f["events_missing"], f["events_unexpected"],
            f["event_partitions_out_of_order"]) == (0, 0, 0), f
