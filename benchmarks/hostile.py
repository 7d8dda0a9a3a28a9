"""Hostile-input benchmark on the real broker with one worker (not a test).

    .venv/bin/python benchmarks/hostile.py [--records 1000] [--bootstrap 127.0.0.1:19092]
    .venv/bin/python benchmarks/hostile.py --smoke --bootstrap HOST:PORT   # 50 records, 3 users

Produces ``--records`` hostile records of every poison class (randomly mixed, on every topic
the worker reads: messages, session events, job results, tool requests, extraction jobs,
decisions;
a few are 3 MB values sent gzip-compressed) with valid messages between them, to one worker
(ingest, extract and apply; rules model, hashing embedder). Then waits until every hostile
record has its dead letter and every valid message is covered by an extraction job.
Prints a table and, last, one JSON line: hostile records sent and dead-lettered, dead letters
of the wrong kind, agent crashes (tracebacks / "crashed" in the worker log), valid messages
lost (not covered by a job) and the dead-letter rate. Topics are uuid-named and deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from memstream.core.kafka_io import TopicReader, send_events, start_producer
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import (
    Topics,
    all_topic_names,
    delete_topics,
    registry,
)
from memstream.topics.schemas import ChatMessage, DeadLetter, ExtractionJob, SessionEvent

FACTS = ["I moved to {c} last month", "We have {n} kids", "I work at {c} Labs",
         "I am allergic to nuts", "My budget this month is {n}k", "我住在{c}"]
CITIES = ["Berlin", "Munich", "Lisbon", "Shanghai", "Oslo"]
POISON_JOB = "bench-poison-job"
CRASH = re.compile(r"Traceback|Crashed reason|crashed", re.IGNORECASE)


@dataclass(frozen=True)
class Hostile:
    topic: str
    value: bytes | None
    key: bytes | None
    kind: str  # the dead letter's expected kind
    name: str  # the poison class
    gzip: bool = False


def enc(obj: object) -> bytes:
    return json.dumps(obj).encode()


def verbatim(obj: dict[str, Any], name: str, literal: str) -> bytes:
    return enc(obj)[:-1] + f', "{name}": {literal}}}'.encode()


class Poison:
    """Builders of each poison class for one user; ``rng`` varies the details."""

    def __init__(self, topics: Topics, tenant: str, user: str, rng: random.Random) -> None:
        self.t, self.tenant, self.user, self.rng = topics, tenant, user, rng
        self.key = f"{tenant}/{user}".encode()

    def good(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant, "user_id": self.user, "session_id": "s1",
                "message_id": uuid.uuid4().hex, "role": "user", "content": "poison",
                "ts": datetime.now(UTC).isoformat(), "metadata": {"via": "bench"}}

    def job_range(self) -> dict[str, Any]:
        return {"job_id": POISON_JOB, "tenant_id": self.tenant, "user_id": self.user,
                "session_id": "s1", "from_seq": 0, "to_seq": 1}

    @staticmethod
    def misshapen(g: dict[str, Any]) -> list[Any]:
        return [{k: v for k, v in g.items() if k != "role"}, {**g, "role": 5},
                {**g, "user_id": "../etc"}, [g], "text"]

    @staticmethod
    def oversized(g: dict[str, Any]) -> list[Any]:
        return [{**g, "content": "x" * 300_000},
                {**g, "metadata": {f"k{i}": i for i in range(30_000)}}]

    def msg(self, value: bytes | None, kind: str, name: str, key: bytes | None = b"",
            gzip: bool = False) -> Hostile:
        return Hostile(self.t.messages.name, value, self.key if key == b"" else key, kind,
                       name, gzip)

    def build(self, name: str) -> Hostile:
        r, g = self.rng, self.good()
        lone = chr(r.randint(0xD800, 0xDFFF))
        build: dict[str, Callable[[], Hostile]] = {
            "not_json": lambda: self.msg(r.choice([b"{not json", b"\xff\xfe\x00{", b'{"a": 1',
                                                   b"\xed\xa0\x80"]), "not_json", "not_json"),
            "deep_array": lambda: self.msg(
                b"[" * (n := r.randint(33, 100_000)) + b"]" * n, "depth", "deep_array"),
            "deep_object": lambda: self.msg(
                b'{"a":' * (n := r.randint(33, 40_000)) + b"1" + b"}" * n, "depth",
                "deep_object"),
            "big_int": lambda: self.msg(verbatim(g, "n", "9" * r.randint(21, 5000)),
                                        "number", "big_int"),
            "non_finite": lambda: self.msg(
                verbatim(g, "x", r.choice(["NaN", "Infinity", "-Infinity", "1e999"])),
                "number", "non_finite"),
            "bad_date": lambda: self.msg(enc({**g, "ts": r.choice([
                "0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00",
                "1969-07-20T20:17:00Z"])}), "date", "bad_date"),
            "surrogate": lambda: self.msg(enc(r.choice([
                {**g, "content": f"hi {lone}"}, {**g, "metadata": {lone: 1}},
                {**g, "extra": [{"deep": lone}]}])), "unicode", "surrogate"),
            "version": lambda: self.msg(
                enc({**g, "schema_version": r.choice([True, 1.0, "1", 2, None, [1]])}),
                "version", "version"),
            "null_key": lambda: self.msg(enc(g), "key", "null_key", key=None),
            "other_key": lambda: self.msg(enc(g), "key", "other_key",
                                          key=f"{self.tenant}/someone-else".encode()),
            "empty": lambda: self.msg(r.choice([None, b""]), "empty", "empty"),
            "schema": lambda: self.msg(enc(r.choice(self.misshapen(g))), "schema", "schema"),
            "too_large": lambda: self.msg(enc(r.choice(self.oversized(g))), "too_large",
                                          "too_large"),
            "gzip_3mb": lambda: self.msg(
                enc({**g, "content": "remember this " * 230_000}), "too_large", "gzip_3mb",
                gzip=True),
            "session_event": lambda: Hostile(self.t.session_events.name, enc(
                {"tenant_id": self.tenant, "user_id": self.user, "session_id": "s1",
                 "ts": "0001-01-01T00:00:00+01:00"}), self.key, "date", "session_event"),
            "job_result": lambda: Hostile(self.t.job_results.name, verbatim(
                {**self.job_range(), "status": "done", "finished_at": g["ts"]},
                "llm_calls", "NaN"), self.key, "number", "job_result"),
            "tool_request": lambda: Hostile(self.t.tool_requests.name, enc(
                {"request_id": "r1", "tenant_id": self.tenant, "user_id": self.user,
                 "principal": "agent", "write": {"name": "memory_insert", "content": "x"},
                 "ts": g["ts"], "x": lone}), self.key, "unicode", "tool_request"),
            "job": lambda: Hostile(self.t.jobs.name, enc(
                {**self.job_range(), "reason": "threshold", "created_at": g["ts"],
                 "messages": [{"seq": 0, "message_id": "m", "role": "user", "content": "hi",
                               "ts": "0001-01-01T00:00:00+01:00"}]}), self.key, "date", "job"),
            "decision": lambda: Hostile(self.t.decisions.name, verbatim(
                {**self.job_range(), "status": "done"}, "llm_calls", "7" * 4000), self.key,
                "number", "decision"),
        }
        return build[name]()


CLASSES = ["not_json", "deep_array", "deep_object", "big_int", "non_finite", "bad_date",
           "surrogate", "version", "null_key", "other_key", "empty", "schema", "too_large",
           "gzip_3mb", "session_event", "job_result", "tool_request", "job", "decision"]


def valid_message(rng: random.Random, tenant: str, user: str, n: int) -> ChatMessage:
    text = rng.choice(FACTS).format(c=rng.choice(CITIES), n=rng.randint(1, 9))
    return ChatMessage(tenant_id=tenant, user_id=user, session_id="s1",
                       message_id=f"{user}-valid-{n}", role="user", content=text,
                       ts=datetime.now(UTC))


async def produce(settings: Settings, records: int, users: int, seed: int
                  ) -> tuple[dict[tuple[str, int, int], Hostile], set[str], float]:
    """Send the hostile mix; returns where each hostile record landed and the valid ids."""
    rng = random.Random(seed)
    topics = registry(settings)
    tenant = "bench"
    plain = await start_producer(settings, max_request_size=2 * 1024 * 1024)
    gzip = await start_producer(settings, compression_type="gzip",
                                max_request_size=8 * 1024 * 1024)
    sent: dict[tuple[str, int, int], Hostile] = {}
    valid: list[ChatMessage] = []
    start = time.monotonic()
    try:
        pending: list[tuple[asyncio.Future[Any], Hostile]] = []
        for i in range(records):
            user = f"u{rng.randrange(users)}"
            h = Poison(topics, tenant, user, rng).build(rng.choice(CLASSES))
            producer: AIOKafkaProducer = gzip if h.gzip else plain
            pending.append((await producer.send(h.topic, value=h.value, key=h.key), h))
            if rng.random() < 0.3:
                valid.append(valid_message(rng, tenant, user, i))
                await send_events(plain, topics.messages.name, valid[-1:])
        for fut, h in pending:
            meta = await fut
            sent[(meta.topic, meta.partition, meta.offset)] = h
        ends = [SessionEvent(tenant_id=tenant, user_id=f"u{u}", session_id="s1",
                             ts=datetime.now(UTC)) for u in range(users)]
        await send_events(plain, topics.session_events.name, ends)
    finally:
        await plain.stop()
        await gzip.stop()
    return sent, {m.message_id for m in valid}, start


def covered(records: list[Any]) -> set[str]:
    ids: set[str] = set()
    for r in records:
        try:
            job = ExtractionJob.model_validate_json(r.value)
        except ValueError:
            continue
        if job.job_id != POISON_JOB:
            ids |= {m.message_id for m in job.messages}
    return ids


async def run(base: Settings, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    name = f"bench-hostile-{uuid.uuid4().hex[:6]}"
    settings = base.model_copy(update={"topic_prefix": name, "app_id": name,
                                       "data_dir": work / name})
    await create_topics(settings)
    topics = registry(settings)
    dlq = await TopicReader(settings, topics.dead_letters.name).start()
    jobs = await TopicReader(settings, topics.jobs.name).start()
    worker = WorkerProcess(settings, work / f"{name}.log").start()
    try:
        sent, valid, t0 = await produce(settings, args.records, args.users, args.seed)
        letters: dict[tuple[str, int, int], DeadLetter] = {}

        def all_in(records: list[Any]) -> bool:
            for r in records[len(letters):]:
                d = DeadLetter.model_validate_json(r.value)
                letters[(d.source_topic, d.partition, d.offset)] = d
            return set(sent) <= set(letters)

        with contextlib.suppress(TimeoutError):  # reported as not dead-lettered
            await dlq.wait_for(all_in, timeout=args.timeout)
        t_letters = time.monotonic() - t0
        with contextlib.suppress(TimeoutError):  # reported as lost
            await jobs.wait_for(lambda rs: covered(rs) >= valid, timeout=args.timeout)
        exit_code = worker.proc.poll() if worker.proc else None
    finally:
        worker.stop()
        await dlq.stop()
        await jobs.stop()
        await delete_topics(settings, all_topic_names(settings))
    log_lines = worker.log_path.read_text(errors="replace").splitlines()
    wrong = [(h.name, h.kind, letters[at].kind) for at, h in sent.items()
             if at in letters and letters[at].kind != h.kind]
    return {
        "hostile_sent": len(sent),
        "dead_lettered": sum(at in letters for at in sent),
        "wrong_kind": len(wrong),
        "agent_crashes": sum(bool(CRASH.search(line)) for line in log_lines),
        "worker_exit_code": exit_code,
        "valid_sent": len(valid),
        "valid_lost": len(valid - covered(jobs.records)),
        "dead_letters_per_s": round(len(letters) / max(t_letters, 1e-9), 1),
        "largest_dead_letter_bytes": max((len(d.model_dump_json()) for d in letters.values()),
                                         default=0),
        "by_class": dict(sorted(Counter(h.name for h in sent.values()).items())),
        "wrong_examples": wrong[:5],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=None,
                    help="hostile records (default 1000; smoke 50: every class)")
    ap.add_argument("--users", type=int, default=None, help="default 10 (smoke 3)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=None, help="s (default 300; smoke 60)")
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny, to check it runs: 50 records of 3 users, 60 s timeouts")
    args = ap.parse_args()
    smoke = {"records": 50, "users": 3, "timeout": 60.0}
    full = {"records": 1000, "users": 10, "timeout": 300.0}
    for name, value in (smoke if args.smoke else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    base = Settings(bootstrap_servers=args.bootstrap, partitions=4, extract_enabled=True,
                    embedder="hashing", llm="rules", idle_timeout_s=5.0, tick_interval_s=1.0)
    work = Path(tempfile.mkdtemp(prefix="memstream-hostile-"))
    result = asyncio.run(run(base, args, work))
    rows = [("hostile records sent (classes)", f"{result['hostile_sent']} "
                                               f"({len(result['by_class'])})"),
            ("dead-lettered", result["dead_lettered"]),
            ("dead letters of the wrong kind", result["wrong_kind"]),
            ("agent crashes (log)", result["agent_crashes"]),
            ("worker exit code (None: still running)", result["worker_exit_code"]),
            ("valid messages sent / lost", f"{result['valid_sent']} / {result['valid_lost']}"),
            ("dead letters per second", result["dead_letters_per_s"]),
            ("largest dead letter, bytes", result["largest_dead_letter_bytes"])]
    print(f"{'metric':44} value")
    for label, value in rows:
        print(f"{label:44} {value}")
    print(json.dumps({"benchmark": "hostile", "smoke": args.smoke, **result}))


if __name__ == "__main__":
    main()
