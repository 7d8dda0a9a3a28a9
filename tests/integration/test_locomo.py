"""The LOCOMO harness end to end on a fixture of our own (tests/data/locomo_mini.json):
a real worker per trigger policy, the conversation produced with its own dates, every
question asked through the client; what the benchmark reports is what came back."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.core.settings import Settings
from memstream.dev import locomo
from memstream.dev.locomo_run import POLICIES, run_policy
from tests.integration.conftest import free_port

pytestmark = pytest.mark.integration
MINI = Path(__file__).resolve().parents[1] / "data" / "locomo_mini.json"


async def test_per_turn_and_shipped_policies_side_by_side(kafka_bootstrap, tmp_path):
    conversations = locomo.load(MINI)
    questions = len(conversations[0].qa)
    results = {}
    for name in ("per-turn", "shipped"):
        base = Settings(bootstrap_servers=kafka_bootstrap, web_port=free_port(),
                        partitions=2, embedder="hashing")
        results[name] = await run_policy(POLICIES[name], conversations, base,
                                         tmp_path / name, k=10, timeout=120.0,
                                         pace_s=0.3)  # a job ends before the next turn
    per_turn, shipped = results["per-turn"], results["shipped"]
    for r in (per_turn, shipped):
        assert r.messages == 24 and r.tally.asked["overall"] == questions
        assert r.memories and r.memories[0] >= 3  # Porto, Lisbon, Acme, ... (rules model)
        # "Where does Ben live?" finds the memory written from Ben's turn D1:2
        assert r.tally.hits10["single-hop"] >= 1, r.summary()
        assert len(r.search_ms) == 2 * questions and r.llm_calls == 0
    assert per_turn.jobs > shipped.jobs  # a job for (nearly) every message vs coalesced
    assert per_turn.summary()["lineage_turns_mean"] <= shipped.summary()["lineage_turns_mean"]
