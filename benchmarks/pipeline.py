"""End-to-end pipeline benchmark on the real broker with one worker (not a test).

    .venv/bin/python benchmarks/pipeline.py [--users 400] [--messages 24000] [--runs 3]
        [--compare before=/path/to/an/older/checkout] [--archive-off]
        [--processes N] [--bootstrap HOST:PORT] [--smoke]

The conversations of ``--users`` users (benchmarks/chaos.py's people: sessions of facts
and chit-chat, each ended, so every message has a known session to be covered in) are
produced up front, about ``--messages`` chat messages; then one worker (the rules model,
the embedded store, every stage) starts and works through the backlog: ingest -> jobs ->
extract -> decisions -> apply -> store, changes and results -> ingest.

- **msg/s end to end**: chat messages / seconds from the worker's first job result to the
  moment the last session is covered by done or trivial results (the worker's start-up,
  the same for any code, is left out; ``wall_s`` includes it).
- **changes/s** and **jobs/s** over the same seconds (memory changes and job results
  committed, ``read_committed``).

``--compare LABEL=DIR`` runs the same backlog with the worker's code taken from DIR (a
checkout, e.g. ``git worktree add /tmp/before HEAD~3``), alternating run by run, so both
are measured side by side in the same minutes; the table gives medians and the ratio.
``--archive-off`` adds this code with the episodic archive off (``archive=False``, code
"no-archive") to the alternation: the archive's cost end to end (docs/archive.md).
``changes`` counts memory changes; the archive's turns are ``archived``.
``--processes N`` adds this code run as ``memstream worker --processes N`` (code "<N>proc":
one supervisor, N member processes) to the alternation, and prints the ratio to one process
(docs/processes.md).

Every run must be exact, or the benchmark fails: every session covered by done or trivial
results, no memory change twice (its deterministic ``change_id``), no version of a memory
opened by two changes.
Prints a table and, last, one JSON line. ``--smoke``: tiny sizes, to check it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from itertools import pairwise
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.ingest import (
    codes_of,
    pct,
    produce,
    settings_for,
    side_by_side_options,
    with_broker,
    with_code,
)
from benchmarks.scale import follow_results
from benchmarks.scale_checks import Coverage, Stream
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, Event

SMOKE = {"users": 8, "messages": 200, "runs": 1}
TIMEOUT_S = 1800.0


def backlog(users: int, messages: int, seed: int = 7) -> tuple[Stream, list[Event]]:
    """A stream and its events: about ``messages`` chat messages, every session begun
    finished."""
    stream = Stream(users, seed)
    events: list[Event] = []
    while sum(isinstance(e, ChatMessage) for e in events) < messages:
        events += stream.take(min(1000, messages))
    events += stream.finish()
    return stream, events


async def committed(settings: Settings, topic: str) -> list[tuple[float, dict]]:
    """(producer timestamp in s, decoded value) of every record of ``topic`` a
    read_committed consumer finds (markers not counted)."""
    consumer = kafka.consumer(settings, topic, auto_offset_reset="earliest",
                              enable_auto_commit=False, group_id=None,
                              isolation_level="read_committed")
    await consumer.start()
    found: list[tuple[float, dict]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch:
                return found
            found += [(r.timestamp / 1000, json.loads(r.value))
                      for rs in batch.values() for r in rs if r.value is not None]
    finally:
        await consumer.stop()


def hops(jobs: list[tuple[float, dict]], decisions: list[tuple[float, dict]],
         results: list[tuple[float, dict]]) -> dict[str, dict[str, float]]:
    """Where a job's round trip goes, from the records' producer timestamps (ms): job sent
    -> its decision sent (the extract stage: its wait and its work), decision -> result
    (apply), and a result -> the user's next job (ingest: the result read, the next job
    emitted). p50 / p99 in ms per hop."""
    decided = {d["job_id"]: t for t, d in decisions}
    finished = {r["job_id"]: t for t, r in results if r.get("status") != "trivial"}
    sent = {j["job_id"]: t for t, j in jobs}
    extract = [decided[i] - t for i, t in sent.items() if i in decided]
    apply = [finished[i] - decided[i] for i in finished if i in decided]
    by_user: dict[str, list[tuple[float, str]]] = {}
    for t, r in results:
        by_user.setdefault(r["user_id"], []).append((t, "result"))
    for t, j in jobs:
        by_user.setdefault(j["user_id"], []).append((t, "job"))
    ingest = []
    for events in by_user.values():
        events.sort()
        ingest += [b[0] - a[0] for a, b in pairwise(events)
                   if a[1] == "result" and b[1] == "job"]
    return {name: {"n": len(v), "p50_ms": round(1000 * pct(v, 0.5), 1) if v else 0.0,
                   "p99_ms": round(1000 * pct(v, 0.99), 1) if v else 0.0}
            for name, v in (("extract", extract), ("apply", apply),
                            ("result_to_next_job", ingest))}


def inexact(changes: list[tuple[float, dict]]) -> dict[str, int]:
    """What breaks exactness in the committed memory changes: a change twice, or a version
    of a memory opened by two different changes (both 0 in an exact run)."""
    ids = Counter(v["change_id"] for _, v in changes)
    opened: dict[tuple, set[str]] = {}
    for _, v in changes:
        if v.get("op") in ("add", "update"):
            key = (v["tenant_id"], v["user_id"], v["memory_id"], v["version"])
            opened.setdefault(key, set()).add(v["change_id"])
    return {"changes_twice": sum(1 for n in ids.values() if n > 1),
            "versions_opened_twice": sum(1 for c in opened.values() if len(c) > 1)}


def processes_of(label: str) -> int:
    """The member processes a code label runs with (``<N>proc``; else 1)."""
    return int(label[:-4]) if label.endswith("proc") and label[:-4].isdigit() else 1


async def one_run(base: Settings, stream: Stream, events: list[Event], work: Path,
                  label: str) -> dict:
    name = f"pipe-{label}-{uuid.uuid4().hex[:6]}"
    settings = base.model_copy(update={"topic_prefix": name, "app_id": name,
                                       "data_dir": work / name,
                                       "processes": processes_of(label)})
    await create_topics(settings)
    messages = sum(isinstance(e, ChatMessage) for e in events)
    coverage = Coverage()
    follower = asyncio.create_task(follow_results(settings, coverage))
    worker = None
    try:
        await produce(settings, events, None)
        worker = WorkerProcess(settings, work / f"{name}.log").spawn()
        started = time.time()
        deadline = time.monotonic() + TIMEOUT_S
        while coverage.uncovered(stream.expected):
            if time.monotonic() > deadline or not worker.alive():
                raise RuntimeError(f"{label}: not covered ({worker.poll()})")
            await asyncio.sleep(0.2)
        first = min(stamp for stamp, _ in coverage.stamps)
        last = max(stamp for stamp, _ in coverage.stamps)
        seconds = max(1e-3, last - first)
        t = registry(settings)
        every = await committed(settings, t.memory_changes.name)
        broken = inexact(every)
        if any(broken.values()):
            raise RuntimeError(f"{label}: not exact: {broken}")
        archived = sum(v.get("op") == "archive" for _, v in every)
        changes = len(every) - archived
        jobs = sum(coverage.statuses.values())
        breakdown = hops(await committed(settings, t.jobs.name),
                         await committed(settings, t.decisions.name),
                         await committed(settings, t.job_results.name))
        return {"code": label, "messages": messages, "seconds": round(seconds, 2),
                "wall_s": round(last - started, 2),
                "msg_per_s": round(messages / seconds, 1),
                "changes": changes, "changes_per_s": round(changes / seconds, 1),
                "archived": archived,
                "job_results": jobs, "jobs_per_s": round(jobs / seconds, 1),
                "exact": True, **broken, "hops": breakdown}
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        if worker is not None:
            worker.stop()
        await delete_topics(settings, all_topic_names(settings))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=400)
    ap.add_argument("--messages", type=int, default=24_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per code (median reported)")
    ap.add_argument("--processes", type=int, default=None, metavar="N",
                    help="also run this code with N member processes (code '<N>proc'), "
                    "side by side with one process")
    side_by_side_options(ap)
    args = smoke.parse(ap, SMOKE)
    base = with_broker(Settings(partitions=4, web_enabled=False, idle_timeout_s=5.0,
                                tick_interval_s=1.0), args.bootstrap)
    work = Path(tempfile.mkdtemp(prefix="memstream-pipeline-"))
    stream, events = backlog(args.users, args.messages)
    codes = codes_of(args)
    if args.processes is not None and args.processes > 1:
        codes.append((f"{args.processes}proc", None))
    runs: dict[str, list[dict]] = {label: [] for label, _ in codes}
    for _ in range(args.runs):
        for label, path in codes:
            with with_code(path):
                runs[label].append(asyncio.run(one_run(settings_for(base, label), stream,
                                                       events, work, label)))
    print(f"{'code':8} {'runs':>4} {'msg/s median':>13} {'(each)':30} {'changes/s':>10} "
          f"{'jobs/s':>8}")
    summary = {}
    for label, results in runs.items():
        each = [r["msg_per_s"] for r in results]
        summary[label] = {"msg_per_s_median": median(each), "msg_per_s_each": each,
                          "changes_per_s_median": median(r["changes_per_s"] for r in results),
                          "jobs_per_s_median": median(r["jobs_per_s"] for r in results),
                          "runs": results}
        print(f"{label:8} {len(results):>4} {median(each):>13.0f} {each!s:30} "
              f"{summary[label]['changes_per_s_median']:>10.0f} "
              f"{summary[label]['jobs_per_s_median']:>8.0f}")
    print(f"{'code':8} {'hop (producer timestamps)':28} {'p50 ms':>8} {'p99 ms':>8}")
    for label, results in runs.items():
        for hop in results[0]["hops"]:
            p50 = median(r["hops"][hop]["p50_ms"] for r in results)
            p99 = median(r["hops"][hop]["p99_ms"] for r in results)
            print(f"{label:8} {hop:28} {p50:>8.0f} {p99:>8.0f}")
    ratios = {}
    for label, _ in codes[1:]:
        if processes_of(label) > 1:
            ratio = summary[label]["msg_per_s_median"] / summary["this"]["msg_per_s_median"]
            print(f"end to end {label} / this (1 process): {ratio:.2f}x")
        else:
            ratio = summary["this"]["msg_per_s_median"] / summary[label]["msg_per_s_median"]
            print(f"end to end this / {label}: {ratio:.2f}x")
        ratios[label] = round(ratio, 3)
    if args.smoke:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"users": args.users, "messages": args.messages, "smoke": args.smoke,
                      "ratios": ratios, "codes": summary}))


if __name__ == "__main__":
    main()
