"""The extract and apply stages in their owned loops (streams/extract.py, streams/apply.py,
streams/owned_loop.py) without a broker: a batch's decisions / events / results go in one
transaction with its offsets, a user's second decision waits for the next transaction, a
transaction that fails is read again and the store answers with the events it kept, a
bad record is a dead letter in its batch, and the windowed jobs' table is written only
with a committed transaction.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition
from pydantic import SecretStr

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.memory.store import Scope
from memstream.streams.app import Pipeline, build_app
from memstream.streams.loop_clients import KafkaClients
from memstream.streams.owned_loop import OwnedLoop
from memstream.topics.schemas import JobDecision, JobResult, JobStatus, MemoryChange
from tests.unit.builders import CLUSTER_SECRET, FakeConsumer, FakeProducer, job, mac, serving

pytestmark = pytest.mark.unit
NOW = 1_780_000_000.0

ADMIN = SecretStr("k-admin-0123456789abcdef0123456789")


@pytest.fixture
def p(tmp_path):
    # the single store: these records are all on partition 0, whatever their keys' (the
    # partitioned store's take is tests/unit/streams/test_shards.py's)
    settings = Settings(data_dir=tmp_path, embedder="hashing", web_enabled=False,
                        ingest_enabled=False, admin_key=ADMIN, cluster_secret=CLUSTER_SECRET,
                        reflection_threshold=1.0, store_partitioned=False,
                        archive=False)  # the archive's own: tests/unit/memory/test_archive.py
    pipeline = build_app(settings)
    pipeline.clock = lambda: NOW
    yield pipeline
    pipeline.services.store.close()


async def loop_of(p: Pipeline, name: str, committed: dict[TopicPartition, int] | None = None,
                  ) -> tuple[OwnedLoop, list[tuple[str, int]]]:
    (loop,) = [loop for loop in p.loops if loop.stage.name == name]
    fatal: list[tuple[str, int]] = []
    loop.on_fatal = lambda reason, code=70: fatal.append((reason, code))
    await serving(loop, {0}, committed)
    return loop, fatal


def _next(loop: OwnedLoop, tp: TopicPartition) -> int:
    """The next offset of ``tp`` the loop handles."""
    return loop.task_manager.by_partition[tp.partition].offsets[tp]


def record(topic: str, offset: int, key: bytes, value: bytes, ts: int | None = None) -> Any:
    return SimpleNamespace(topic=topic, partition=0, offset=offset, key=key, value=value,
                           timestamp=offset if ts is None else ts,
                           headers=mac(topic, key, value))


def batch(*records: Any) -> dict[TopicPartition, list[Any]]:
    out: dict[TopicPartition, list[Any]] = {}
    for r in records:
        out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
    return out


def sent(producer: FakeProducer, topic: str, txn: int | None = None) -> list[bytes]:
    txns = producer.committed if txn is None else [producer.committed[txn]]
    return [r[2] for t in txns for r in t if r[0] == topic]


def job_record(p: Pipeline, offset: int, texts: list[str], *, user: str = "u1",
               seq: int = 1, job_id: str | None = None) -> Any:
    j = job(texts, user=user, job_id=job_id or f"job-{user}-{seq}").model_copy(
        update={"seq": seq})
    return record(p.topics.jobs.name, offset, j.key().encode(), j.dumps())


async def decided(p: Pipeline, *jobs: Any) -> list[Any]:
    """The jobs through the extract loop: their decisions, as records of the topic."""
    loop, _ = await loop_of(p, "extract")
    await loop.process(batch(*jobs))
    values = sent(loop.task_manager.producer(0), p.topics.decisions.name)
    return [record(p.topics.decisions.name, n, JobDecision.model_validate_json(v).key().encode(),
                   v) for n, v in enumerate(values)]


async def test_extract_commits_a_batch_of_decisions_with_its_offsets(p):
    loop, fatal = await loop_of(p, "extract")
    bad = record(p.topics.jobs.name, 1, b"t1/u2", b"{not json")
    await loop.process(batch(job_record(p, 0, ["I live in Oslo"]), bad,
                             job_record(p, 2, ["I am allergic to nuts"], user="u3")))
    producer = loop.task_manager.producer(0)
    assert len(producer.committed) == 1 and not fatal
    decisions = [JobDecision.model_validate_json(v)
                 for v in sent(producer, p.topics.decisions.name)]
    assert sorted(d.user_id for d in decisions) == ["u1", "u3"]
    assert all(d.status == JobStatus.DONE and d.changes for d in decisions)
    (dead,) = sent(producer, p.topics.dead_letters.name)
    assert json.loads(dead)["kind"] == "not_json"
    assert producer.offsets == [{TopicPartition(p.topics.jobs.name, 0): 3}]
    assert p.services.store.count() == 0  # deciding writes nothing to the store


async def test_apply_sends_events_then_the_result_and_one_decision_per_user_per_txn(p):
    first, second = await decided(p, job_record(p, 0, ["I live in Oslo"]),
                                  job_record(p, 1, ["I am allergic to nuts"], seq=2))
    loop, fatal = await loop_of(p, "apply")
    await loop.process(batch(first, second))
    producer = loop.task_manager.producer(0)
    assert len(producer.committed) == 2 and not fatal  # the user's second: its own txn
    for txn in (0, 1):
        kinds = [r[0] for r in producer.committed[txn]
                 if r[0] in (p.topics.memory_changes.name, p.topics.job_results.name)]
        assert kinds[-1] == p.topics.job_results.name and len(kinds) >= 2  # events first
        (result,) = sent(producer, p.topics.job_results.name, txn)
        assert JobResult.model_validate_json(result).status == JobStatus.DONE
    changes = [MemoryChange.model_validate_json(v)
               for v in sent(producer, p.topics.memory_changes.name)]
    assert sorted(c.after["content"] for c in changes) == [
        "Allergic to nuts", "Lives in Oslo"]
    dtp = TopicPartition(p.topics.decisions.name, 0)
    assert [o[dtp] for o in producer.offsets] == [1, 2] and _next(loop, dtp) == 2
    assert p.services.store.count() == 2


async def test_a_failed_apply_transaction_is_read_again_and_republishes_the_kept_events(p):
    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo"]))
    loop, fatal = await loop_of(p, "apply")
    loop.task_manager.producer(0).fail = KafkaConnectionError()
    renewed = FakeProducer()
    loop.clients.renewals.append(renewed)
    resolved: list[str] = []
    p.waiters.resolve = lambda job_id, outcome: resolved.append(job_id)  # type: ignore
    await loop.process(batch(rec))
    dtp = TopicPartition(p.topics.decisions.name, 0)
    assert _next(loop, dtp) == 0 and (dtp, 0) in loop.consumer.seeks and not fatal
    assert p.services.store.count() == 1 and resolved == []  # in the store, nobody woken
    assert p.counters.changes == {}  # counted only once committed
    await loop.process(batch(rec))  # read again: the store answers DONE with its events
    (change,) = [MemoryChange.model_validate_json(v)
                 for v in sent(renewed, p.topics.memory_changes.name)]
    assert change.after["content"] == "Lives in Oslo" and p.services.store.count() == 1
    (result,) = sent(renewed, p.topics.job_results.name)
    assert JobResult.model_validate_json(result).status == JobStatus.DONE
    assert resolved and p.counters.decisions_republished == 1  # this very decision again


async def test_a_bad_decision_is_a_dead_letter_and_the_batch_goes_on(p):
    (good,) = await decided(p, job_record(p, 1, ["I live in Oslo"]))
    good.offset = 1
    bad = record(p.topics.decisions.name, 0, b"t1/u9", b'{"job_id": 3}')
    loop, _ = await loop_of(p, "apply")
    await loop.process(batch(bad, good))
    producer = loop.task_manager.producer(0)
    (dead,) = sent(producer, p.topics.dead_letters.name)
    assert json.loads(dead)["kind"] == "schema"
    assert len(sent(producer, p.topics.job_results.name)) == 1
    assert _next(loop, TopicPartition(p.topics.decisions.name, 0)) == 2


@pytest.mark.parametrize("forgery", ["no MAC", "another secret's MAC"])
async def test_a_forged_decision_or_job_changes_nothing_and_the_batch_goes_on(p, forgery):
    """A decision or job without a valid MAC (core.record_auth) is set aside without its
    value and counted; the records after it are handled."""
    good, forged = await decided(p, job_record(p, 1, ["I am allergic to nuts"], user="u3"),
                                 job_record(p, 0, ["I live in Oslo"]))
    assert (good.key, forged.key) == (b"t1/u3", b"t1/u1")
    forged_job = job_record(p, 2, ["I live in Oslo"], seq=2)

    def forge(r: Any) -> None:
        r.headers = () if forgery == "no MAC" else mac(r.topic, r.key, r.value,
                                                       "another-secret-0123456789abcdef01")

    forge(forged)
    forge(forged_job)
    forged.offset, good.offset = 0, 1
    loop, fatal = await loop_of(p, "apply")
    await loop.process(batch(forged, good))
    producer = loop.task_manager.producer(0)
    (dead,) = [json.loads(v) for v in sent(producer, p.topics.dead_letters.name)]
    assert dead["kind"] == "unauthenticated" and dead["value_b64"] == ""
    assert dead["value_length"] == len(forged.value) and dead["offset"] == 0
    results = [JobResult.model_validate_json(v) for v in sent(producer,
                                                              p.topics.job_results.name)]
    assert [r.user_id for r in results] == ["u3"] and not fatal  # the batch went on
    assert p.services.store.list(Scope("t1", "u1")) == []  # the forged one not applied
    assert p.services.store.list(Scope("t1", "u3"))
    (extract,) = [x for x in p.loops if x.stage.name == "extract"]
    await extract.process(batch(forged_job))
    decisions = sent(extract.task_manager.producer(0), p.topics.decisions.name)
    assert len(decisions) == 2  # the two of before: none for the forged job
    assert p.counters.records_unauthenticated == {"decisions": 1, "extraction-jobs": 1}


async def test_the_maintenance_table_takes_folds_only_with_a_committed_transaction(p):
    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo", "I work at Acme"]))
    loop, _ = await loop_of(p, "apply")
    loop.task_manager.producer(0).fail = KafkaConnectionError()
    await loop.process(batch(rec))
    assert p.maintenance.get(b"t1/u1") is None and len(p.maintenance) == 0
    await loop.process(batch(rec))  # again: the republished events are folded now
    folded = p.maintenance.get(b"t1/u1")
    assert folded is not None and len(p.maintenance) == 1
    (state,) = sent(loop.task_manager.producer(0), p.maintenance.topic)
    assert json.loads(state) == folded
    requests = [json.loads(v)
                for v in sent(loop.task_manager.producer(0), p.topics.tool_requests.name)]
    assert requests and {r["write"]["name"] for r in requests} == {"reflect"}  # threshold 1


async def test_the_apply_loops_timer_round_sends_the_due_windowed_jobs(p):
    """The consolidation a change made due is sent by the partition's timer round, with the
    user's new state, in one transaction without input offsets; not before it is due."""
    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo"]))
    loop, _ = await loop_of(p, "apply")
    await loop.process(batch(rec))
    producer = loop.task_manager.producer(0)
    loop.clock = lambda: NOW
    await loop.punctuate()  # the first round rolls the table's segment, nothing is due
    assert len(producer.committed) == 2 and len(producer.offsets) == 1

    def requested() -> list[str]:
        return [json.loads(v)["write"]["name"]
                for v in sent(producer, p.topics.tool_requests.name)]

    assert "consolidate" not in requested()
    loop.clock = lambda: NOW + p.settings.consolidation_interval_s + 1
    await loop.punctuate()
    assert requested().count("consolidate") == 1 and len(producer.offsets) == 1
    assert json.loads([v for v in sent(producer, p.maintenance.topic) if v][-1])[
        "consolidations"] == 1
    await loop.punctuate()  # not due again
    assert requested().count("consolidate") == 1


async def test_a_commit_that_timed_out_but_landed_counts_as_committed(p):
    """The broker took the commit before the client gave up: the batch is not read and
    handled again (its outputs would be there twice)."""
    from aiokafka.errors import KafkaTimeoutError

    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo"]))
    loop, fatal = await loop_of(p, "apply")
    dtp = TopicPartition(p.topics.decisions.name, 0)
    loop.task_manager.producer(0).fail = KafkaTimeoutError()

    async def committed(tp: TopicPartition) -> int:
        return {dtp: 1}[tp]  # what the broker has: the batch's offsets

    loop.consumer.committed = committed  # type: ignore[attr-defined]
    resolved: list[str] = []
    p.waiters.resolve = lambda job_id, outcome: resolved.append(job_id)  # type: ignore
    await loop.process(batch(rec))
    assert _next(loop, dtp) == 1 and loop.consumer.seeks == [] and not fatal
    assert resolved == ["job-u1-1"] and p.counters.changes  # the after-commit steps ran


async def test_a_decision_the_store_took_is_never_set_aside(p, monkeypatch):
    """Its events cannot be made (a bug): the worker stops with nothing of the batch
    committed, instead of a dead letter that would leave the change without its event."""
    from memstream.streams import apply, privacy

    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo"]))
    loop, _ = await loop_of(p, "apply")

    async def broken(p: Any, changes: Any) -> Any:
        raise ValueError("cannot seal")

    monkeypatch.setattr(privacy, "seal_all", broken)
    with pytest.raises(apply.Unpublished):
        await loop.process(batch(rec))
    assert loop.task_manager.producer(0).committed == [] and p.services.store.count() == 1
    assert _next(loop, TopicPartition(p.topics.decisions.name, 0)) == 0


async def test_a_new_group_starts_where_the_faust_agents_were(p, monkeypatch):
    """An upgrade from the Faust agents: a partition the loop's group never committed
    starts at the Faust group's offset, not at the beginning of the topic."""
    from aiokafka.structs import OffsetAndMetadata


    jobs = TopicPartition(p.topics.jobs.name, 0)
    other = TopicPartition(p.topics.jobs.name, 1)
    asked: list[str] = []

    class Admin:
        def __init__(self, **kwargs: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def close(self) -> None:
            pass

        async def list_consumer_group_offsets(self, group: str) -> dict:
            asked.append(group)
            return {jobs: OffsetAndMetadata(42, ""), other: OffsetAndMetadata(-1, "")}

    monkeypatch.setattr(kafka, "AIOKafkaAdminClient", Admin)
    clients = KafkaClients(p.settings)
    consumer = FakeConsumer(set())

    async def beginning(tps: list[TopicPartition]) -> dict:
        return dict.fromkeys(tps, 7)

    consumer.beginning_offsets = beginning  # type: ignore[method-assign]
    assert await clients.first_offset(consumer, jobs) == 42
    assert await clients.first_offset(consumer, other) == 7
    assert await clients.first_offset(consumer, jobs) == 42
    assert asked == ["memstream"]  # the Faust app's group, read once


async def test_another_decision_of_an_applied_job_is_not_folded_twice(p):
    """A job decided twice (a copy re-sent after its timeout): the second decision comes
    back DONE with the first's events, which were folded already; the reflection sum must
    not count them again."""
    from memstream.streams.extract import decide_with_retries

    j = job(["I live in Oslo"], user="u1", job_id="job-u1-1").model_copy(update={"seq": 1})
    (first,) = await decided(p, record(p.topics.jobs.name, 0, j.key().encode(), j.dumps()))
    loop, _ = await loop_of(p, "apply")
    await loop.process(batch(first))
    folded = p.maintenance.get(b"t1/u1")
    again = await decide_with_retries(p, j)  # the copy, decided against the store as it is
    second = record(p.topics.decisions.name, 1, b"t1/u1", again.dumps())
    await loop.process(batch(second))
    assert p.counters.decisions_duplicate == 1  # DONE
    assert p.maintenance.get(b"t1/u1") == folded
    changes = sent(loop.task_manager.producer(0), p.topics.memory_changes.name)
    assert len(changes) == 2  # republished


async def test_sealing_waits_until_the_user_keys_are_read(p, monkeypatch):
    """Apply starts with the worker, the user-keys follower in a task: a key made before
    the topic is read could be a user's second one. Not read in time: a transient error
    (the decision is tried again in place), never a key made blind."""
    from memstream.core.retry import is_transient
    from memstream.streams import privacy

    (rec,) = await decided(p, job_record(p, 0, ["I live in Oslo"]))
    loop, _ = await loop_of(p, "apply")
    await loop.process(batch(rec))
    (value,) = sent(loop.task_manager.producer(0), p.topics.memory_changes.name)
    change = MemoryChange.model_validate_json(value)
    monkeypatch.setattr(privacy, "READY_S", 0.01)
    made: list[str] = []

    class Keys:
        ready = False

        async def wait_ready(self, timeout: float) -> bool:
            return self.ready

        async def key_for_write(self, tenant: str, user: str) -> tuple[str, bytes]:
            made.append(user)
            return "k1", b"k" * 32

    keys = Keys()
    with pytest.raises(TimeoutError) as err:
        await privacy.seal_all(SimpleNamespace(user_keys=keys), [change])  # type: ignore
    assert is_transient(err.value) and made == []
    keys.ready = True
    ((sealed, event),) = await privacy.seal_all(SimpleNamespace(user_keys=keys),  # type: ignore
                                                [change])
    assert made == ["u1"] and sealed.sealed and event.sealed and event.after is None


async def test_a_transaction_marker_is_no_lag(p):
    """A partition written in transactions ends with a marker: at rest its highwater is one
    past the last record. Lag counts records, so an idle loop read to the end shows 0."""
    tp = TopicPartition(p.topics.jobs.name, 0)
    loop, _ = await loop_of(p, "extract", committed={tp: 10})
    high = loop.consumer.high
    position = loop.consumer.positions
    high[tp] = 11  # record 9 handled, offset 10 is its transaction's marker
    position[tp] = 11
    assert loop.lags() == {(tp.topic, 0): 1}  # not known to be idle yet
    await loop.note_caught_up()
    assert loop.lags() == {(tp.topic, 0): 0}
    high[tp] = 14  # new records arrive: counted again
    assert loop.lags() == {(tp.topic, 0): 4}
    position[tp] = 12  # fetching, not at the end: not idle
    await loop.note_caught_up()
    assert loop.lags() == {(tp.topic, 0): 4}


async def test_a_loop_started_while_the_broker_is_away_waits_for_it(p, monkeypatch):
    """A worker started during a broker restart: the loop's consumer start is tried again
    (with backoff) instead of crashing the app, and the loop polls once it is up."""
    import asyncio

    from aiokafka.errors import KafkaConnectionError

    from memstream.core.retry import RetryPolicy
    from memstream.streams import owned_loop

    polled = asyncio.Event()

    class Consumer:
        starts = 0

        def __init__(self, **kwargs: Any) -> None:
            pass

        def subscribe(self, topics: list[str], listener: Any) -> None:
            pass

        async def start(self) -> None:
            Consumer.starts += 1
            if Consumer.starts < 3:
                raise KafkaConnectionError("Unable to bootstrap")

        async def getmany(self, **kwargs: Any) -> dict:
            polled.set()
            await asyncio.sleep(0.01)
            return {}

        def assignment(self) -> set:
            return set()

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(kafka, "AIOKafkaConsumer", Consumer)
    monkeypatch.setattr(owned_loop, "RETRY", RetryPolicy(0.0, 0.0))
    (loop,) = [loop for loop in p.loops if loop.stage.name == "extract"]
    fatal: list[str] = []
    loop.on_fatal = lambda reason, code=70: fatal.append(reason)
    await loop.start()  # returns at once: the connection is the loop task's business
    await asyncio.wait_for(polled.wait(), 5)
    assert Consumer.starts == 3 and not fatal
    await loop.stop()


async def test_a_failed_access_fold_sets_aside_each_record_once(p, monkeypatch):
    """The fold raises a bug: the batch's events become dead letters, and a record that
    was already one (it did not decode) is not set aside a second time."""
    from datetime import UTC, datetime

    from memstream.streams import access
    from memstream.topics.schemas import AccessEvent

    def broken(store: Any, events: Any) -> None:
        raise ValueError("bug")

    monkeypatch.setattr(access, "fold_access", broken)
    loop, _ = await loop_of(p, "access")
    topic = p.topics.memory_access.name
    hit = AccessEvent(event_id="e1", tenant_id="t1", user_id="u1", kind="hit",
                      memory_ids=["m1"], query_id="q1", ts=datetime.fromtimestamp(NOW, UTC))
    await loop.process(batch(record(topic, 0, b"t1/u1", b"{not json"),
                             record(topic, 1, b"t1/u1", hit.dumps())))
    dead = [json.loads(v) for v in sent(loop.task_manager.producer(0), p.topics.dead_letters.name)]
    assert sorted((d["offset"], d["kind"]) for d in dead) == [(0, "not_json"), (1, "internal")]
