"""The knowledge-update run's delivery order (dev/updates_run.py): sessions in
rounds, each user's order kept (the run itself: benchmarks/updates.py --smoke)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.dev.updates_run import rounds
from memstream.dev.updates_stories import load
from memstream.topics.schemas import ChatMessage, SessionEvent

pytestmark = pytest.mark.unit
SHIPPED = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "updates_stories.json"


def test_round_n_is_every_storys_nth_session_users_interleaved_ends_last():
    stories = load(SHIPPED, ["en-res-porto", "en-tool-notes", "zh-res-hangzhou"])
    found = rounds(stories, "t")
    assert len(found) == max(len(s.sessions) for s in stories) == 7  # the chain's
    said, ends = found[0]
    assert [e.user_id for e in said[:3]] == ["en-res-porto", "en-tool-notes",
                                             "zh-res-hangzhou"]  # round robin
    assert {e.session_id for e in said} == {"s0-state"}
    assert [e.user_id for e in ends] == ["en-res-porto", "en-tool-notes", "zh-res-hangzhou"]
    assert {e.user_id for e in found[5][0]} == {"en-tool-notes"}
    for said, ends in found:
        assert all(isinstance(e, ChatMessage) for e in said)
        assert all(isinstance(e, SessionEvent) for e in ends)
        for user in {e.user_id for e in said}:  # each user's messages in order
            mine = [e.ts for e in said if e.user_id == user]
            assert mine == sorted(mine)
            (end,) = [e for e in ends if e.user_id == user]
            assert end.ts > mine[-1]
    assert sum(len(a) + len(b) for a, b in found) == sum(
        len(x.turns) + 1 for s in stories for x in s.sessions)
