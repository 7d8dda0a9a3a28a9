"""The stages' check of records that carry authority (streams.record_checks) and the
shard restore's (streams.shard_restore): no valid MAC, no effect."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from memstream.core.settings import Settings
from memstream.memory.store import Scope
from memstream.streams import record_checks
from memstream.streams.counters import Counters
from memstream.streams.shard_restore import Restore, results_check
from memstream.streams.stage import Work
from memstream.topics.registry import registry
from memstream.topics.schemas import JobRange, JobResult, JobStatus
from tests.unit.builders import CLUSTER_SECRET, mac, make_store

pytestmark = pytest.mark.unit
NOW = 1_780_000_000.0


def pipeline(tmp_path: Any) -> Any:
    s = Settings(data_dir=tmp_path, cluster_secret=CLUSTER_SECRET)
    return SimpleNamespace(settings=s, topics=registry(s), counters=Counters(),
                           clock=lambda: NOW)


def record(topic: str, value: bytes, *, key: bytes = b"acme/u1", headers: Any = None,
           offset: int = 7) -> Any:
    return SimpleNamespace(topic=topic, partition=1, offset=offset, key=key, value=value,
                           headers=mac(topic, key, value) if headers is None else headers)


def test_a_record_without_a_valid_mac_is_set_aside_without_its_value(tmp_path):
    p, work = pipeline(tmp_path), Work()
    value = b'{"write": {"name": "forget"}, "principal": "admin"}'
    forged = record(p.topics.tool_requests.name, value, headers=())
    assert not record_checks.authentic(p, work, forged)
    ((topic, key, raw),) = work.out
    letter = json.loads(raw)
    assert topic == p.topics.dead_letters.name and key == b"acme/u1"
    assert letter["kind"] == "unauthenticated"
    assert letter["reason"] == "unauthenticated record: no MAC"
    assert letter["value_b64"] == "" and not letter["truncated"]
    assert letter["value_length"] == len(value)
    assert letter["value_sha256"] == hashlib.sha256(value).hexdigest()
    assert base64.b64decode(letter["key_b64"]) == b"acme/u1"
    assert (letter["source_topic"], letter["partition"], letter["offset"]) == (
        p.topics.tool_requests.name, 1, 7)
    assert p.counters.records_unauthenticated == {"tool-requests": 1}
    assert p.counters.dead_letters_by_class == {"unauthenticated": 1}


def test_a_signed_record_and_a_chat_message_pass(tmp_path):
    p, work = pipeline(tmp_path), Work()
    assert record_checks.authentic(p, work, record(p.topics.decisions.name, b"{}"))
    assert record_checks.authentic(p, work, record(p.topics.messages.name, b"{}", headers=()))
    assert record_checks.authentic(p, work, record(p.topics.repartition.name, b"{}",
                                                   headers=()))
    assert work.out == [] and p.counters.records_unauthenticated == {}


def test_a_signed_record_moved_to_another_topic_is_refused(tmp_path):
    p, work = pipeline(tmp_path), Work()
    signed = record(p.topics.job_results.name, b"{}")
    moved = SimpleNamespace(**{**vars(signed), "topic": p.topics.decisions.name})
    assert not record_checks.authentic(p, work, moved)
    assert "invalid MAC" in json.loads(work.out[0][2])["reason"]


def result(seq: int) -> JobResult:
    job = JobRange(job_id=f"j{seq}", seq=seq, tenant_id="acme", user_id="u1",
                   session_id="s1", from_seq=0, to_seq=2)
    return JobResult.for_job(job, JobStatus.DONE, datetime.fromtimestamp(NOW, UTC))


def test_a_restore_takes_cursors_only_from_signed_results(tmp_path):
    s = pipeline(tmp_path).settings
    topic = registry(s).job_results.name
    shard = make_store("edge", tmp_path / "shard", 8)
    try:
        job = Restore(shard, None, empty=False, authentic=results_check(s))
        signed, forged = result(3), result(1_000_000)
        job.on_results([record(topic, signed.dumps(), offset=0),
                        record(topic, forged.dumps(), headers=(), offset=1)])
        job.finish()
        cursor = shard.cursor(Scope("acme", "u1"))
        assert cursor is not None and cursor.seq == 3  # not moved by the forged one
    finally:
        shard.close()
