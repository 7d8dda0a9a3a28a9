"""The ingest loop's exactly-once bookkeeping (streams/owned_loop.py, streams/ingest_tables.py)
without a broker: a batch's table writes are the table's only once its transaction is
committed, a failed transaction is read again from the committed offsets, a record below
the partition's next offset is never handled twice, one fetched before the partition was
ready is never handled, and the topics of a partition are merged without reordering any.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, ProducerFenced
from aiokafka.structs import TopicPartition
from pydantic import SecretStr

from memstream.core.retry import RetryPolicy
from memstream.core.settings import Settings
from memstream.streams import owned_loop, window
from memstream.streams.app import build_app
from memstream.streams.dead_letters import EXIT_UNDELIVERABLE
from memstream.streams.ingest import ingest_loop
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.stage import TaskContext
from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobResult,
    JobStatus,
    SessionEvent,
)
from tests.unit.builders import CLUSTER_SECRET, FakeProducer, mac, serving

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 1, tzinfo=UTC)

ADMIN = SecretStr("k-admin-0123456789abcdef0123456789")


# --- the table ---------------------------------------------------------------------------


def test_pending_writes_are_read_at_once_and_kept_only_when_committed():
    t = LoopTable("x-changelog")
    mine = t.slice(1)
    mine[b"a"] = {"v": 1}
    mine[b"b"] = {"v": 2}
    del mine[b"b"]
    assert mine.get(b"a") == {"v": 1} and mine.get(b"b") is None and b"a" in mine
    assert sorted(mine.changelog()) == [(b"a", b'{"v":1}'), (b"b", None)]
    assert list(t.items()) == [] and mine.items() == []  # nothing committed yet
    mine.discard()
    assert mine.get(b"a") is None and mine.changelog() == [] and not mine.dirty()
    mine[b"a"] = {"v": 3}
    mine.commit()
    assert dict(t.items()) == {b"a": {"v": 3}} and mine.changelog() == []
    assert mine.items() == [(b"a", {"v": 3})] and t.items_of(1) == [(b"a", {"v": 3})]


def test_a_task_sees_only_its_own_pending_writes():
    """Two partitions' batches in flight at once (awaits between their writes): neither
    sees, commits nor discards the other's pending writes (no shared "current partition")."""
    t = LoopTable("x")
    one, two = t.slice(1), t.slice(2)
    one[b"u1"] = 1
    two[b"u2"] = 2
    assert one.get(b"u2") is None and two.get(b"u1") is None
    two.discard()
    one.commit()
    assert dict(t.items()) == {b"u1": 1} and t.items_of(2) == [] and two.get(b"u1") == 1


def test_the_api_reads_committed_state_only(tmp_path):
    """The HTTP API reads the tables themselves (web.backend_reads, web.backend: the window,
    the ingest state): a pending write of a batch in flight is not seen there (its
    transaction may yet abort and the batch be read again); once committed it is."""
    settings = Settings(data_dir=tmp_path, partitions=1, cluster_secret=CLUSTER_SECRET)
    state, window_table = LoopTable("state"), LoopTable("window")
    msg = ChatMessage(tenant_id="t", user_id="u", session_id="s", message_id="m1",
                      role="user", content="I moved to Lisbon", ts=T0)
    in_flight, writes = window_table.slice(0), state.slice(0)
    window.record(in_flight, settings, msg, 0)
    writes[b"t/u"] = {"tenant_id": "t"}
    assert window.rows(in_flight, "t", "u", "s", 5)  # the batch itself reads its writes
    assert window.rows(window_table, "t", "u", "s", 5) == []  # the API does not
    assert state.committed(b"t/u") is None and state.get(b"t/u") is None
    in_flight.commit()
    writes.commit()
    assert [r[1] for r in window.rows(window_table, "t", "u", "s", 5)] == ["m1"]
    assert state.committed(b"t/u") == {"tenant_id": "t"}


def test_restore_and_drop_follow_the_partition_that_holds_a_key():
    t = LoopTable("x")
    t.restore(0, b"u0", b'{"n":0}')
    t.restore(1, b"u1", b'{"n":1}')
    t.restore(1, b"gone", b"1")
    t.restore(1, b"gone", None)  # a tombstone
    assert dict(t.items()) == {b"u0": {"n": 0}, b"u1": {"n": 1}}
    t.drop({1})
    assert dict(t.items()) == {b"u0": {"n": 0}}


# --- the loop, with a consumer and producers that keep what they are told ------------------


async def _loop(tmp_path):
    settings = Settings(data_dir=tmp_path, embedder="hashing", extract_enabled=False,
                        web_enabled=False, jobs_enabled=False, min_new_messages=2,
                        admin_key=ADMIN, partitions=1,  # every key's partition: 0
                        cluster_secret=CLUSTER_SECRET)
    p = build_app(settings)
    p.clock = lambda: T0.timestamp() + 10
    fatal: list[tuple[str, int]] = []
    loop = ingest_loop(p, on_fatal=lambda reason, code=70: fatal.append((reason, code)))
    await serving(loop, {0})
    return p, loop, fatal


def _next(loop, tp: TopicPartition) -> int:
    """The next offset of ``tp`` the loop handles."""
    return loop.task_manager.by_partition[tp.partition].offsets[tp]


def _msg(p, n: int, *, offset: int, user: str = "u1", content: str | None = None, ts: int = 0):
    event = ChatMessage(tenant_id="acme", user_id=user, session_id="s1", message_id=f"m{n}",
                        role="user", content=content or f"I have {n} cats",
                        ts=T0 + timedelta(seconds=n))
    return _record(p.topics.messages.name, offset, event, ts or n)


def _record(topic: str, offset: int, event, ts: int, value: bytes | None = None):
    key = (event.key() if hasattr(event, "key") else f"{event.tenant_id}/{event.user_id}")
    value = event.dumps() if value is None else value
    return SimpleNamespace(topic=topic, partition=0, offset=offset, key=key.encode(),
                           value=value, timestamp=ts, headers=mac(topic, key.encode(), value))


def _batch(*records):
    out: dict[TopicPartition, list] = {}
    for r in records:
        out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    return out


def _sent(producer: FakeProducer, topic: str) -> list:
    return [r for txn in producer.committed for r in txn if r[0] == topic]


async def test_a_batch_commits_its_jobs_state_and_offsets_in_one_transaction(tmp_path):
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    producer = loop.task_manager.producer(0)
    assert len(producer.committed) == 1  # one transaction for the batch
    jobs = _sent(producer, p.topics.jobs.name)
    assert len(jobs) == 1  # the threshold (2) reached: one job
    state = _sent(producer, p.state.topic)
    assert len(state) == 1 and state[0][3] == 0  # written once per batch, to its partition
    assert json.loads(state[0][2])["in_flight"] is not None
    assert producer.offsets == [{TopicPartition(p.topics.messages.name, 0): 2}]
    assert p.state.get(b"acme/u1")["in_flight"]["job_id"]  # the table took it
    assert _next(loop, TopicPartition(p.topics.messages.name, 0)) == 2


async def test_a_failed_transaction_leaves_the_tables_and_offsets_and_reads_again(tmp_path):
    p, loop, fatal = await _loop(tmp_path)
    loop.task_manager.producer(0).fail = KafkaConnectionError()
    renewed = FakeProducer()
    loop.clients.renewals.append(renewed)
    tp = TopicPartition(p.topics.messages.name, 0)
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    assert p.state.get(b"acme/u1") is None and len(p.state) == 0  # nothing of the batch
    assert p.window.get(b"acme/u1/s1") is None
    assert _next(loop, tp) == 0 and (tp, 0) in loop.consumer.seeks  # read again from 0
    assert loop.task_manager.producer(0) is renewed and loop.failed_commits == 1 and not fatal
    # read again: the same batch now commits, and the user gets exactly one job
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    assert len(_sent(renewed, p.topics.jobs.name)) == 1 and _next(loop, tp) == 2


async def test_a_fenced_partition_is_let_go_and_the_worker_goes_on(tmp_path):
    """Another worker's producer took partition 0 (this worker's generation is stale): the
    partition is dropped as if revoked, nothing of the batch is committed, no exit."""
    p, loop, fatal = await _loop(tmp_path)
    loop.task_manager.producer(0).fail = ProducerFenced()
    await loop.process(_batch(_msg(p, 1, offset=0)))
    assert not fatal and len(p.state) == 0 and loop.task_manager.fenced == 1
    tm = loop.task_manager
    assert 0 not in tm.ready and 0 not in loop.owned and tm.producer(0) is None
    assert not loop.task_manager.by_partition[0].offsets and loop.task_manager.by_partition[0].gone
    await loop.process(_batch(_msg(p, 2, offset=1)))  # its records are no longer handled
    assert len(p.state) == 0


async def test_a_transaction_the_broker_refuses_for_good_stops_the_worker(tmp_path):
    """A dead letter its topic does not take (too large): exit 75, nothing passed."""
    p, loop, fatal = await _loop(tmp_path)
    loop.task_manager.producer(0).fail = MessageSizeTooLargeError()
    await loop.process(_batch(_msg(p, 1, offset=0)))
    assert fatal == [(fatal[0][0], EXIT_UNDELIVERABLE)] and "undeliverable" in fatal[0][0]
    assert _next(loop, TopicPartition(p.topics.messages.name, 0)) == 0 and len(p.state) == 0


async def test_transactions_failing_again_and_again_end_the_worker(tmp_path, monkeypatch):
    p, loop, fatal = await _loop(tmp_path)
    monkeypatch.setattr(owned_loop, "RETRY", RetryPolicy(0.0, 0.0))

    loop.task_manager.producer(0).fail = KafkaConnectionError()
    loop.clients.renewals += [FakeProducer(fail=KafkaConnectionError())
                              for _ in range(owned_loop.MAX_FAILED_IN_ROW)]
    for _ in range(owned_loop.MAX_FAILED_IN_ROW):
        await loop.process(_batch(_msg(p, 1, offset=0)))
    assert not fatal  # a broker away for a while: read again, and again
    await loop.process(_batch(_msg(p, 1, offset=0)))
    assert len(fatal) == 1 and "in a row" in fatal[0][0] and len(p.state) == 0


async def test_records_below_the_next_offset_are_not_handled_again(tmp_path):
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0)))
    # a stale fetch hands offset 0 again together with offset 1
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    state = p.state.get(b"acme/u1")
    assert state["sessions"]["s1"]["count"] == 2  # each message counted once
    assert len(_sent(loop.task_manager.producer(0), p.topics.jobs.name)) == 1


async def test_records_of_a_partition_not_ready_are_left_for_its_seek(tmp_path):
    p, loop, _ = await _loop(tmp_path)
    await loop.task_manager.revoked()  # a rebalance is under way
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    assert loop.task_manager.producer(0).committed == [] and len(p.state) == 0
    assert _next(loop, TopicPartition(p.topics.messages.name, 0)) == 0


async def test_topics_are_merged_by_time_without_reordering_one(tmp_path, monkeypatch):
    """A partition's topics are handled in timestamp order, but one topic's records never
    change places, even where its timestamps go back (producer clocks differ)."""
    p, loop, _ = await _loop(tmp_path)
    from memstream.streams import ingest

    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(ingest, "handle_record",
                        lambda _p, _b, r: seen.append((r.topic[-8:], r.offset)))
    end = SessionEvent(tenant_id="acme", user_id="u1", session_id="s1",
                       ts=T0 + timedelta(seconds=5))
    ends = p.topics.session_events.name
    batch = {TopicPartition(ends, 0): [_record(ends, 0, end, 5), _record(ends, 1, end, 2)],
             TopicPartition(p.topics.messages.name, 0): [
                 _msg(p, 1, offset=0, ts=1), _msg(p, 2, offset=1, ts=7),
                 _msg(p, 3, offset=2, ts=3)]}
    await loop.process(batch)
    mine, theirs = "messages", ends[-8:]
    assert seen == [(mine, 0), (theirs, 0), (theirs, 1), (mine, 1), (mine, 2)]


async def test_a_bad_record_is_a_dead_letter_in_the_batch_and_the_batch_goes_on(tmp_path):
    p, loop, _ = await _loop(tmp_path)
    good = _msg(p, 1, offset=1)
    bad = SimpleNamespace(**{**good.__dict__, "offset": 0, "value": b"{not json"})
    await loop.process(_batch(bad, good))
    dead = _sent(loop.task_manager.producer(0), p.topics.dead_letters.name)
    assert len(dead) == 1 and json.loads(dead[0][2])["kind"] == "not_json"
    assert p.state.get(b"acme/u1")["sessions"]["s1"]["count"] == 1
    assert _next(loop, TopicPartition(p.topics.messages.name, 0)) == 2


async def test_a_job_result_in_the_next_batch_frees_the_user(tmp_path):
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    (job_record,) = _sent(loop.task_manager.producer(0), p.topics.jobs.name)
    job = ExtractionJob.model_validate_json(job_record[2])
    result = JobResult.for_job(job, JobStatus.DONE, T0 + timedelta(seconds=9))
    await loop.process(_batch(_record(p.topics.job_results.name, 0, result, 9)))
    assert p.state.get(b"acme/u1")["in_flight"] is None


async def test_a_forged_result_or_tool_request_changes_nothing(tmp_path):
    """Without a valid MAC (core.record_auth), a job result does not free the user's job in
    flight and a tool request (a forget-me "by admin") becomes no job: both are set aside
    without their value, counted, and the next records are handled."""
    from memstream.topics.schemas import ToolRequest, ToolWrite

    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    (job_record,) = _sent(loop.task_manager.producer(0), p.topics.jobs.name)
    job = ExtractionJob.model_validate_json(job_record[2])
    result = JobResult.for_job(job, JobStatus.DONE, T0 + timedelta(seconds=9))
    forget = ToolRequest(request_id="forged-1", tenant_id="acme", user_id="u1",
                         write=ToolWrite(name="forget"), principal="admin", ts=T0)
    forged = [_record(p.topics.job_results.name, 0, result, 9),
              _record(p.topics.tool_requests.name, 0, forget, 9)]
    for r in forged:
        r.headers = ()
    await loop.process(_batch(*forged, _msg(p, 3, offset=2)))
    producer = loop.task_manager.producer(0)
    assert p.state.get(b"acme/u1")["in_flight"]["job_id"] == job.job_id  # not freed
    assert not p.state.get(b"acme/u1").get("tools")  # no forget-me queued
    assert len(_sent(producer, p.topics.jobs.name)) == 1  # no job for it either
    dead = [json.loads(r[2]) for r in _sent(producer, p.topics.dead_letters.name)]
    assert [(d["kind"], d["value_b64"]) for d in dead] == [("unauthenticated", "")] * 2
    assert p.counters.records_unauthenticated == {"job-results": 1, "tool-requests": 1}
    assert p.counters.messages == 3  # the batch went on
    await loop.process(_batch(_record(p.topics.job_results.name, 1, result, 10)))
    assert p.state.get(b"acme/u1")["in_flight"] is None  # the worker's own result frees it


async def test_a_job_in_flight_is_timed_from_the_takeover(tmp_path):
    """The loops lose no record: a job sent before this worker took the partition is on
    its way (the partition had no owner for a while), so its timeout counts from the
    takeover, not from the send; a job that really is gone is still re-sent after it."""
    p, loop, _ = await _loop(tmp_path)
    sent_at = T0.timestamp() + 10
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))
    timeout = p.settings.job_timeout_s
    p.clock = lambda: sent_at + timeout - 5  # a restart after a long outage: the job's
    task = loop.task_manager.by_partition[0]  # partition had left, and is taken over
    task.processor.close()  # (its tables as they were: a take restores them from their
    task.processor = loop.stage.open(TaskContext(0, task.slices))  # changelog)

    async def timers_at(at: float) -> None:
        p.clock = loop.clock = lambda: at
        await loop.punctuate()

    await timers_at(sent_at + timeout + 5)  # due by the send, not yet
    assert len(_sent(loop.task_manager.producer(0), p.topics.jobs.name)) == 1  # not re-sent
    await timers_at(sent_at + 2 * timeout)  # due since the takeover
    jobs = [ExtractionJob.model_validate_json(v[2])
            for v in _sent(loop.task_manager.producer(0), p.topics.jobs.name)]
    assert len(jobs) == 2 and jobs[1].job_id == jobs[0].job_id and jobs[1].attempt == 2


async def test_a_timer_round_is_a_transaction_of_its_partition_without_offsets(tmp_path):
    """The idle flush: what the round emits (the job, the user's new state) is one
    transaction of partition 0, with no input offsets; a round with nothing due sends
    nothing; the changelog segments roll at the partition's first round."""
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0)))  # below the threshold: no job
    producer = loop.task_manager.producer(0)
    loop.clock = lambda: T0.timestamp() + 10
    await loop.punctuate()  # nothing due but the first roll
    assert len(producer.committed) == 2 and producer.offsets == [
        {TopicPartition(p.topics.messages.name, 0): 1}]  # the round sent no offsets
    rolled = [r for r in producer.committed[1] if r[1] == b"\x00roll"]
    assert {r[0] for r in rolled} == {p.state.topic, p.window.topic} and not rolled[0][2]
    await loop.punctuate()  # nothing due, no roll: no transaction
    assert len(producer.committed) == 2
    loop.clock = lambda: T0.timestamp() + 10 + p.settings.idle_timeout_s + 1
    await loop.punctuate()
    assert len(producer.committed) == 3
    (job,) = _sent(producer, p.topics.jobs.name)
    assert ExtractionJob.model_validate_json(job[2]).reason.value == "idle"
    assert p.state.get(b"acme/u1")["in_flight"] is not None  # the table took it


async def test_a_partition_behind_runs_its_timers_on_the_time_of_what_it_read(tmp_path):
    """After a restart the partition's backlog may hold the result of the job in flight:
    while records wait unread, its timers run on the newest record's time, so the job is
    not re-sent for a timeout that only the wall clock passed; once read to the end, the
    wall clock counts."""
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0), _msg(p, 2, offset=1)))  # a job sent
    results = TopicPartition(p.topics.job_results.name, 0)
    loop.consumer.high[results] = 5  # five results not read yet
    late = T0.timestamp() + 10 + 10 * p.settings.job_timeout_s
    loop.clock = lambda: late
    await loop.punctuate()
    assert len(_sent(loop.task_manager.producer(0), p.topics.jobs.name)) == 1  # not re-sent
    loop.consumer.positions[results] = 5  # read to the end, none was its result
    await loop.punctuate()
    assert len(_sent(loop.task_manager.producer(0), p.topics.jobs.name)) == 2  # re-sent now


async def test_a_timer_round_whose_transaction_fails_is_run_again(tmp_path):
    """Nothing is read again for a round: its table writes are dropped, and the next round
    finds the same user due and emits the job again."""
    p, loop, _ = await _loop(tmp_path)
    await loop.process(_batch(_msg(p, 1, offset=0)))
    loop.clock = lambda: T0.timestamp() + 10 + p.settings.idle_timeout_s + 1
    loop.task_manager.producer(0).fail = KafkaConnectionError()
    await loop.punctuate()
    assert p.state.get(b"acme/u1")["in_flight"] is None  # the write was dropped
    await loop.punctuate()
    assert len(_sent(loop.task_manager.producer(0), p.topics.jobs.name)) == 1
    assert p.state.get(b"acme/u1")["in_flight"] is not None


async def test_a_partition_let_go_is_taken_back_when_no_rebalance_takes_it(tmp_path):
    """The fence came from a worker with a stale assignment: no rebalance follows, so after
    two session timeouts the partition, still assigned here, is taken again as a new one."""
    p, loop, fatal = await _loop(tmp_path)
    loop.task_manager.producer(0).fail = ProducerFenced()
    await loop.process(_batch(_msg(p, 1, offset=0)))
    await loop.task_manager.take_back()
    assert 0 in loop.task_manager.fenced_here() and 0 not in loop.owned  # too soon: a rebalance
    fenced = loop.task_manager.by_partition[0]
    fenced.fenced_at -= 2 * loop.settings.session_timeout_s + 1  # may come
    await loop.task_manager.take_back()
    await loop.task_manager.settled()
    assert loop.task_manager.ready == {0} and not loop.task_manager.fenced_here() and not fatal
    assert len(loop.clients.made) == 2  # taken again as new: a new producer (the fence)
    await loop.process(_batch(_msg(p, 1, offset=0)))
    assert p.state.get(b"acme/u1")["sessions"]["s1"]["count"] == 1
