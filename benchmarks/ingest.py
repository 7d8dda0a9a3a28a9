"""Ingest-stage benchmark on the real broker with one worker (not a test).

    .venv/bin/python benchmarks/ingest.py [--messages 100000] [--users 1000] [--runs 3]
        [--compare before=/path/to/an/older/checkout] [--archive-off]
        [--bootstrap HOST:PORT] [--smoke]

``--compare LABEL=DIR`` runs the same phases with the worker's code taken from DIR (for
example ``git worktree add /tmp/before HEAD~3``), alternating with this checkout's run
by run, so both are measured side by side on the same machine in the same minutes; the
table gives the median of ``--runs`` per code and the ratio.

Phase 1 (throughput): the messages of ``--users`` users with realistic session lengths
are produced up front; one worker then drains them while a stand-in extractor acknowledges
every job at once. Messages/s = messages / time from the moment the ingest loop has taken
every partition (its log says so) until the group has committed every message; "from
Ready" counts from the worker's "Ready" line instead, start-up included, as this benchmark
did before (that line is Faust's and says nothing of the loops: docs/faust.md).
Phase 2 (latency): a fresh run produced at a steady ``--rate`` once the ingest loop serves;
the delay of each job is its broker timestamp minus the produce time of the newest message
it covers (for session-end jobs: of the end event). Idle flushes are excluded (delayed by design).
Prints a table and, last, one JSON line.

The broker is ``--bootstrap`` (a running one, used as it is), else the local one of
``memstream.dev.broker`` (started if it is not running). ``--smoke``: tiny sizes, to check
it still runs (seconds plus two worker start-ups).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import WorkerProcess
from memstream.dev.stand_in import AckExtractor
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import (
    ChatMessage,
    Event,
    SessionEvent,
)

FACTS = ["I moved to {c} last month", "We have {n} kids", "I work at {c} Labs",
         "My budget this month is {n}k", "I prefer short answers about {c}",
         "I am allergic to nuts and {c} pollen", "我住在{c}", "我们公司有{n}0名员工"]
TRIVIAL = ["ok", "thanks", "continue", "好的", "明白了", "继续", "你好"]
EXPLICIT = ["Remember this: my son is called {c}", "记住：我不吃{c}", "From now on always use {c}"]
CITIES = ["Berlin", "Munich", "Lisbon", "Shanghai", "Shenzhen", "Oslo", "Rome"]
SMOKE = {"messages": 200, "users": 10, "latency_messages": 100, "rate": 200.0}  # --smoke


def conversations(messages: int, users: int, seed: int = 7) -> list[Event]:
    """Interleaved sessions; lengths log-normal around 12 messages (2..80)."""
    rng = random.Random(seed)
    per_user: list[list[Event]] = [[] for _ in range(users)]
    made = 0
    session_no = 0
    while made < messages:
        u = rng.randrange(users)
        session_no += 1
        length = max(2, min(80, int(rng.lognormvariate(2.3, 0.6))))
        sid = f"s{session_no}"
        for i in range(min(length, messages - made)):
            role = "user" if i % 2 == 0 else "assistant"
            roll = rng.random()
            if role == "assistant":
                text = rng.choice(["Noted.", "Sure, here you go.", "好的，已记录。"])
            elif roll < 0.2:
                text = rng.choice(TRIVIAL)
            elif roll < 0.23:
                text = rng.choice(EXPLICIT).format(c=rng.choice(CITIES))
            else:
                text = rng.choice(FACTS).format(c=rng.choice(CITIES), n=rng.randint(1, 9))
            per_user[u].append(ChatMessage(
                tenant_id="bench", user_id=f"u{u}", session_id=sid,
                message_id=f"{sid}-{i}", role=role, content=text, ts=datetime.now(UTC)))
            made += 1
        if rng.random() < 0.8:
            per_user[u].append(SessionEvent(tenant_id="bench", user_id=f"u{u}",
                                            session_id=sid, ts=datetime.now(UTC)))
    out: list[Event] = []
    cursors = [0] * users
    while len(out) < sum(len(q) for q in per_user):
        for u in range(users):
            if cursors[u] < len(per_user[u]):
                out.append(per_user[u][cursors[u]])
                cursors[u] += 1
    return out


async def drained(settings: Settings, total: int, timeout: float = 1800) -> float:
    """Wait until the worker's group has committed every message; returns that time."""

    admin = kafka.admin(settings)
    await admin.start()
    topic = registry(settings).messages.name
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            done = 0
            # the ingest loop's group (streams.ingest_loop), or the app's (older code)
            for group in (f"{settings.app_id}-ingest", settings.app_id):
                offsets = await admin.list_consumer_group_offsets(group)
                done = max(done, sum(meta.offset for tp, meta in offsets.items()
                                     if tp.topic == topic))
            if done >= total:
                return time.time()
            await asyncio.sleep(0.05)
    finally:
        await admin.close()
    raise TimeoutError("messages not drained")


async def produce(settings: Settings, events: list[Event], rate: float | None) -> dict[str, float]:
    """Send events (re-stamping ``ts`` at send time); returns send time per session end."""
    topics = registry(settings)
    producer = await start_producer(settings, max_batch_size=256_000)
    ends: dict[str, float] = {}
    start = time.monotonic()
    try:
        for i, e in enumerate(events):
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            now = datetime.now(UTC)
            if isinstance(e, ChatMessage):
                e = e.model_copy(update={"ts": now})
                topic = topics.messages.name
            else:
                ends[f"{e.user_id}/{e.session_id}"] = now.timestamp()  # type: ignore[attr-defined]
                topic = topics.session_events.name
            await producer.send(topic, e.dumps(), key=e.key().encode())
        await producer.flush()
    finally:
        await producer.stop()
    return ends


def delays(run: AckExtractor, ends: dict[str, float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for job, emitted in run.jobs:
        if job.reason.value == "idle":
            continue
        newest = max(m.ts.timestamp() for m in job.messages)
        if job.reason.value == "session_end":
            newest = max(newest, ends.get(f"{job.user_id}/{job.session_id}", newest))
        out.setdefault(job.reason.value, []).append(max(0.0, emitted - newest) * 1000)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def serving(worker: WorkerProcess, partitions: int, timeout: float = 120) -> float:
    """Wait until the worker's ingest loop has taken every partition (its log says so);
    returns that time. The worker's "Ready" line is Faust's: it says the app's services
    started, not that the loops joined their groups and took their partitions (with Faust's
    own consumer on, "Ready" waited for that consumer's join, by which time the loops had
    mostly joined too; with it off, "Ready" comes before any loop joined: docs/faust.md)."""
    want = {f"ingest partition {n} taken" for n in range(partitions)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = worker.log_text()
        if all(line in text for line in want):
            return time.time()
        await asyncio.sleep(0.02)
    raise TimeoutError("the ingest loop did not take its partitions")


@dataclass
class Timing:
    """One run's clock: when the worker said "Ready", when its ingest loop served, when
    the work was done."""

    ready: float
    serving: float
    done: float

    @property
    def startup_s(self) -> float:
        return self.serving - self.ready


async def one_run(base: Settings, events: list[Event], rate: float | None, work: Path,
                  label: str) -> tuple[AckExtractor, dict[str, float], Timing]:
    """A throughput run (``rate`` None: the backlog produced first, then drained) or a
    latency run (paced from the moment the ingest loop serves)."""
    name = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    settings = base.model_copy(update={"topic_prefix": name, "app_id": name,
                                       "data_dir": work / name})
    await create_topics(settings)
    messages = sum(isinstance(e, ChatMessage) for e in events)
    run = AckExtractor(settings)
    worker = None
    try:
        ends: dict[str, float] = {}
        if rate is None:  # backlog first, then the worker drains it
            ends = await produce(settings, events, None)
        worker = WorkerProcess(settings, work / f"{name}.log").start()
        ready = time.time()
        task = asyncio.create_task(run.run(messages, timeout=1800))
        if rate is None:
            t_drained = asyncio.create_task(drained(settings, messages))
            up = await serving(worker, settings.partitions)
            done = await t_drained
        else:
            up = await serving(worker, settings.partitions)
            ends = await produce(settings, events, rate)
        await task
        return run, ends, Timing(ready, up, done if rate is None else run.done_at)
    finally:
        if worker is not None:
            worker.stop()
        await delete_topics(settings, all_topic_names(settings))


@contextlib.contextmanager
def with_code(path: str | None):
    """The worker's code for one run: this checkout (None) or another (its directory
    first on PYTHONPATH, and PYTHONSAFEPATH set: a worker started from this checkout's
    directory would otherwise import this checkout's package, the working directory
    coming first on sys.path)."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH")}
    if path:
        os.environ["PYTHONPATH"] = path
        os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def side_by_side_options(ap: argparse.ArgumentParser) -> None:
    """``--compare`` and ``--bootstrap``, as every side-by-side benchmark takes them."""
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR",
                    help="also run the worker from another checkout, side by side")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="a running broker (else the local one, started if need be)")
    ap.add_argument("--archive-off", action="store_true",
                    help="also run this code with the episodic archive off (code "
                    "'no-archive'), side by side: the archive's cost")


def with_broker(base: Settings, bootstrap: str | None) -> Settings:
    """``base`` on ``bootstrap``, else on the local broker (started if it is not running)."""
    if bootstrap:
        return base.model_copy(update={"bootstrap_servers": bootstrap})
    if local_broker.read_pid(local_broker.paths_for(base)) is None:
        local_broker.start(base)
    return base


NO_ARCHIVE = "no-archive"


def codes_of(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(label, checkout) of each code to run: this one (None), then every ``--compare``,
    then this one with the archive off (``--archive-off``)."""
    return ([("this", None)] + [(c.split("=", 1)[0], c.split("=", 1)[1]) for c in args.compare]
            + ([(NO_ARCHIVE, None)] if args.archive_off else []))


def settings_for(base: Settings, label: str) -> Settings:
    """A code's settings: the archive off for ``no-archive``."""
    return base.model_copy(update={"archive": False}) if label == NO_ARCHIVE else base


def measure(base: Settings, args: argparse.Namespace, work: Path, label: str,
            path: str | None, events: list[Event], lat_events: list[Event]) -> dict:
    n = sum(isinstance(e, ChatMessage) for e in events)
    n_lat = sum(isinstance(e, ChatMessage) for e in lat_events)
    with with_code(path):
        run, _, clock = asyncio.run(one_run(base, events, None, work, f"tput-{label}"))
        lat_run, ends, lat_clock = asyncio.run(one_run(base, lat_events, args.rate, work,
                                                       f"lat-{label}"))
    by_reason = delays(lat_run, ends)
    every = [d for ds in by_reason.values() for d in ds]
    return {
        "code": label, "messages": n, "users": args.users,
        # from the moment the ingest loop served (the loop's own speed) and, as this
        # benchmark measured it before, from the worker's "Ready" line (start-up included)
        "throughput_msg_per_s": round(n / (clock.done - clock.serving), 1),
        "throughput_from_ready_msg_per_s": round(n / (clock.done - clock.ready), 1),
        "startup_after_ready_s": round(clock.startup_s, 2),
        "latency_startup_after_ready_s": round(lat_clock.startup_s, 2),
        "jobs_per_100_messages": round(100 * len(run.jobs) / n, 2),
        "trivial_resolved_per_100_messages": round(100 * len(run.trivial) / n, 2),
        "latency_phase": {"messages": n_lat, "rate_msg_per_s": args.rate,
                          "jobs_per_100_messages": round(100 * len(lat_run.jobs) / n_lat, 2),
                          "trivial_per_100_messages": round(100 * len(lat_run.trivial) / n_lat, 2),
                          "p50_ms": round(pct(every, 0.5), 1),
                          "p99_ms": round(pct(every, 0.99), 1),
                          "by_reason": {r: {"n": len(d), "p50_ms": round(pct(d, 0.5), 1),
                                            "p99_ms": round(pct(d, 0.99), 1)}
                                        for r, d in sorted(by_reason.items())}},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000.0, help="msg/s in the latency phase")
    ap.add_argument("--latency-messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1, help="runs per code (median reported)")
    side_by_side_options(ap)
    args = smoke.parse(ap, SMOKE)
    base = Settings(idle_timeout_s=5.0, tick_interval_s=1.0, partitions=4, extract_enabled=False)
    if args.smoke:  # unended sessions flushed sooner: the run waits for them
        base = base.model_copy(update={"idle_timeout_s": 1.0, "tick_interval_s": 0.5})
    base = with_broker(base, args.bootstrap)
    work = Path(tempfile.mkdtemp(prefix="memstream-bench-"))
    events = conversations(args.messages, args.users)
    lat_events = conversations(args.latency_messages, args.users, seed=11)
    codes = codes_of(args)
    runs: dict[str, list[dict]] = {label: [] for label, _ in codes}
    for _ in range(args.runs):
        for label, path in codes:
            runs[label].append(measure(settings_for(base, label), args, work, label, path,
                                       events, lat_events))
    print(f"{'code':8} {'runs':>4} {'msg/s median':>13} {'(each)':28} {'from Ready':>10} "
          f"{'startup s':>9} {'jobs/100':>8} {'p50 ms':>8} {'p99 ms':>8}  "
          f"(paced at {args.rate:.0f} msg/s)")
    summary = {}
    for label, results in runs.items():
        tput = [r["throughput_msg_per_s"] for r in results]
        from_ready = median([r["throughput_from_ready_msg_per_s"] for r in results])
        startup = median([r["startup_after_ready_s"] for r in results]
                         + [r["latency_startup_after_ready_s"] for r in results])
        p50 = median([r["latency_phase"]["p50_ms"] for r in results])
        p99 = median([r["latency_phase"]["p99_ms"] for r in results])
        summary[label] = {"throughput_msg_per_s_median": median(tput),
                          "throughput_each": tput,
                          "throughput_from_ready_msg_per_s_median": from_ready,
                          "startup_after_ready_s_median": startup,
                          "p50_ms_median": p50, "p99_ms_median": p99, "runs": results}
        print(f"{label:8} {len(results):>4} {median(tput):>13.0f} {tput!s:28} "
              f"{from_ready:>10.0f} {startup:>9.2f} "
              f"{results[0]['jobs_per_100_messages']:>8} {p50:>8} {p99:>8}")
    if len(codes) > 1:
        this = summary["this"]["throughput_msg_per_s_median"]
        for label, _ in codes[1:]:
            other = summary[label]["throughput_msg_per_s_median"]
            p99s = summary["this"]["p99_ms_median"] / summary[label]["p99_ms_median"]
            print(f"throughput this / {label}: {this / other:.2f}x; p99 this / {label}: "
                  f"{p99s:.2f}x")
    if args.smoke:  # a check, nothing to look into afterwards: its worker logs and data go
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"messages": args.messages, "users": args.users, "rate": args.rate,
                      "smoke": args.smoke, "codes": summary}))


if __name__ == "__main__":
    main()
