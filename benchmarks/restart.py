"""Restart benchmark: how long a SIGKILLed worker needs before it processes again (not a test).

    .venv/bin/python benchmarks/restart.py [--kills 5] [--rate 20] [--configs before,after]
        [--bootstrap 127.0.0.1:19092] [--extract] [--workdir DIR]
    .venv/bin/python benchmarks/restart.py --smoke --bootstrap HOST:PORT   # "after", 1 kill

For each configuration a fresh app (own topics, groups and data dir) runs one worker with the
default settings (session timeout 30 s, heartbeat 3 s, each stage's batches committed in
Kafka transactions) while messages arrive at a steady ``--rate`` (each from a new user and
saying "remember this", so every message processed makes a job at once). ``--kills``
times, a few seconds into the load, the worker is SIGKILLed and started again 0.5 s later
on the same data dir.
Restart-to-processing = the producer timestamp of the first job the new process sends,
minus the moment it was started; restart-to-ready = its "Worker: Ready" log line.

- ``before``: dynamic group membership (``MEMSTREAM_GROUP_INSTANCE_ID=''``): a restarted
  worker gets its partitions once the dead member's session has timed out;
- ``after``: the defaults (static membership: it takes them back at once).

Ingest stage only unless ``--extract`` (the extract/apply stages add CPU load per job, not
restart work). Prints a table and, last, one JSON line with p50/max per configuration.
``--smoke`` (to check it runs): the ``after`` configuration only, one kill, 1 s of uptime.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from memstream.core import kafka
from memstream.core.errors import MemstreamError
from memstream.core.kafka_io import send_events, start_producer
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage

READY = "[^Worker]: Ready"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
CONFIGS: dict[str, dict[str, object]] = {
    "before": {"group_instance_id": ""},
    "after": {},
}


@dataclass
class Run:
    config: str
    restarts: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    crashed: int = 0  # restarts that did not become ready


class JobClock:
    """Producer timestamps (s) of every job record, read in the background."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.consumer = kafka.consumer(settings, topic, group_id=None,
                                       auto_offset_reset="earliest",
                                       isolation_level="read_committed")
        self.stamps: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> JobClock:
        await self.consumer.start()
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200)
            self.stamps += [r.timestamp / 1000 for rs in batch.values() for r in rs]

    def first_after(self, t: float) -> float | None:
        later = [s for s in self.stamps if s >= t]
        return min(later) if later else None

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.consumer.stop()


async def produce(settings: Settings, rate: float, stop: asyncio.Event) -> None:
    producer = await start_producer(settings)
    topic = registry(settings).messages.name
    n = 0
    try:
        while not stop.is_set():
            n += 1
            msg = ChatMessage(tenant_id="bench", user_id=f"u{n}", session_id="s1",
                              message_id=f"m{n}", role="user", ts=datetime.now(UTC),
                              content=f"Remember this: my locker number is {n}")
            await send_events(producer, topic, [msg])
            await asyncio.sleep(1 / rate)
    finally:
        await producer.stop()


def start_in_thread(worker: WorkerProcess) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.start(timeout=120)
        except MemstreamError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


async def wait_first_job(clock: JobClock, after: float, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (first := clock.first_after(after)) is not None:
            return first
        await asyncio.sleep(0.1)
    return None


async def run_config(name: str, args: argparse.Namespace, tmp: Path) -> Run:
    tag = uuid.uuid4().hex[:8]
    settings = Settings(bootstrap_servers=args.bootstrap, app_id=f"rb-{name}-{tag}",
                        topic_prefix=f"rb-{tag}", data_dir=tmp / name / "data",
                        extract_enabled=args.extract, embedder="hashing",
                        **CONFIGS[name])  # type: ignore[arg-type]
    await create_topics(settings)
    clock = await JobClock(settings, registry(settings).jobs.name).start()
    stop = asyncio.Event()
    load = asyncio.create_task(produce(settings, args.rate, stop))
    worker = WorkerProcess(settings, tmp / name / "worker.log")
    run = Run(name)
    try:
        await asyncio.to_thread(worker.start, 120)
        await wait_first_job(clock, 0, 60)
        for i in range(args.kills):
            await asyncio.sleep(args.uptime)
            worker.stop(kill=True)
            await asyncio.sleep(0.5)
            log_from = worker.log_path.stat().st_size
            restarted = time.time()
            thread, errors = start_in_thread(worker)
            first = await wait_first_job(clock, restarted, 120)
            await asyncio.to_thread(thread.join, 130)
            ready = ready_time(worker.log_path, log_from)
            if errors:
                run.crashed += 1
            to_first = None if first is None else first - restarted
            to_ready = None if ready is None else ready - restarted
            run.restarts.append((restarted, to_ready, to_first))
            print(f"{name:7} kill {i + 1:2}  ready after {fmt(to_ready):>7}  "
                  f"processing after {fmt(to_first):>7}", flush=True)
    finally:
        stop.set()
        await load
        worker.stop()
        await clock.stop()
        await delete_topics(settings, all_topic_names(settings))
    return run


def ready_time(log: Path, offset: int) -> float | None:
    """Wall-clock time of the first "Worker: Ready" line logged after ``offset``."""
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        if READY in line and (stamp := STAMP.match(line)):
            return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def summary(run: Run) -> dict[str, object]:
    firsts = [f for _, _, f in run.restarts if f is not None]
    readies = [r for _, r, _ in run.restarts if r is not None]
    return {
        "kills": len(run.restarts), "crashed": run.crashed,
        "not_processing": len(run.restarts) - len(firsts),
        "p50_s": round(statistics.median(firsts), 2) if firsts else None,
        "max_s": round(max(firsts), 2) if firsts else None,
        "ready_p50_s": round(statistics.median(readies), 2) if readies else None,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=None, help="default 5 (smoke 1)")
    ap.add_argument("--rate", type=float, default=20.0, help="messages per second")
    ap.add_argument("--uptime", type=float, default=None,
                    help="s of processing between kills (default 3; smoke 1)")
    ap.add_argument("--configs", default=None, help="default before,after (smoke after)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny, to check it runs: after only, 1 kill, 1 s uptime")
    ap.add_argument("--bootstrap", default="127.0.0.1:19092")
    ap.add_argument("--extract", action="store_true", help="run the extract/apply stages too")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and logs here")
    args = ap.parse_args()
    smoke = {"kills": 1, "uptime": 1.0, "configs": "after"}
    full = {"kills": 5, "uptime": 3.0, "configs": "before,after"}
    for name, value in (smoke if args.smoke else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="memstream-restart-") as tmp:
        for name in args.configs.split(","):
            results[name] = summary(await run_config(name, args, args.workdir or Path(tmp)))
    print()
    print(f"{'config':8} {'kills':>5} {'crashed':>7} {'p50':>7} {'max':>7} {'ready p50':>9}")
    for name, r in results.items():
        print(f"{name:8} {r['kills']:>5} {r['crashed']:>7} {fmt(r['p50_s']):>7} "  # type: ignore[arg-type]
              f"{fmt(r['max_s']):>7} {fmt(r['ready_p50_s']):>9}")  # type: ignore[arg-type]
    print(json.dumps({"benchmark": "restart", "rate": args.rate, "kills": args.kills,
                      "smoke": args.smoke, "restart_to_processing": results}))


if __name__ == "__main__":
    asyncio.run(main())
