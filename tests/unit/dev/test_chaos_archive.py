"""The chaos benchmark's archive check (benchmarks/chaos.py): every non-trivial user or
assistant turn of the scenario archived by exactly one change id on the memory-change topic,
nothing else archived, and a store holding exactly those turns."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from benchmarks.chaos import (
    archive_consistent,
    check_archive,
    check_stored_turns,
    expected_turns,
    scenario,
)
from memstream.memory.archive import archive_changes
from memstream.topics.schemas import ChatMessage, ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit


def job_of(messages: list[ChatMessage], seq: int = 1, job_id: str = "j1") -> ExtractionJob:
    first = messages[0]
    return ExtractionJob(
        job_id=job_id, tenant_id=first.tenant_id, user_id=first.user_id,
        session_id=first.session_id, from_seq=0, to_seq=len(messages), seq=seq,
        reason=TriggerReason.SESSION_END, created_at=first.ts,
        messages=[JobMessage(seq=i, message_id=m.message_id, role=m.role, content=m.content,
                             ts=m.ts) for i, m in enumerate(messages)])


def changes_of(messages: list[ChatMessage], seq: int = 1, job_id: str = "j1") -> list:
    return archive_changes(job_of(messages, seq, job_id), lambda texts: [[1.0, 0.0]] * len(texts),
                           "test", datetime.now(UTC).timestamp())


@pytest.fixture
def session() -> list[ChatMessage]:
    events, _ = scenario(3, seed=4)
    first = next(e for e in events if isinstance(e, ChatMessage))
    return [e for e in events if isinstance(e, ChatMessage)
            and (e.user_id, e.session_id) == (first.user_id, first.session_id)]


def test_the_expected_turns_are_the_non_trivial_user_and_assistant_messages(session):
    wanted = expected_turns(session)
    assert wanted and len(wanted) < len(session)  # "Noted." and "ok" are trivial
    assert all(m.content not in ("Noted.", "ok", "thanks") for m in wanted.values())


def test_a_clean_archive_passes(session):
    changes = changes_of(session)
    report = check_archive(expected_turns(session), [*changes, *changes])  # re-published
    assert report.counts() == {"turns_expected": len(changes), "turns_archived": len(changes),
                               "archive_changes": len(changes), "missing": 0, "duplicate": 0,
                               "unexpected": 0, "mismatched": 0}
    stored = check_stored_turns(expected_turns(session), [c.records[0] for c in changes])
    assert (stored["missing"], stored["unexpected"], stored["users_count_off"]) == (0, 0, 0)
    assert archive_consistent({"archive": report.counts(), "archive_replay": stored})


def test_a_missing_turn_fails(session):
    changes = changes_of(session)
    report = check_archive(expected_turns(session), changes[1:])
    assert report.counts()["missing"] == 1 and report.missing[0][3] == changes[0].after[
        "message_id"]
    assert not archive_consistent({"archive": report.counts()})
    stored = check_stored_turns(expected_turns(session), [c.records[0] for c in changes[1:]])
    assert (stored["missing"], stored["users_count_off"]) == (1, 1)
    assert not archive_consistent({"archive_worker_store": stored})


def test_a_turn_archived_twice_fails(session):
    changes = changes_of(session)
    again = changes_of(session, seq=2, job_id="j2")  # the range decided again: new ids
    report = check_archive(expected_turns(session), [*changes, again[0]])
    assert report.counts()["duplicate"] == 1 and report.duplicate[0][1] == 2
    assert not archive_consistent({"archive": report.counts()})


def test_a_trivial_or_unknown_turn_archived_is_unexpected(session):
    changes = changes_of(session)
    trivial = session[1].model_copy(update={"message_id": "x-1"})  # "Noted."
    turn = {**changes[0].records[0], "message_id": "x-1", "content": trivial.content}
    stray = changes[0].model_copy(update={"change_id": "c-stray", "records": [turn]})
    report = check_archive(expected_turns(session), [*changes, stray])
    assert report.counts()["unexpected"] == 1
    assert not archive_consistent({"archive": report.counts()})


def test_a_payload_not_the_message_is_mismatched(session):
    changes = changes_of(session)
    bad = changes[0].model_copy(update={"records": [{**changes[0].records[0],
                                                     "content": "other"}]})
    report = check_archive(expected_turns(session), [bad, *changes[1:]])
    assert report.counts()["mismatched"] == 1
    assert not archive_consistent({"archive": report.counts()})


def test_rows_from_before_the_check_count_as_consistent():
    assert archive_consistent({"archive_worker_store": None})
