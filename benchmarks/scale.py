"""Scale-out benchmark: workers join, crash, stop and return under load on the partitioned
embedded store; are memories kept, reads answered, partitions moved quickly? (not a test)

    .venv/bin/python benchmarks/scale.py [--users 200] [--partitions 12] [--seed 7]
        [--rate R] [--burst 6000] [--read-rate 20] [--session-timeout 30] [--port 49092]
        [--keep] [--reuse-broker] [--bootstrap HOST:PORT]
    .venv/bin/python benchmarks/scale.py --smoke [--bootstrap HOST:PORT]   # 2 workers, ~40 s

It starts its own broker (``--port``, stopped at the end; with ``--bootstrap`` it uses that
running broker instead and never starts or stops one) and workers with
``store_partitioned`` (one Qdrant Edge shard per partition, standby shards on the other
workers), each with its own data dir, API port and group instance id (w1, w2, w3: the
assignor orders workers by id). Conversations of ``--users`` users are produced all along
(chaos.py's people: moves, children, allergies, notes, an employer, a retracted habit; the
final value of each fact is known). The timeline:

- w1 alone; a throughput phase (below); then a steady load of ``--rate`` msg/s (default
  0.3 x the one-worker figure) until the end;
- w2 joins under load, a throughput phase with 2; w3 joins, one with 3;
- w2 is SIGKILLed, w3 is SIGTERMed (a scale-in: it leaves its groups as it
  stop, `leave_group_on_stop`), a throughput phase with w1 alone again, w2 comes back.

``--smoke``: 20 users, 4 partitions, 10 reads/s; w1, a phase (a burst of 100), w2 joins,
w2 SIGKILLed and started again at once (its static membership takes its partitions back).

A throughput phase pauses the steady load, waits until nothing more is covered, produces
``--burst`` events at once and measures messages/s: the messages job results newly cover
(done / trivial, per session as chaos.py counts them) between 10% and 90% of what the
phase covered, over the seconds between. The machine is shared and small: quote ratios.

A reader asks every live worker in turn (list memories, search) at ``--read-rate`` and
records per request the worker asked, the status, ``X-Memstream-Served-By`` and
``X-Memstream-Standby`` and the latency. At the end every session is ended, the run waits
until every message is covered, and then checks each user's live memories as every live
worker answers (chaos.check) and as the memory-change topic replays (chaos.replay), change
ids with two payloads, memory versions two different changes opened, answers of non-owners
against the owner's (and, during the run, list answers holding a text twice or two values
of a one-value fact), the failed reads around each join, crash or stop, partition move ->
serving times (from the happening to the new owner's "shard N: promoted / caught up /
restored" log line; restores also from GET /v1/cluster) and the workers' log problems.
Prints a table, then one JSON line (last on stdout). Exits non-zero only when it could not
run (broker or a worker did not start). ``--keep`` keeps the work dir (worker logs and
data dirs, ``requests.jsonl``), the topics and the broker's data.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks.chaos import (
    _wire,
    bench_settings,
    change_stats,
    check,
    decision_stats,
    free_port,
    http_live,
    read_topics,
    replay,
)
from benchmarks.scale_checks import (
    LABELS,
    TENANT,
    Coverage,
    Happening,
    Req,
    Stream,
    Take,
    conflicting,
    drain_rate,
    duplicated,
    failure_windows,
    first_join,
    log_lines,
    move_summary,
    move_times,
    problems,
    request_stats,
    takes,
    version_conflicts,
    wrong_answers,
)
from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import WorkerProcess
from memstream.memory.store.partitioned import partition_of
from memstream.ops.status import serves_what_it_owns
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, Event, MemoryChange, SessionEvent

QUERIES = ("where do I live?", "am I allergic to anything?", "how many children do I have?",
           "where do I work?", "我住在哪里？")


class CouldNotRun(Exception):
    """The broker or a worker did not start: the benchmark did not run (exit 2)."""


@dataclass(frozen=True)
class Plan:
    """Sizes and the timeline of one run."""

    users: int
    partitions: int
    burst: int
    hold_s: float
    quiet_s: float  # nothing newly covered this long: a backlog is drained
    session_timeout_s: float
    # (tput, label) or (join | sigkill | sigterm | back | restart, worker)
    steps: tuple[tuple[str, str], ...]


FULL_STEPS = (("tput", "1"), ("join", "w2"), ("tput", "2"), ("join", "w3"), ("tput", "3"),
              ("sigkill", "w2"), ("sigterm", "w3"), ("tput", "1 again"), ("back", "w2"))
SMOKE_STEPS = (("tput", "1"), ("join", "w2"), ("restart", "w2"))


# --------------------------------------------------------------------------- load


class Feeder:
    """One idempotent producer: a steady ``rate`` (events/s) taken from the stream in the
    background, and bursts sent as fast as it goes (the steady load paused meanwhile)."""

    def __init__(self, settings: Settings, stream: Stream) -> None:
        self.settings, self.stream = settings, stream
        self.topics = registry(settings)
        self.producer: Any = None
        self.rate = 0.0
        self.messages = 0
        self.lock = asyncio.Lock()
        self.pending: list[asyncio.Future[Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.producer = await start_producer(self.settings, request_timeout_ms=120_000)
        self.task = asyncio.create_task(self._steady(), name="steady-load")

    async def send(self, events: Sequence[Event]) -> None:
        async with self.lock:
            for e in events:
                topic, value, key = _wire(e, self.topics, True)  # stamped now: in order
                self.pending.append(await self.producer.send(topic, value, key=key))
                self.messages += isinstance(e, ChatMessage)
            while self.pending and self.pending[0].done():
                self.pending.pop(0).result()  # a failed send ends the run (no broker chaos)

    async def flush(self) -> None:
        async with self.lock:
            await self.producer.flush()
            for fut in self.pending:
                await fut
            self.pending.clear()

    async def _steady(self) -> None:
        last, credit = time.monotonic(), 0.0
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            credit = credit + (now - last) * self.rate if self.rate > 0 else 0.0
            last = now
            if credit >= 1:
                n = int(credit)
                credit -= n
                await self.send(self.stream.take(n))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.producer is not None:
            await self.producer.stop()


class Reader:
    """Reads (list memories, search) sent to every live worker in turn at ``rate``/s, each
    recorded as a :class:`Req`."""

    def __init__(self, key: str, users: Sequence[str], partitions: int, seed: int,
                 rate: float, inflight: int = 32) -> None:
        self.headers = {"X-API-Key": key}
        self.users, self.partitions = list(users), partitions
        self.rng = random.Random(seed)
        self.rate, self.inflight = rate, inflight
        self.targets: dict[str, str] = {}  # worker -> URL, those in the rotation
        self.reqs: list[Req] = []
        self.stopped = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def add(self, worker: str, url: str) -> None:
        self.targets[worker] = url

    def remove(self, worker: str) -> None:
        self.targets.pop(worker, None)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="reader")

    async def stop(self) -> None:
        self.stopped.set()
        if self.task is not None:
            await self.task

    async def _run(self) -> None:
        slots = asyncio.Semaphore(self.inflight)
        running: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=40)) as session:
            start, i = time.monotonic(), 0
            while not self.stopped.is_set():
                delay = start + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                targets = list(self.targets.items())
                i += 1
                if not targets:
                    continue
                worker, url = targets[i % len(targets)]
                user = self.rng.choice(self.users)
                kind = "list" if i % 2 else "search"
                await slots.acquire()
                task = asyncio.create_task(self._one(session, worker, url, user, kind))
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(lambda _: slots.release())
            await asyncio.gather(*running, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession, worker: str, url: str, user: str,
                   kind: str) -> None:
        base = f"{url}/v1/tenants/{TENANT}/users/{user}"
        req = Req(time.time(), 0.0, worker, user,
                  partition_of(TENANT, user, self.partitions), kind, 0)
        try:
            if kind == "list":
                call = session.get(f"{base}/memories?limit=500", headers=self.headers)
            else:
                call = session.post(f"{base}/search", headers=self.headers,
                                    json={"query": self.rng.choice(QUERIES), "k": 5})
            async with call as resp:
                body = await resp.read()
                req.status = resp.status
                req.served_by = resp.headers.get("X-Memstream-Served-By")
                req.standby = resp.headers.get("X-Memstream-Standby") == "1"
            if req.status == 200 and kind == "list":
                texts = [m["content"] for m in json.loads(body)["memories"]
                         if m.get("slot") != "reflection:profile"]
                req.duplicated, req.conflicting = duplicated(texts), conflicting(texts)
            elif req.status != 200:
                req.error = body[:200].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            req.error = f"{type(exc).__name__}: {exc}"[:200]
        req.end = time.time()
        self.reqs.append(req)


# --------------------------------------------------------------------------- the run


@dataclass
class Node:
    worker: str
    settings: Settings
    proc: WorkerProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.web_port}"


class Run:
    def __init__(self, plan: Plan, base: Settings, work: Path, seed: int,
                 rate: float | None, read_rate: float) -> None:
        self.plan, self.base, self.work, self.seed = plan, base, work, seed
        self.stream = Stream(plan.users, seed)
        self.coverage = Coverage()
        self.feeder = Feeder(base, self.stream)
        assert base.admin_key is not None
        self.key = base.admin_key.get_secret_value()
        self.reader = Reader(self.key, self.stream.users, plan.partitions, seed, read_rate)
        self.rate_arg = rate
        self.nodes: dict[str, Node] = {}
        self.live: list[str] = []
        self.map: dict[int, str] = {}
        self.happenings: list[Happening] = []
        self.phases: list[dict[str, Any]] = []
        self.last_status: dict[tuple[str, int], dict[str, Any]] = {}  # (worker, pid) -> GET
        self.unstable: list[str] = []
        self.notes: list[str] = []
        self.session: aiohttp.ClientSession | None = None
        self.t0 = time.time()

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.t0:7.1f}s] {text}", flush=True)

    # ---- workers ---------------------------------------------------------------------

    def node(self, worker: str) -> Node:
        if worker not in self.nodes:
            settings = self.base.model_copy(update={
                "data_dir": self.work / worker, "web_port": free_port(),
                "group_instance_id": worker})
            self.nodes[worker] = Node(worker, settings,
                                      WorkerProcess(settings, self.work / f"{worker}.log"))
        return self.nodes[worker]

    async def get_json(self, url: str, path: str) -> dict[str, Any] | None:
        assert self.session is not None
        try:
            async with self.session.get(url + path, headers={"X-API-Key": self.key},
                                        timeout=aiohttp.ClientTimeout(total=5)) as r:
                return await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def status(self, worker: str) -> dict[str, Any] | None:
        node = self.nodes[worker]
        got = await self.get_json(node.url, "/v1/cluster")
        if got is not None and node.proc.current is not None:
            self.last_status[(worker, node.proc.current.pid)] = got
        return got

    async def spawn(self, worker: str) -> Node:
        node = self.node(worker)
        node.proc.spawn()
        if not await node.proc.wait_ready_async(240):
            raise CouldNotRun(f"{worker} did not become ready; its log ends:\n"
                              f"{node.proc.log_text()[-3000:]}")
        deadline = time.monotonic() + 60
        while await self.get_json(node.url, "/v1/health") is None:
            if time.monotonic() > deadline or not node.proc.alive():
                raise CouldNotRun(f"{worker}'s API does not answer; see {node.proc.log_path}")
            await asyncio.sleep(0.2)
        self.live.append(worker)
        self.reader.add(worker, node.url)
        return node

    async def stable(self, timeout: float = 240.0, warm_timeout: float = 90.0,
                     ) -> tuple[dict[int, str], float | None, float | None]:
        """Wait until every live worker reports the same map of exactly the live workers,
        its groups aligned and every partition it owns serving; then (up to
        ``warm_timeout`` more) until every standby shard is restored. Returns the map and
        when each was first seen."""
        deadline = time.monotonic() + timeout
        stable_at: float | None = None
        the_map: dict[int, str] = {}
        seen_map: dict[int, str] = {}
        while time.monotonic() < deadline:
            got = await asyncio.gather(*(self.status(w) for w in self.live))
            ok = all(s is not None for s in got) and bool(got)
            maps = []
            warm = True
            for s in got:
                if s is None:
                    break
                owners = {int(p): v["owner"] for p, v in s["partitions"].items()}
                maps.append(owners)
                seen_map = owners
                standby = {p for p, v in s["partitions"].items() if s["worker"] in v["standbys"]}
                warm = warm and all(s["shards"].get(p) == "standby" for p in standby)
                ok = ok and (set(s["workers"]) == set(self.live) and s["groups_aligned"] is True
                             and serves_what_it_owns(s) and len(owners) == self.plan.partitions)
            ok = ok and all(m == maps[0] for m in maps)
            now = time.time()
            if ok:
                if stable_at is None or maps[0] != the_map:
                    stable_at, the_map = now, maps[0]
                if warm:
                    return the_map, stable_at, now
                if now - stable_at > warm_timeout:
                    self.unstable.append(f"standbys not warm {warm_timeout:.0f}s after stable "
                                         f"({sorted(self.live)})")
                    return the_map, stable_at, None
            else:
                stable_at = None
            await asyncio.sleep(0.5)
        self.unstable.append(f"not stable after {timeout:.0f}s ({sorted(self.live)})")
        return seen_map, None, None

    async def join(self, worker: str, kind: str, killed_at: float | None = None) -> None:
        """A worker started (``killed_at``: SIGKILLed then, started again at once)."""
        node = self.node(worker)
        offset = node.proc.log_path.stat().st_size if node.proc.log_path.exists() else 0
        if killed_at is None:
            self.log(f"{kind} {worker}")
        await self.spawn(worker)
        before = dict(self.map)
        self.map, stable_at, warm_at = await self.stable()
        at = killed_at or first_join(log_lines(node.proc.log_path, offset))
        current = node.proc.current
        assert current is not None
        if at is None:
            at = current.ready_at or current.spawned_at
        self.happenings.append(Happening(kind, worker, at, before, dict(self.map), stable_at,
                                         warm_at))
        self.log(f"{kind} {worker}: {self.stable_text(stable_at, at)}, map "
                 f"{self.owners_text()}")

    async def end(self, worker: str, kind: str) -> None:
        node = self.nodes[worker]
        await self.status(worker)  # its restores and counters, before they are gone
        self.reader.remove(worker)
        self.live.remove(worker)
        at = time.time()
        self.log(f"{kind} {worker}")
        if kind in ("sigkill", "restart"):
            await asyncio.to_thread(node.proc.kill)
            if kind == "restart":  # at once: its static membership takes its partitions back
                await self.join(worker, kind, killed_at=at)
                return
        else:
            code = await asyncio.to_thread(node.proc.stop, 60.0)
            self.notes.append(f"{worker} SIGTERM: exited {code} after {time.time() - at:.1f}s")
        before = dict(self.map)
        self.map, stable_at, warm_at = await self.stable()
        self.happenings.append(Happening(kind, worker, at, before, dict(self.map), stable_at,
                                         warm_at))
        self.log(f"{kind} {worker}: {self.stable_text(stable_at, at)}, map "
                 f"{self.owners_text()}")

    @staticmethod
    def stable_text(stable_at: float | None, at: float) -> str:
        return "NOT STABLE" if stable_at is None else f"stable after {stable_at - at:.1f}s"

    def owners_text(self) -> str:
        by: dict[str, list[int]] = {}
        for p, w in sorted(self.map.items()):
            by.setdefault(w, []).append(p)
        return " ".join(f"{w}:{ps}" for w, ps in sorted(by.items())).replace(" ", "")

    # ---- progress ----------------------------------------------------------------------

    async def track(self) -> None:
        """Every job result (read_committed) into the coverage, for the whole run."""
        await follow_results(self.base, self.coverage)

    async def quiet(self, seconds: float, timeout: float, until: int = 0) -> bool:
        """Until nothing new has been covered for ``seconds``, once ``until`` messages more
        than now are covered (a backlog's first results take a while)."""
        start, covered = time.time(), self.coverage.covered
        while time.time() - start < timeout:
            if (self.coverage.covered - covered >= until
                    and time.time() - max(self.coverage.last_gain, start) >= seconds):
                return True
            await asyncio.sleep(0.25)
        return False

    async def throughput(self, label: str) -> None:
        rate, self.feeder.rate = self.feeder.rate, 0.0
        await self.feeder.flush()
        drained = await self.quiet(self.plan.quiet_s, 300.0)
        load = os.getloadavg()[0]
        events = self.stream.take(self.plan.burst)
        messages = sum(isinstance(e, ChatMessage) for e in events)
        start, covered = time.time(), self.coverage.covered
        await self.feeder.send(events)
        await self.feeder.flush()
        produced_s = time.time() - start
        # most of the burst covered (the tail of a session cut by the burst's end waits for
        # the rest of it), then nothing more for a while
        await self.quiet(self.plan.quiet_s + 1.0, 600.0,
                         until=max(0, int(0.6 * messages) - (self.coverage.covered - covered)))
        done = await self.quiet(self.plan.quiet_s + 1.0, 600.0)
        end = time.time()
        figures = drain_rate(self.coverage.stamps, start, end)
        self.phases.append({"workers": label, "live": sorted(self.live), "messages": messages,
                            "produced_s": round(produced_s, 1), "load_before": round(load, 2),
                            "drained_before": drained, "quiet_after": done, **figures})
        self.log(f"throughput with {label}: {figures.get('msg_per_s')} msg/s "
                 f"({figures['covered']} covered, load {load:.1f})")
        self.feeder.rate = rate

    async def settle(self, timeout: float, stall_s: float = 150.0) -> dict[str, Any]:
        """The rest of every session begun, then every session ended (again), then wait
        until every message is covered by a done / trivial result."""
        self.feeder.rate = 0.0
        await self.feeder.flush()
        started = time.time()
        await self.feeder.send(self.stream.finish())
        ends = [SessionEvent(tenant_id=TENANT, user_id=u, session_id=s, ts=datetime.now(UTC))
                for u, s in self.stream.expected]
        await self.feeder.send(ends)
        await self.feeder.flush()
        self.log(f"settling: {self.feeder.messages} messages produced, "
                 f"{len(self.stream.expected)} sessions")
        expected = self.stream.expected
        left = self.coverage.uncovered(expected)
        progress = time.monotonic()
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline and time.monotonic() - progress < stall_s:
            await asyncio.sleep(1.0)
            now_left = self.coverage.uncovered(expected)
            if len(now_left) < len(left):
                progress = time.monotonic()
            left = now_left
        return {"sessions": len(expected), "sessions_covered": len(expected) - len(left),
                "uncovered_examples": [list(x) for x in left[:5]],
                "settle_s": round(time.time() - started, 1)}

    # ---- checks ------------------------------------------------------------------------

    async def checks(self) -> dict[str, Any]:
        truth = self.stream.truth()
        users = sorted(truth)
        out: dict[str, Any] = {"views": {}}
        answers: dict[str, dict[str, list[str]]] = {}
        for worker in sorted(self.live):
            try:
                answers[worker] = await asyncio.to_thread(http_live, self.nodes[worker].settings,
                                                          users)
            except OSError as exc:
                self.notes.append(f"http view of {worker} failed: {exc}")
                continue
            rep = check(truth, answers[worker], f"http@{worker}")
            out["views"][rep.view] = {**rep.counts(), "examples": {
                k: [list(x) for x in getattr(rep, k)[:5]]
                for k in ("missing", "stale", "duplicate", "unexpected") if getattr(rep, k)}}
        owner_of = {u: self.map.get(partition_of(TENANT, u, self.plan.partitions), "?")
                    for u in users}
        out["wrong_answers"] = wrong_answers(answers, owner_of)
        topics = registry(self.base)
        records = await read_topics(self.base, [(topics.memory_changes.name,
                                                 topics.memory_changes.partitions)])
        changes = [MemoryChange.model_validate_json(r.value) for r in records]
        out["changes"] = change_stats(changes)
        out["versions"] = version_conflicts(changes)
        decisions = await read_topics(self.base, [(topics.decisions.name,
                                                   topics.decisions.partitions)])
        out["decisions"] = decision_stats(r.value for r in decisions)
        replayed, failed = await asyncio.to_thread(replay, changes)
        rep = check(truth, replayed, "replay")
        out["views"]["replay"] = {**rep.counts(), "failed_changes": len(failed), "examples": {
            k: [list(x) for x in getattr(rep, k)[:5]]
            for k in ("missing", "stale", "duplicate", "unexpected") if getattr(rep, k)}}
        return out

    def restores(self) -> dict[str, Any]:
        """Every restore a worker reported at GET /v1/cluster (the last seen answer of each
        process), and the shard takes of the logs by kind."""
        rows = [r for s in self.last_status.values() for r in s.get("restores", [])]
        changes = sum(r["changes"] for r in rows)
        seconds = sum(r["seconds"] for r in rows)
        counters: dict[str, dict[str, int]] = {}
        for (worker, pid), s in sorted(self.last_status.items()):
            counters[f"{worker}/{pid}"] = s.get("requests", {})
        return {"n": len(rows), "changes": changes, "seconds": round(seconds, 2),
                "changes_per_s": round(changes / seconds, 1) if seconds > 0 else None,
                "request_counters": counters}

    def log_figures(self) -> tuple[list[Take], dict[str, Any]]:
        all_takes: list[Take] = []
        found: dict[str, Any] = {}
        for worker, node in sorted(self.nodes.items()):
            lines = log_lines(node.proc.log_path)
            all_takes += takes(worker, lines)
            counts, examples = problems(lines)
            found[worker] = {"counts": counts, "examples": examples,
                             "log": str(node.proc.log_path),
                             "exits": [{"pid": i.pid, "code": i.exit_code, "killed": i.killed}
                                       for i in node.proc.incarnations
                                       if i.ended_at is not None]}
        return all_takes, found

    async def run(self) -> dict[str, Any]:
        await create_topics(self.base)
        self.session = aiohttp.ClientSession()
        tracker = asyncio.create_task(self.track(), name="job-results")
        await self.feeder.start()
        self.reader.start()
        figures: dict[str, Any] = {}
        try:
            await self.join("w1", "start")
            first = self.nodes["w1"].proc.current
            assert first is not None and first.ready_at is not None
            figures["first_ready_s"] = round(first.ready_at - first.spawned_at, 1)
            for step, arg in self.plan.steps:
                if step == "tput":
                    await self.throughput(arg)
                    if self.feeder.rate == 0:  # after the first phase: the steady load
                        one = self.phases[0].get("msg_per_s") or 100.0
                        self.feeder.rate = self.rate_arg or max(10.0, min(300.0, 0.3 * one))
                        self.log(f"steady load: {self.feeder.rate:.0f} events/s")
                elif step in ("join", "back"):  # sigkill, sigterm, restart: end()
                    await self.join(arg, step)
                else:
                    await self.end(arg, step)
                await asyncio.sleep(self.plan.hold_s)
            figures["steady_rate"] = round(self.feeder.rate, 1)
            figures.update(await self.settle(900.0))
            self.map, _, _ = await self.stable(timeout=120.0, warm_timeout=10.0)
            end = time.time()
            for i, h in enumerate(self.happenings):
                h.until = self.happenings[i + 1].at if i + 1 < len(self.happenings) else end
            await self.reader.stop()
            figures.update(await self.checks())
            for w in self.live:
                await self.status(w)
        finally:
            await self.reader.stop()
            tracker.cancel()
            await asyncio.gather(tracker, return_exceptions=True)
            await self.feeder.stop()
            await self.session.close()
        with (self.work / "requests.jsonl").open("w") as f:  # the reads, for a closer look
            for r in self.reader.reqs:
                f.write(json.dumps(dataclasses.asdict(r)) + "\n")
        all_takes, found = self.log_figures()
        moves = move_times([h for h in self.happenings if h.kind != "start"], all_takes)
        figures.update({
            "messages": self.feeder.messages, "job_results": dict(self.coverage.statuses),
            "users_fenced_5_times_or_more": {u: n for u, n in self.coverage.fenced.items()
                                             if n >= 5},
            "throughput": self.phases, "requests": request_stats(self.reader.reqs),
            "around_happenings": failure_windows(self.happenings, self.reader.reqs),
            "moves": move_summary(moves), "move_rows": moves,
            "restores": self.restores(),
            "takes_by_kind": {k: {"n": len(ts), "changes": sum(t.changes for t in ts),
                                  "seconds": round(sum(t.seconds for t in ts), 2)}
                              for k in ("promoted", "caught up", "restored")
                              for ts in [[t for t in all_takes if t.kind == k]]},
            "happenings": [{"happening": h.label(), "at_s": round(h.at - self.t0, 1),
                            "moved": len(h.moved())} for h in self.happenings],
            "unstable": self.unstable, "notes": self.notes, "logs": found,
            "runtime_s": round(time.time() - self.t0, 1),
        })
        return figures

    async def close(self, keep: bool) -> None:
        for node in self.nodes.values():
            await asyncio.to_thread(node.proc.stop, 60.0)
        if not keep:
            await delete_topics(self.base, all_topic_names(self.base))


# --------------------------------------------------------------------------- report


def ratio(value: float | None, one: float | None) -> str:
    return f"{value / one:.2f}" if value and one else "-"


def print_report(f: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    rows: list[tuple[str, Any]] = [
        ("users / partitions / seed", f"{meta['users']} / {meta['partitions']} / "
                                      f"{meta['seed']}"),
        ("timeline", " -> ".join(f"tput {a}" if s == "tput" else LABELS[s] + a
                                 for s, a in meta["steps"])),
        ("messages / sessions (covered)", f"{f['messages']} / {f['sessions']} "
                                          f"({f['sessions_covered']} covered)"),
        ("steady load / burst", f"{f['steady_rate']} events/s / {meta['burst']} events"),
    ]
    phases = f["throughput"]
    one = phases[0].get("msg_per_s") if phases else None
    rows.append(("msgs/s by workers (ratio to the first)", "   ".join(
        f"{p['workers']}: {p.get('msg_per_s')} ({ratio(p.get('msg_per_s'), one)})"
        for p in phases)))
    for name, v in f["views"].items():
        rows.append((f"{name}: missing/stale/duplicate/unexpected",
                     f"{v['missing']} / {v['stale']} / {v['duplicate']} / {v['unexpected']}"
                     f"   (live {v['live']}, expected {v['expected']}"
                     + (f", {v['failed_changes']} changes fail to replay"
                        if "failed_changes" in v else "") + ")"))
    c = f["changes"]
    rows.append(("change records / ids / two payloads", f"{c['change_records']} / "
                 f"{c['change_ids']} / {c['change_ids_differing_payloads']} (content: "
                 f"{c['change_ids_differing_content']})"))
    v = f["versions"]
    rows.append(("memory versions opened by two changes", f"{v['versions_opened_twice']} "
                 f"(users {v['users'][:5]})"))
    rows.append(("job results (users fenced >= 5 times)",
                 f"{f['job_results']} ({f['users_fenced_5_times_or_more']})"))
    d = f["decisions"]
    rows.append(("jobs decided more than once / distinct",
                 f"{d['jobs_decided_more_than_once']} / "
                 f"{d['distinct_decisions_beyond_first_per_user_seq']}"))
    r = f["requests"]
    rows.append(("reads: total / failed (non-200) / standby / forwarded",
                 f"{r['total']} / {r['failed']} {r['failed_by_status']} / "
                 f"{r['standby']['n']} / {r['forwarded']['n']}"))
    rows.append(("read p50/p99 ms: direct, forwarded, standby", ", ".join(
        f"{r[k]['p50_ms']}/{r[k]['p99_ms']}" for k in ("direct", "forwarded", "standby"))))
    w = f["wrong_answers"]
    rows.append(("answered wrongly after settle (user x worker)",
                 f"{w['wrong']} of {w['pairs']} ({w['unanswered']} unanswered)"))
    rows.append(("run: list answers with a duplicate / 2 values",
                 f"{r['answers_with_a_duplicate']} / {r['answers_with_two_values']} "
                 f"(by source {r['bad_answers_by_source']})"))
    for a in f["around_happenings"]:
        rows.append((f"  {a['happening']}: failed reads / window s",
                     f"{a['failed']} of {a['reads']} / {a['failed_window_s']} (failing "
                     f"{a['failed_s']} s, last +{a['failed_until_s']} s; asked "
                     f"{a['failed_by_asked']}; {a['failed_after_stable']} once stable); "
                     f"standby answers {a['standby_answers']}; others failed "
                     f"{a['failed_other_users']}; stable +{a['stable_after_s']} s, standbys "
                     f"warm +{a['standbys_warm_after_s']} s"))
    m = f["moves"]
    rows.append(("partition move -> serving s (n p50/max)", "   ".join(
        f"{k}: {m[k]['n']} {m[k]['p50_s']}/{m[k]['max_s']}"
        for k in ("all", "promoted", "caught_up", "restored"))
        + (f"   not seen: {m['not_seen']}" if m["not_seen"] else "")))
    rows.append(("partition assigned -> serving s (p50/max)", "   ".join(
        f"{k}: {m[k]['from_assignment_p50_s']}/{m[k]['from_assignment_max_s']}"
        for k in ("all", "promoted", "caught_up", "restored"))))
    rs = f["restores"]
    rows.append(("restores (GET /v1/cluster): changes/s", f"{rs['changes_per_s']} "
                 f"({rs['changes']} changes in {rs['seconds']} s, {rs['n']} restores)"))
    rows.append(("shard takes by kind (log): n / changes / s", "   ".join(
        f"{k}: {v['n']} / {v['changes']} / {v['seconds']}"
        for k, v in f["takes_by_kind"].items())))
    probs: dict[str, int] = {}
    for v in f["logs"].values():
        for k, n in v["counts"].items():
            probs[k] = probs.get(k, 0) + n
    rows.append(("worker log lines", ", ".join(f"{k} {n}" for k, n in probs.items())))
    rows.append(("runtime s", f"{f['runtime_s']} (first worker ready in "
                              f"{f['first_ready_s']} s, settle {f['settle_s']} s)"))
    for name, value in rows:
        print(f"{name:46} {value}")
    for row in f["move_rows"]:
        print(f"  move {row['happening']:12} p{row['partition']:<3} {row['from']} -> "
              f"{row['to']}: {row['kind']} +{row['seconds']} s (assigned +"
              f"{row.get('from_assignment_s')} s; {row.get('changes')} changes in "
              f"{row.get('restore_s')} s)")
    for name, v in f["views"].items():
        for kind, items in v.get("examples", {}).items():
            for item in items:
                print(f"  {name} {kind}: {item}")
    for item in f["uncovered_examples"]:
        print(f"  uncovered: {item}")
    for item in f["versions"]["examples"]:
        print(f"  version opened twice: {item}")
    for item in f["wrong_answers"]["examples"]:
        print(f"  wrong answer (user, asked, owner): {item}")
    for item in r["failed_examples"]:
        print(f"  failed read: {item}")
    for b in r["bad_answer_examples"]:
        print(f"  bad answer at +{b['at'] - meta['t0']:.1f} s: {b['user']} (p{b['partition']}) "
              f"asked {b['asked']}, served by {b['served_by']}"
              f"{' (standby)' if b['standby'] else ''}: "
              + ", ".join(k for k in ("duplicate", "two_values") if b[k]))
    for text in [*f["unstable"], *f["notes"]]:
        print(f"  note: {text}")
    for worker, v in f["logs"].items():
        for k, lines in v["examples"].items():
            if k == "forwarding failed":
                continue
            for line in lines:
                print(f"  {worker} log {k}: {line.splitlines()[0][:200]}")
    summary = {**meta, **{k: v for k, v in f.items() if k != "move_rows"}}
    print(json.dumps(summary, ensure_ascii=False, default=str))


# --------------------------------------------------------------------------- main


async def follow_results(settings: Settings, coverage: Coverage, poll_ms: int = 500) -> None:
    """Every job result of ``settings``' deployment (read_committed) into ``coverage``,
    until cancelled."""
    consumer = kafka.consumer(settings, registry(settings).job_results.name,
                              auto_offset_reset="earliest", enable_auto_commit=False,
                              group_id=None, isolation_level="read_committed")
    await consumer.start()
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=poll_ms)
            now = time.time()
            for part in batch.values():
                for r in part:
                    coverage.add(r.value, r.timestamp / 1000, now)
    finally:
        await consumer.stop()


def code_version() -> str:
    """The commit the workers run, and the product files changed in the checkout (the
    workers run what is on disk)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                ".", ":!benchmarks", ":!tests", ":!docs", ":!*.md"],
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = sorted(line[3:] for line in dirty if line.strip())
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny: 20 users, 4 partitions, 2 workers, a join and a kill (~40 s)")
    ap.add_argument("--rate", type=float, default=None,
                    help="steady load, events/s (default: 0.3 x the one-worker msgs/s)")
    ap.add_argument("--burst", type=int, default=None,
                    help="events per throughput phase (default 6000; smoke 100)")
    ap.add_argument("--read-rate", type=float, default=None,
                    help="reads per second (default 20; smoke 10)")
    ap.add_argument("--session-timeout", type=float,
                    default=Settings.model_fields["session_timeout_s"].default,
                    help="the workers' consumer group session timeout, s (default: the "
                         "product's): a SIGKILLed worker's partitions move after it")
    ap.add_argument("--port", type=int, default=49092, help="the benchmark's own broker")
    ap.add_argument("--keep", action="store_true",
                    help="keep the data dir (worker logs, shards), the topics and the broker's "
                         "data")
    ap.add_argument("--reuse-broker", action="store_true",
                    help="use a broker already running on --port (left running)")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="use this running broker (never started or stopped; --port ignored)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    timeout = args.session_timeout
    if args.read_rate is None:
        args.read_rate = 10.0 if args.smoke else 20.0
    if args.smoke:
        plan = Plan(users=20, partitions=4, burst=args.burst or 100, hold_s=0.5, quiet_s=1.5,
                    session_timeout_s=timeout, steps=SMOKE_STEPS)
    else:
        plan = Plan(users=args.users, partitions=args.partitions, burst=args.burst or 6000,
                    hold_s=10.0, quiet_s=4.0, session_timeout_s=timeout, steps=FULL_STEPS)
    broker: Settings | None = None
    running = True  # with --bootstrap: someone else's broker, left alone
    if args.bootstrap is None:
        if args.port in (9092, 19092):
            raise SystemExit("use a port of its own: the benchmark stops its broker")
        broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
        running = local_broker.read_pid(local_broker.paths_for(broker)) is not None
        if running and not args.reuse_broker:
            raise SystemExit(f"a broker already runs on {args.port}: it may be someone "
                             "else's; pass --reuse-broker if it is yours")
    bootstrap = args.bootstrap or f"127.0.0.1:{args.port}"
    work = Path(tempfile.mkdtemp(prefix="memstream-scale-"))
    code = 0
    try:
        if broker is not None:
            try:
                local_broker.start(broker, 180.0)
            except Exception as exc:
                raise CouldNotRun(f"the broker did not start: {exc}") from exc
        name = f"scale-{uuid.uuid4().hex[:8]}"
        base = bench_settings(
            bootstrap, work, topic_prefix=name, app_id=name,
            partitions=plan.partitions,  # the store layout: the default (partitioned)
            session_timeout_s=plan.session_timeout_s,
            leave_group_on_stop=True)  # its SIGTERM is a scale-in: the partitions move
        meta = {"users": plan.users, "partitions": plan.partitions, "seed": args.seed,
                "session_timeout_s": plan.session_timeout_s,
                "smoke": args.smoke, "burst": plan.burst, "read_rate": args.read_rate,
                "steps": [list(s) for s in plan.steps], "work": str(work),
                "cpus": os.cpu_count(), "load_at_start": round(os.getloadavg()[0], 2),
                "code": code_version()}
        print(f"work dir {work}; broker {bootstrap}; app {name}", flush=True)
        run = Run(plan, base, work, args.seed, args.rate, args.read_rate)

        async def go() -> dict[str, Any]:
            try:
                return await run.run()
            finally:
                await run.close(args.keep)

        meta["t0"] = run.t0
        figures = asyncio.run(go())
        print_report(figures, meta)
    except CouldNotRun as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        code = 2
    finally:
        if broker is not None and not running:
            local_broker.stop(broker)
            if not args.keep:
                local_broker.wipe(broker)
        if args.keep:
            print(f"kept: {work}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
