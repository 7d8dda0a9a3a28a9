"""``memstream rebuild`` throughput, side by side with the change-by-change path (not a test).

    .venv/bin/python benchmarks/rebuild.py [--users 500] [--per-user 40] [--repeats 3]
        [--bootstrap 127.0.0.1:19092]

One synthetic change log (benchmarks/changegen.py: the real decision code, 512-dim
vectors, ~25% updates, ~7% deletes, a few re-published duplicates and forget-mes), then in
one run, each into a fresh embedded Qdrant Edge store:

- ``one by one``: every change through ``memory.apply.apply_change``, the store calls the
  live apply path makes per change (cursor, seen-before check, write, cursor): what a
  rebuild cost before this issue;
- ``fold``: ``memory.rebuild.Fold`` on the parsed changes (bookkeeping in memory, batched
  upserts); the same with Edge payloads not packed (as before issue 10);
- ``fold + parse``: the same from the serialized events (JSON → MemoryChange → fold);
- ``from Kafka`` (with ``--bootstrap``): the log produced to a fresh topic first, then what
  ``memstream rebuild`` runs: read (read_committed) + parse + fold + finish.

Prints a table (changes/s, medians of ``--repeats``) and one JSON line. The checksums of
the one-by-one and folded stores are compared (they must be equal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks.changegen import changes
from memstream.memory import checksum
from memstream.memory.apply import apply_change
from memstream.memory.rebuild import rebuild
from memstream.memory.store_edge import EdgeStore
from memstream.topics.schemas import MemoryChange

DIM = 512


@contextlib.contextmanager
def unpacked() -> Iterator[None]:
    """Edge records written as plain payloads, as before packing (memory.store_edge.pack)."""
    from memstream.memory import store_edge

    pack = store_edge.pack
    store_edge.pack = lambda payload: payload  # type: ignore[assignment]
    try:
        yield
    finally:
        store_edge.pack = pack


def timed(build: Callable[[EdgeStore], object], repeats: int, root: Path) -> tuple[float, Path]:
    runs = []
    last = root
    for _ in range(repeats):
        last = root / uuid.uuid4().hex
        store = EdgeStore(last, DIM)
        t0 = time.perf_counter()
        build(store)
        store.close()  # flushed: part of the cost
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), last


async def through_kafka(bootstrap: str, raw: list[bytes], root: Path, repeats: int) -> float:
    from aiokafka.admin import NewTopic

    from memstream.core import kafka
    from memstream.core.settings import Settings
    from memstream.memory.rebuild_topics import rebuild_into

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    settings = Settings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    admin = kafka.admin(settings)
    await admin.start()
    names = [settings.topic("memory-changes"), settings.topic("memory-access")]
    await admin.create_topics([NewTopic(n, 4, 1) for n in names])
    producer = kafka.producer(settings, linger_ms=20, max_request_size=16 * 1024 * 1024,
                              compression_type=None)
    await producer.start()
    for value in raw:
        key = json.loads(value)["user_id"].encode()
        await producer.send(names[0], value, key=key)
    await producer.flush()
    await producer.stop()
    runs = []
    try:
        for _ in range(repeats):
            store = EdgeStore(root / uuid.uuid4().hex, DIM)
            t0 = time.perf_counter()
            done = await rebuild_into(settings, store, embedder="bench", dim=DIM)
            store.close()
            runs.append(time.perf_counter() - t0)
            assert done.changes + done.skipped == len(raw), done
    finally:
        await admin.delete_topics(names)
        await admin.close()
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=500)
    ap.add_argument("--per-user", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bootstrap", default=None)
    args = ap.parse_args()
    log = list(changes(args.users, args.per_user, DIM, duplicates=0.02, forget_every=50))
    raw = [c.model_dump_json().encode() for c in log]
    n = len(log)
    rows: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t, one_path = timed(lambda s: [apply_change(s, c) for c in log], 1, root)
        rows["one by one (apply_change)"] = t
        t, fold_path = timed(lambda s: rebuild(s, log), args.repeats, root)
        rows["fold"] = t
        with unpacked():
            t, _ = timed(lambda s: rebuild(s, log), args.repeats, root)
        rows["fold, payloads not packed (before)"] = t
        t, _ = timed(lambda s: rebuild(s, (MemoryChange.model_validate_json(r) for r in raw)),
                     args.repeats, root)
        rows["fold + parse"] = t
        if args.bootstrap:
            rows["from Kafka (memstream rebuild)"] = asyncio.run(
                through_kafka(args.bootstrap, raw, root, args.repeats))
        a, b = EdgeStore(one_path, DIM), EdgeStore(fold_path, DIM)
        verdict = checksum.compare(checksum.digests(a.scan(vectors=True)),
                                   checksum.digests(b.scan(vectors=True)))
        a.close()
        b.close()
    base = n / rows["one by one (apply_change)"]
    print(f"{n} changes ({args.users} users, 512-dim vectors); medians of {args.repeats}")
    print(f"{'path':34} {'seconds':>8} {'changes/s':>10} {'vs one by one':>14}")
    for name, secs in rows.items():
        print(f"{name:34} {secs:8.2f} {n / secs:10.0f} {n / secs / base:13.1f}x")
    print(verdict.summary())
    print(json.dumps({"changes": n, "users": args.users, "equal": verdict.ok,
                      **{name: round(n / secs) for name, secs in rows.items()}}))


if __name__ == "__main__":
    main()
