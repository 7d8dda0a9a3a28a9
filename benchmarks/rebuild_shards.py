"""``memstream rebuild`` of the partitioned layout: the shards built by 1 and by N processes
side by side (not a test).

    .venv/bin/python benchmarks/rebuild_shards.py --bootstrap HOST:PORT [--users 1000]
        [--per-user 40] [--partitions 2] [--processes 1,2] [--repeats 3] [--smoke]

One synthetic change log (benchmarks/changegen.py, as ``rebuild.py``: 512-dim vectors,
updates, deletes, re-published duplicates, forget-mes) is produced, keyed by user, to the
memory-change topic of a fresh topic set with ``--partitions`` partitions. Then, per repeat
and alternating, every shard is built from the topics by
``memstream.ops.rebuild_shards.build_shards`` (what ``memstream rebuild`` runs: the
worker's own restore, each partition's shard into a fresh directory, closed) with each
process count of ``--processes``. It reports changes/s by the wall clock from the call to
the last shard closed (the builder processes' start included), medians of ``--repeats``,
each count against the first, and checks that every count built the same shards
(per-user checksums of every record). One JSON line last.
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
from memstream.ops.rebuild_shards import build_shards

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
    verdicts = {k: checksum.compare(found[first], found[k]) for k in counts[1:]}
    for k, verdict in verdicts.items():
        print(f"checksums {first} vs {k} processes: {verdict.summary()}")
    print(json.dumps({"changes": n, "users": args.users, "partitions": args.partitions,
                      "repeats": args.repeats, "smoke": args.smoke, "processes": rows,
                      "equal": all(v.ok for v in verdicts.values()), "load": load()}))


if __name__ == "__main__":
    main()
