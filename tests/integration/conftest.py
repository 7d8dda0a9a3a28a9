"""Integration fixtures: a real Kafka broker, uuid-named topics, worker subprocesses.

The broker, in order of preference:
1. ``MEMSTREAM_TEST_BOOTSTRAP`` (a broker someone already runs),
2. a testcontainers Kafka where a Docker engine answers,
3. the project's own broker from Maven Central jars (``memstream.dev.broker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import pytest_asyncio
from qdrant_client import QdrantClient

from memstream.client import AsyncMemoryClient
from memstream.core import kafka
from memstream.core.errors import MemstreamError
from memstream.core.kafka_io import TopicReader, send_events, send_raw, start_producer
from memstream.core.settings import Settings
from memstream.core.topic_reader import end_offsets
from memstream.dev import broker as local_broker
from memstream.dev.process import WorkerProcess
from memstream.memory.applying import apply_change
from memstream.memory.store.server import ServerStore
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import (
    ChatMessage,
    Event,
    ExtractionJob,
    JobResult,
    JobStatus,
    MemoryChange,
    SessionEvent,
)
from memstream.web.keys_topic import create_key

TEST_PORT = int(os.environ.get("MEMSTREAM_TEST_KAFKA_PORT", "19092"))


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    given = os.environ.get("MEMSTREAM_TEST_BOOTSTRAP")
    if given:
        yield given
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each process would start and stop its own
        pytest.fail("with pytest-xdist (-n), start a broker and name it in "
                    "MEMSTREAM_TEST_BOOTSTRAP (scripts/test.sh does)", pytrace=False)
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    settings = Settings(kafka_port=TEST_PORT, kafka_controller_port=TEST_PORT + 1)
    already = local_broker.read_pid(local_broker.paths_for(settings)) is not None
    local_broker.start(settings)
    yield f"127.0.0.1:{TEST_PORT}"
    if not already:
        local_broker.stop(settings)


class Harness:
    """One test's world: its own topics and app id, a producer, readers, workers."""

    def __init__(self, bootstrap: str, tmp: Path, **overrides: object) -> None:
        run = uuid.uuid4().hex[:10]
        base: dict[str, object] = {
            "bootstrap_servers": bootstrap, "topic_prefix": f"it-{run}", "app_id": f"it-{run}",
            "partitions": 2, "data_dir": tmp / "data", "tick_interval_s": 0.5,
            "web_enabled": False, "session_timeout_s": 10.0, "heartbeat_interval_s": 1.0,
            "extract_enabled": False,  # the ingest tests play the extractor themselves
            "cluster_secret": f"cluster-{run}-{uuid.uuid4().hex}",  # a test may run two
        }
        self.settings = Settings(**{**base, **overrides})  # type: ignore[arg-type]
        self.topics = registry(self.settings)
        self.tmp = tmp
        self.workers: list[WorkerProcess] = []
        self.producer = None
        self.jobs: TopicReader | None = None
        self.results: TopicReader | None = None
        self.dlq: TopicReader | None = None

    async def start(self) -> Harness:
        await create_topics(self.settings)
        self.producer = await start_producer(self.settings)
        b = self.settings
        self.jobs = await TopicReader(b, self.topics.jobs.name).start()
        self.results = await TopicReader(b, self.topics.job_results.name).start()
        self.dlq = await TopicReader(b, self.topics.dead_letters.name).start()
        return self

    def worker(self) -> WorkerProcess:
        w = WorkerProcess(self.settings, self.tmp / f"worker-{len(self.workers)}.log").start()
        self.workers.append(w)
        return w

    async def send(self, *events: Event) -> None:
        by_topic = {ChatMessage: self.topics.messages.name,
                    SessionEvent: self.topics.session_events.name,
                    JobResult: self.topics.job_results.name}
        for e in events:
            await send_events(self.producer, by_topic[type(e)], [e])

    async def send_raw(self, value: bytes | None, key: bytes | None) -> None:
        await send_raw(self.producer, self.topics.messages.name, value, key)

    async def complete(self, job: ExtractionJob, status: JobStatus = JobStatus.DONE) -> None:
        """Play the extractor: report the job's result (signed with the test's cluster
        secret, as every producer of core.kafka signs: the worker takes it)."""
        await self.send(JobResult.for_job(job, status, datetime.now(UTC)))

    async def wait_jobs(self, n: int, timeout: float = 30.0,
                        tenant: str | None = None) -> list[ExtractionJob]:
        assert self.jobs is not None
        await self.jobs.wait_for(lambda rs: len(self.job_list(tenant)) >= n, timeout)
        return self.job_list(tenant)

    async def ingested(self, messages: int, timeout: float = 30.0) -> None:
        """Barrier: the ingest loop has committed ``messages`` chat messages (its group's
        offsets on the messages topic, summed), state and outputs in the same transactions."""
        admin = kafka.admin(self.settings)
        await admin.start()
        deadline = time.monotonic() + timeout
        try:
            while (done := await self._ingest_committed(admin)) < messages:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {messages} messages committed")
                await asyncio.sleep(0.1)
        finally:
            await admin.close()

    async def ingest_caught_up(self, timeout: float = 30.0) -> None:
        """Barrier: every chat message on the topic so far is committed by the ingest loop."""
        topic = self.topics.messages.name
        ends = (await end_offsets(self.settings, [topic]))[topic]
        await self.ingested(sum(ends.values()), timeout)

    async def _ingest_committed(self, admin: Any) -> int:
        """The chat messages the ingest loop has committed so far (every test's)."""
        group, topic = f"{self.settings.app_id}-ingest", self.topics.messages.name
        found = await admin.list_consumer_group_offsets(group)
        return sum(max(0, o.offset) for tp, o in found.items() if tp.topic == topic)

    def job_list(self, tenant: str | None = None) -> list[ExtractionJob]:
        """Every job seen so far (of one tenant: tests sharing a worker keep apart)."""
        assert self.jobs is not None
        jobs = [ExtractionJob.model_validate_json(r.value) for r in self.jobs.records]
        return [j for j in jobs if tenant is None or j.tenant_id == tenant]

    def result_list(self, tenant: str | None = None) -> list[JobResult]:
        assert self.results is not None
        found = [JobResult.model_validate_json(r.value) for r in self.results.records]
        return [r for r in found if tenant is None or r.tenant_id == tenant]

    async def close(self) -> None:
        for w in self.workers:
            w.stop()
        for reader in (self.jobs, self.results, self.dlq):
            if reader is not None:
                await reader.stop()
        if self.producer is not None:
            await self.producer.stop()
        await delete_topics(self.settings, all_topic_names(self.settings))


@contextlib.asynccontextmanager
async def running(bootstrap: str, tmp: Path, **overrides: object) -> AsyncIterator[Harness]:
    """A harness with one worker started: for a module-scoped fixture shared by its tests."""
    h = await Harness(bootstrap, tmp, **overrides).start()
    try:
        h.worker()
        yield h
    finally:
        await h.close()


@pytest.fixture
def tenant() -> str:
    """A tenant of the test's own, on a worker shared with the module's other tests."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture
async def harness(kafka_bootstrap: str, tmp_path: Path):
    made: list[Harness] = []

    async def make(**overrides: object) -> Harness:
        h = await Harness(kafka_bootstrap, tmp_path, **overrides).start()
        made.append(h)
        return h

    yield make
    for h in made:
        await h.close()


def chat(text: str, *, session: str = "s1", user: str = "u1", tenant: str = "acme",
         mid: str | None = None, role: str = "user") -> ChatMessage:
    return ChatMessage(
        tenant_id=tenant, user_id=user, session_id=session,
        message_id=mid or uuid.uuid4().hex, role=role, content=text, ts=datetime.now(UTC),
    )


def end(session: str = "s1", user: str = "u1", tenant: str = "acme") -> SessionEvent:
    return SessionEvent(tenant_id=tenant, user_id=user, session_id=session,
                        ts=datetime.now(UTC))


# Ports for the tests' HTTP servers: below Linux's ephemeral range (32768-60999), so no
# client connection is given one meanwhile, and a block per pytest-xdist worker (gw0, gw1,
# ...), so two test processes never hand out the same port.
_PORT_BLOCK = 500
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_ports = iter(range(21000 + _PORT_BLOCK * int(_worker or 0),
                    21000 + _PORT_BLOCK * (int(_worker or 0) + 1)))


def free_port() -> int:
    """A port of this test process's block that nothing listens on now."""
    for port in _ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("this test process used its whole block of ports")


T = TypeVar("T")


async def until(probe: Callable[[], Awaitable[T | None]], what: str,
                timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something (a barrier on an observable state)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            got = await probe()
            if got is not None:
                return got
        except (MemstreamError, OSError) as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


# --- conversations, barriers and the change log, shared by the end-to-end modules ------------

@pytest.fixture
def cleanup() -> Iterator[Callable[[Settings], None]]:
    """Give it each topic set a test makes (its Settings); they are deleted after the test."""
    made: list[Settings] = []
    yield made.append

    async def drop() -> None:
        for s in made:
            await delete_topics(s, all_topic_names(s))

    asyncio.run(drop())


async def answering(base: str, key: str, path: str, what: str, timeout: float = 60.0) -> None:
    """Until the worker at ``base`` answers ``GET path`` with 200 for ``key`` (a barrier: the
    API is up, or a key just created has reached the worker's key view)."""
    async with httpx.AsyncClient(base_url=base) as web:
        async def ok() -> bool | None:
            r = await web.get(path, headers={"Authorization": f"Bearer {key}"})
            return True if r.status_code == 200 else None

        await until(ok, what, timeout=timeout)


async def tenant_key(h: Harness, base: str, tenant: str, path: str) -> str:
    """A new key of ``tenant``, once the worker at ``base`` takes it (``GET path``)."""
    key, _ = await create_key(h.settings, tenant)
    await answering(base, key, path, "the worker to know the new key")
    return key


def turns(user: str, session: str, texts: list[str], tenant: str = "acme"):
    out = []
    for text in texts:
        out.append(chat(text, user=user, session=session, tenant=tenant))
        out.append(chat("Noted.", user=user, session=session, role="assistant", tenant=tenant))
    return out


async def run_conversations(h, convs, tenant: str = "acme"):
    """Send each session and wait until the job results cover its messages. A session id
    sent before (the same user's ``{user}-s{i}`` in a later call) already has messages
    covered: the barrier counts on top of those, or it would pass before the new messages
    are in the store (and their job would land in the middle of whatever comes next)."""
    sent: dict[tuple[str, str], int] = {}
    for user, sessions in convs.items():
        for i, texts in enumerate(sessions):
            session = f"{user}-s{i}"
            msgs = turns(user, session, texts, tenant)
            before = covered_messages(h.results.records, tenant)[(user, session)]
            await h.send(*msgs, end(session=session, user=user, tenant=tenant))
            sent[(user, session)] = len(msgs)
            await wait_covered(h, {(user, session): before + len(msgs)}, tenant=tenant)
    return sent


def covered_messages(records, tenant: str) -> dict[tuple[str, str], int]:
    """Messages of each (user, session) the job results report done (or trivial)."""
    got: dict[tuple[str, str], int] = defaultdict(int)
    for r in records:
        res = JobResult.model_validate_json(r.value)
        if res.tenant_id == tenant and res.status in (JobStatus.DONE, JobStatus.TRIVIAL):
            got[(res.user_id, res.session_id)] += res.to_seq - res.from_seq
    return got


async def wait_covered(h, expected: dict[tuple[str, str], int], timeout: float = 60,
                       tenant: str = "acme"):
    def covered(records):
        got = covered_messages(records, tenant)
        return all(got[k] >= n for k, n in expected.items())

    try:
        await h.results.wait_for(covered, timeout)
    except TimeoutError as exc:
        seen = [JobResult.model_validate_json(r.value) for r in h.results.records]
        raise AssertionError(f"not covered {expected}; results: "
                             f"{[(r.session_id, r.from_seq, r.to_seq, r.status) for r in seen]}; "
                             f"jobs: {[(j.session_id, j.from_seq, j.to_seq) for j in h.job_list()]}"
                             ) from exc


async def rebuild(h, tenant: str = "acme") -> tuple[ServerStore, list[MemoryChange]]:
    reader = await TopicReader(h.settings,
                               h.topics.memory_changes.name).start()
    await reader.settle(1.5)
    await reader.stop()
    changes = [c for c in (MemoryChange.model_validate_json(r.value) for r in reader.records)
               if c.tenant_id == tenant]
    store = ServerStore("rebuilt", 512, client=QdrantClient(":memory:"))
    for change in sorted(changes, key=lambda c: c.decided_at):
        apply_change(store, change)
    return store, changes


async def remembered(h, client: AsyncMemoryClient, tenant: str, user: str, session: str,
                     texts: list[str]) -> None:
    await client.add([{"role": "user", "content": t} for t in texts], user_id=user,
                      session_id=session)
    await client.end_session(user_id=user, session_id=session)
    await wait_covered(h, {(user, session): len(texts)}, tenant=tenant)
