"""``memstream rebuild`` throughput: today's path and the new one side by side (not a test).

    .venv/bin/python benchmarks/rebuild.py [--users 500] [--per-user 40] [--repeats 3]
        [--bootstrap 127.0.0.1:19492] [--one-by-one] [--smoke]

One synthetic change log (benchmarks/changegen.py: the real decision code, 512-dim
vectors, ~25% updates, ~7% deletes, a few re-published duplicates and forget-mes), in two
wire forms: ``today`` as the memory-change topic carried it until 2026-12-02 (the vector a
JSON list of floats) and ``new`` (the vector packed: base64 of little-endian float32,
``topics.schemas.Vector``). In one run, alternating today / new per repeat, each into a
fresh embedded Qdrant Edge store (flushed and closed: part of the cost):

- ``parse``: the serialized events to ``MemoryChange`` objects. Today:
  ``model_validate_json`` with the vector typed ``list[float]`` (pydantic-core, float by
  float); new: ``topics.codec.decode_own`` (the same validation, the vector unpacked);
- ``fold``: ``memory.store.rebuild_fold.Fold`` on parsed changes. Today: records packed for
  Edge with ``json.dumps``, a flush per forget-me; new: pydantic-core JSON, forget-mes erased with
  the batch, unflushed;
- ``parse + fold``: both, from the bytes;
- ``from Kafka`` (with ``--bootstrap``): each form produced to a fresh topic first, then
  what ``memstream rebuild`` runs: read (read_committed) + parse + fold + finish. Today:
  the loop as it was (parse and fold in the event loop); new: ``rebuild_into``.
- ``one by one`` (with ``--one-by-one``): every change through
  ``memory.applying.apply_change`` (the live path's store calls per change), for reference.

Prints a table (changes/s, medians of ``--repeats``, new / today) and one JSON line. The
per-user checksums (memory.store.checksum) of the stores built both ways are compared: they must
be equal (today's float64 vectors and the packed float32 ones end as the same float32).
``--smoke``: tiny sizes (seconds), to check it still runs (``from Kafka`` still only with
``--bootstrap``, a running broker).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.changegen import changes
from memstream.memory.applying import apply_change
from memstream.memory.store import Scope, checksum
from memstream.memory.store import edge as store_edge
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.rebuild_fold import rebuild
from memstream.topics.codec import decode_own
from memstream.topics.schemas import MemoryChange

DIM = 512
PATHS = ("today", "new")
SMOKE = {"users": 10, "per_user": 5, "repeats": 1}  # --smoke: defaults for seconds


class TodayChange(MemoryChange):
    """The change event as parsed until 2026-12-02: the vector a plain ``list[float]``."""

    vector: list[float] | None = None


class TodayStore:
    """An Edge store as the fold used it until 2026-12-02: records packed with
    ``json.dumps``, a forget-me's erasure flushed on its own (no ``erase_users``)."""

    def __init__(self, store: EdgeStore) -> None:
        self._store = store

    def erase(self, scope: Scope) -> int:
        return self._store.erase(scope)

    def __getattr__(self, name: str) -> Any:
        if name == "erase_users":  # what the fold erases many users with since
            raise AttributeError(name)
        return getattr(self._store, name)


@contextlib.contextmanager
def json_dumps_packing() -> Iterator[None]:
    """Edge payloads serialized by ``json.dumps``, as before pydantic-core did it."""
    before = store_edge._json

    def dumps(payload: dict[str, Any]) -> str:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)

    store_edge._json = dumps
    try:
        yield
    finally:
        store_edge._json = before


def parse_today(raw: Iterable[bytes]) -> Iterator[MemoryChange]:
    return (TodayChange.model_validate_json(r) for r in raw)


def parse_new(raw: Iterable[bytes]) -> Iterator[MemoryChange]:
    return (decode_own(MemoryChange, r) for r in raw)


def fold_today(store: EdgeStore, log: Iterable[MemoryChange]) -> None:
    with json_dumps_packing():
        rebuild(TodayStore(store), log)


def fold_new(store: EdgeStore, log: Iterable[MemoryChange]) -> None:
    rebuild(store, log)


Took = tuple[float, float]  # seconds: wall clock, CPU of this process


def clock() -> Took:
    return time.perf_counter(), time.process_time()


def since(start: Took) -> Took:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def timed(build: Callable[[EdgeStore], object], root: Path) -> tuple[Took, Path]:
    path = root / uuid.uuid4().hex
    store = EdgeStore(path, DIM)
    t0 = clock()
    build(store)
    store.close()  # flushed: part of the cost
    return since(t0), path


def timed_parse(parse: Callable[[list[bytes]], Iterator[MemoryChange]],
                raw: list[bytes]) -> Took:
    t0 = clock()
    for _ in parse(raw):  # each change dropped at once, as a rebuild folds it
        pass
    return since(t0)


@contextlib.contextmanager
def frozen(objects: object) -> Iterator[None]:
    """``objects`` (the fold's input, held by the benchmark, not by a rebuild) kept out of
    the garbage collector's passes while timing."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def digests(path: Path) -> checksum.Digests:
    store = EdgeStore(path, DIM)
    try:
        return checksum.digests(store.scan(vectors=True))
    finally:
        store.close()


# --- from Kafka -----------------------------------------------------------------------------


async def rebuild_today(settings: Any, store: EdgeStore) -> int:
    """``memstream rebuild`` as it ran until 2026-12-02: parse and fold in the event loop,
    the vector parsed float by float (the access topic is empty here)."""
    from memstream.core.topic_reader import Record, end_offsets, read_range
    from memstream.memory.store.rebuild_fold import Fold
    from memstream.topics.registry import registry

    topic = registry(settings).memory_changes.name
    snapshot = await end_offsets(settings, [topic])
    fold = Fold(TodayStore(store))

    def on_changes(records: list[Record]) -> None:
        for r in records:
            if r.value is not None:
                fold.add(TodayChange.model_validate_json(r.value))

    with json_dumps_packing():
        await read_range(settings, topic, snapshot[topic], on_changes)
        await asyncio.to_thread(fold.finish)
    return fold.applied + fold.skipped


async def rebuild_new(settings: Any, store: EdgeStore) -> int:
    from memstream.memory.store.rebuild_topics import rebuild_into

    done = await rebuild_into(settings, store, embedder="bench", dim=DIM)
    return done.changes + done.skipped


async def through_kafka(bootstrap: str, wires: dict[str, list[bytes]], keys: list[bytes],
                        root: Path, repeats: int) -> tuple[dict[str, list[Took]], list[Path]]:
    """Each wire form on a topic of its own; rebuilt ``repeats`` times each, alternating."""
    from aiokafka.admin import NewTopic

    from memstream.core import kafka
    from memstream.core.settings import Settings

    settings = {p: Settings(bootstrap_servers=bootstrap,
                            topic_prefix=f"bench-{p}-{uuid.uuid4().hex[:8]}") for p in PATHS}
    names = [s.topic(t) for s in settings.values() for t in ("memory-changes", "memory-access")]
    admin = kafka.admin(settings["new"])
    await admin.start()
    await admin.create_topics([NewTopic(n, 4, 1) for n in names])
    await asyncio.sleep(1.0)  # leaders elected before the first produce
    producer = kafka.producer(settings["new"], linger_ms=20,
                              max_request_size=16 * 1024 * 1024, compression_type=None)
    await producer.start()
    for p in PATHS:
        topic = settings[p].topic("memory-changes")
        for key, value in zip(keys, wires[p], strict=True):
            await producer.send(topic, value, key=key)
    await producer.flush()
    await producer.stop()
    runs: dict[str, list[Took]] = {p: [] for p in PATHS}
    last: list[Path] = []
    try:
        for _ in range(repeats):
            last = []
            for p in PATHS:
                path = root / uuid.uuid4().hex
                store = EdgeStore(path, DIM)
                t0 = clock()
                read = await (rebuild_today if p == "today" else rebuild_new)(settings[p], store)
                store.close()
                runs[p].append(since(t0))
                assert read == len(keys), (p, read, len(keys))
                last.append(path)
    finally:
        await admin.delete_topics(names)
        await admin.close()
    return runs, last


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs"


def row(name: str, n: int, today: Sequence[Took], new: Sequence[Took]) -> dict[str, Any]:
    """Medians: changes/s by the wall clock (what an operator waits) and by this process's
    CPU time (steadier on a shared machine)."""
    a, b = (statistics.median(t[0] for t in today), statistics.median(t[0] for t in new))
    ca, cb = (statistics.median(t[1] for t in today), statistics.median(t[1] for t in new))
    print(f"{name:14} {a:7.2f} {b:7.2f} {n / a:9,.0f} {n / b:9,.0f} {a / b:6.2f}x "
          f"{n / ca:11,.0f} {n / cb:9,.0f} {ca / cb:6.2f}x")
    return {"today_per_s": round(n / a), "new_per_s": round(n / b), "ratio": round(a / b, 2),
            "today_per_cpu_s": round(n / ca), "new_per_cpu_s": round(n / cb),
            "cpu_ratio": round(ca / cb, 2),
            "today_s": [round(t[0], 3) for t in today], "new_s": [round(t[0], 3) for t in new]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=500)
    ap.add_argument("--per-user", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bootstrap", default=None)
    ap.add_argument("--one-by-one", action="store_true",
                    help="also replay change by change (apply_change), once")
    args = smoke.parse(ap, SMOKE)
    log = list(changes(args.users, args.per_user, DIM, duplicates=0.02, forget_every=50))
    wires = {"today": [c.model_dump_json().encode() for c in log],  # the vector as floats
             "new": [c.dumps() for c in log]}  # the wire form: the vector packed
    keys = [c.key().encode() for c in log]
    n = len(log)
    if not args.one_by_one:
        del log  # only the bytes stay, as in a rebuild
    print(f"{n} changes ({args.users} users, {DIM}-dim vectors); event size "
          f"{statistics.mean(map(len, wires['today'])):,.0f} B today, "
          f"{statistics.mean(map(len, wires['new'])):,.0f} B new; {load()}")
    times: dict[str, dict[str, list[Took]]] = {}
    stores: dict[str, Path] = {}
    parse = {"today": parse_today, "new": parse_new}
    fold = {"today": fold_today, "new": fold_new}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("parse", "fold", "parse + fold"):
            times[name] = {p: [] for p in PATHS}
        for _ in range(args.repeats):
            for p in PATHS:
                times["parse"][p].append(timed_parse(parse[p], wires[p]))
                parsed = list(parse[p](wires[p]))

                def fold_parsed(store: EdgeStore, p: str = p,
                                parsed: list[MemoryChange] = parsed) -> None:
                    fold[p](store, parsed)

                def parse_and_fold(store: EdgeStore, p: str = p) -> None:
                    fold[p](store, parse[p](wires[p]))

                with frozen(parsed):
                    t, _path = timed(fold_parsed, root)
                times["fold"][p].append(t)
                del parsed, fold_parsed
                t, stores[p] = timed(parse_and_fold, root)
                times["parse + fold"][p].append(t)
        compared = [("parse + fold today", stores["today"]), ("parse + fold new", stores["new"])]
        if args.bootstrap:
            times["from Kafka"], paths = asyncio.run(
                through_kafka(args.bootstrap, wires, keys, root, args.repeats))
            compared += [("from Kafka today", paths[0]), ("from Kafka new", paths[1])]
        one_by_one = None
        if args.one_by_one:
            (one_by_one, _), path = timed(lambda s: [apply_change(s, c) for c in log], root)
            compared.append(("one by one", path))
        found = [(label, digests(path)) for label, path in compared]
    print(f"medians of {args.repeats}; {load()}")
    print(f"{'':14} {'wall clock':-^45} {'CPU time':-^30}")
    print(f"{'path':14} {'today s':>7} {'new s':>7} {'today/s':>9} {'new/s':>9} {'ratio':>7} "
          f"{'today/cpu-s':>11} {'new/cpu-s':>9} {'ratio':>7}")
    rows = {name: row(name, n, t["today"], t["new"]) for name, t in times.items()}
    if one_by_one is not None:
        print(f"{'one by one':14} {one_by_one:7.2f} {'':7} {n / one_by_one:9,.0f}")
        rows["one by one"] = {"per_s": round(n / one_by_one)}
    reference = found[0][1]
    verdicts = {label: checksum.compare(reference, d) for label, d in found[1:]}
    for label, verdict in verdicts.items():
        print(f"checksums {found[0][0]} vs {label}: {verdict.summary()}")
    print(json.dumps({"changes": n, "users": args.users, "repeats": args.repeats,
                      "smoke": args.smoke, "equal": all(v.ok for v in verdicts.values()),
                      "load": load(),
                      **rows}))


if __name__ == "__main__":
    main()
