"""``memstream rebuild`` of the partitioned layout: the shards built by 1 and by N processes
side by side (not a test).

    .venv/bin/python benchmarks/rebuild_shards.py --bootstrap HOST:PORT [--users 1000]
        [--per-user 40] [--partitions 2] [--processes 1,2] [--repeats 3] [--smoke]

One synthetic change log (benchmarks/changegen.py, as ``rebuild.py``: 512-dim vectors,
updates, deletes, re-published duplicates, forget-mes) is produced, keyed by user, to the
memory-change topic of a fresh topic set with ``--partitions`` partitions. Then, per repeat
and alternating, every shard is built from the topics by
``memstream.streams.shard_builders.build_shards`` (what ``memstream rebuild`` runs: the
worker's own restore, each partition's shard into a fresh directory, closed) with each
process count of ``--processes``. It reports changes/s by the wall clock from the call to
the last shard closed (the builder processes' start included), medians of ``--repeats``,
each count against the first, and checks that every count built the same shards
(per-user checksums of every record). ``--worker``: then, per repeat and alternating, a
worker with an empty data dir is started for each process count (``rebuild_processes``,
every full restore in a builder process when more than one: ``restore_in_process_below``
0), and the seconds from its start to every partition taken by its apply stage are
reported, with its shards checked equal to the built ones after it stopped. One JSON line
last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.changegen import changes
from memstream.core.settings import Settings
from memstream.memory.store import checksum
from memstream.memory.store.edge import EdgeStore
from memstream.streams.shard_builders import build_shards

DIM = 512
SMOKE = {"users": 20, "per_user": 5, "repeats": 1}


async def produce(settings: Settings, log: list[Any]) -> None:
    from memstream.core import kafka
    from memstream.topics.layout import create_topics

    await create_topics(settings)
    producer = kafka.producer(settings, linger_ms=20, max_request_size=16 * 1024 * 1024,
                              compression_type=None)
    await producer.start()
    try:
        topic = settings.topic("memory-changes")
        for change in log:
            await producer.send(topic, change.dumps(), key=change.key().encode())
        await producer.flush()
    finally:
        await producer.stop()


async def drop(settings: Settings) -> None:
    from memstream.core import kafka
    from memstream.topics.registry import all_topic_names

    admin = kafka.admin(settings)
    await admin.start()
    try:
        await admin.delete_topics(all_topic_names(settings))
    finally:
        await admin.close()


def digests(root: Path, partitions: int) -> checksum.Digests:
    found = checksum.Digests()
    for p in range(partitions):
        store = EdgeStore(root / str(p), DIM)
        try:
            found.users.update(checksum.digests(store.scan(vectors=True)).users)
        finally:
            store.close()
    return found


def worker_restore(settings: Settings, work: Path, processes: int) -> tuple[float, Path]:
    """A worker started on an empty data dir: the seconds until its apply stage has taken
    every partition (each shard restored from the topics), and where its shards are."""
    from memstream.dev.process import WorkerProcess
    from memstream.memory.store.partitioned import SHARDS_DIR

    name = f"restore-{uuid.uuid4().hex[:8]}"
    own = settings.model_copy(update={"app_id": name, "data_dir": work / name,
                                      "rebuild_processes": processes,
                                      "restore_in_process_below": 0, "web_enabled": False})
    worker = WorkerProcess(own, work / f"{name}.log")
    started = time.perf_counter()
    worker.spawn()
    wanted = {f"apply partition {p} taken" for p in range(settings.partitions)}
    try:
        while not all(w in worker.log_text() for w in wanted):
            if not worker.alive() or time.perf_counter() - started > 600:
                raise RuntimeError(f"worker ({processes} processes) did not take every "
                                   f"partition: {worker.log_text()[-2000:]}")
            time.sleep(0.05)
        return time.perf_counter() - started, own.data_dir / SHARDS_DIR
    finally:
        worker.stop()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--per-user", type=int, default=40)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--processes", default="1,2", help="process counts, compared in order")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", action="store_true",
                    help="also a worker's restore on an empty data dir per process count")
    args = smoke.parse(ap, SMOKE)
    counts = [int(n) for n in args.processes.split(",")]
    log = list(changes(args.users, args.per_user, DIM, duplicates=0.02, forget_every=50))
    n = len(log)
    settings = Settings(bootstrap_servers=args.bootstrap, partitions=args.partitions,
                        topic_prefix=f"bench-shards-{uuid.uuid4().hex[:8]}")
    asyncio.run(produce(settings, log))
    del log
    print(f"{n} changes ({args.users} users, {DIM}-dim vectors) on {args.partitions} "
          f"partitions; {load()}")
    seconds: dict[int, list[float]] = {k: [] for k in counts}
    built: dict[int, int] = {}
    found: dict[int, checksum.Digests] = {}
    restored: dict[int, list[float]] = {k: [] for k in counts}
    verdicts_worker: dict[int, checksum.Verification] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeats):
                for k in counts:
                    into = Path(tmp) / uuid.uuid4().hex
                    started = time.perf_counter()
                    done = build_shards(settings, into, DIM, processes=k)
                    seconds[k].append(time.perf_counter() - started)
                    built[k] = sum(d.changes for d in done)
                    found[k] = digests(into, args.partitions)
            for _ in range(args.repeats if args.worker else 0):
                for k in counts:
                    taken, shards = worker_restore(settings, Path(tmp), k)
                    restored[k].append(taken)
                    verdicts_worker[k] = checksum.compare(found[counts[0]],
                                                          digests(shards, args.partitions))
    finally:
        asyncio.run(drop(settings))
    first = counts[0]
    print(f"medians of {args.repeats}; {load()}")
    print(f"{'processes':>9} {'seconds':>8} {'changes/s':>10} {'vs ' + str(first):>7}  each s")
    rows: dict[str, Any] = {}
    for k in counts:
        s = statistics.median(seconds[k])
        ratio = statistics.median(seconds[first]) / s
        print(f"{k:>9} {s:8.2f} {n / s:10,.0f} {ratio:6.2f}x  "
              f"{[round(x, 2) for x in seconds[k]]}")
        rows[str(k)] = {"seconds": [round(x, 3) for x in seconds[k]],
                        "changes_per_s": round(n / s), "ratio": round(ratio, 2),
                        "changes_built": built[k]}
    if args.worker:
        print(f"a worker's restore on an empty data dir, start -> every partition taken "
              f"(medians of {args.repeats})")
        for k in counts:
            s = statistics.median(restored[k])
            ratio = statistics.median(restored[first]) / s
            print(f"{k:>9} {s:8.2f} {n / s:10,.0f} {ratio:6.2f}x  "
                  f"{[round(x, 2) for x in restored[k]]}  shards vs built: "
                  f"{verdicts_worker[k].summary()}")
            rows[str(k)]["worker_seconds"] = [round(x, 3) for x in restored[k]]
            rows[str(k)]["worker_changes_per_s"] = round(n / s)
            rows[str(k)]["worker_ratio"] = round(ratio, 2)
            rows[str(k)]["worker_equal"] = verdicts_worker[k].ok
    verdicts = {k: checksum.compare(found[first], found[k]) for k in counts[1:]}
    for k, verdict in verdicts.items():
        print(f"checksums {first} vs {k} processes: {verdict.summary()}")
    print(json.dumps({"changes": n, "users": args.users, "partitions": args.partitions,
                      "repeats": args.repeats, "smoke": args.smoke, "processes": rows,
                      "equal": all(v.ok for v in verdicts.values()), "load": load()}))


if __name__ == "__main__":
    main()
