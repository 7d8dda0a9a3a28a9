"""The public memory events against the changelog, for a downstream reader (not a test).

    .venv/bin/python benchmarks/consumer.py [--events 20000] [--users 200] [--repeats 3]
        [--micro 2000] [--bootstrap HOST:PORT] [--port 59092] [--smoke]

One synthetic change log (benchmarks/changegen.py: the real decision code, 512-dim
vectors, ~25% updates, ~7% deletes), measured side by side in one run:

- ``bytes``: the changelog event (``MemoryChange``) against the public ``MemoryEvent`` made
  of it (``topics.publishing.public_event``), plain and sealed (``sealing.envelope``),
  for adds and updates:
  median bytes of ``--micro`` changes each, event / change;
- ``produce``: per change, what the apply stage serialises: the changelog event alone
  (sealed: ``seal_change``) against the changelog event and its public event (built,
  both sealed, both dumped), plain and sealed: µs per change, medians of ``--repeats``
  over ``--micro`` changes (the change itself is made either way and not counted);
- ``read``: ``--events`` changes of ``--users`` users produced to fresh topics (the
  changelog, the public events plain, and sealed with user keys written to the user-keys
  topic), then read to the last one: a raw aiokafka read of the changelog parsed with
  ``MemoryChange.model_validate_json`` (what a downstream reader paid before), a raw read
  of the public events parsed with ``MemoryEvent.model_validate_json`` (the library's
  floor), and ``memstream.consumer.MemoryChanges`` (new group each time) on the plain and
  on the sealed events (master key set: every one must come ``opened``). Events/s from the
  first event delivered to the last (the start and the group join are shown apart),
  this process's CPU µs per event, medians of ``--repeats``. The topics are deleted.

The broker is ``--bootstrap`` (used as it is, never started or stopped), else our own on
``--port`` (started and stopped here). Prints a table and one JSON line. ``--smoke``:
tiny sizes (seconds), to check it still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.changegen import changes
from memstream.consumer import MemoryChanges
from memstream.contract.events import MemoryEvent
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.memory.crypto import change_sealing
from memstream.memory.crypto.user_keys import UserKeys
from memstream.sealing import envelope as crypto
from memstream.topics.layout import create_topics
from memstream.topics.publishing import public_event
from memstream.topics.registry import delete_topics, registry
from memstream.topics.schemas import MemoryChange

DIM = 512
KID = "k1"
MASTER = "a master key for the consumer benchmark"
IDLE_S = 30.0  # a reader that gets nothing this long has lost events: the run fails
SMOKE = {"events": 500, "users": 50, "repeats": 1, "micro": 100}  # --smoke: seconds
READERS = ("changelog_raw", "events_raw", "changes_plain", "changes_sealed")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs"


def sizes(log: Sequence[MemoryChange], key: bytes, micro: int) -> dict[str, dict[str, Any]]:
    """Median bytes per form, for the adds and the updates."""
    out: dict[str, dict[str, Any]] = {}
    for op in ("add", "update"):
        some = [c for c in log if c.op == op][:micro]
        forms = {"change_plain": [len(c.dumps()) for c in some],
                 "change_sealed": [len(change_sealing.seal_change(c, KID, key).dumps())
                                   for c in some],
                 "event_plain": [len(public_event(c).dumps()) for c in some],
                 "event_sealed": [len(crypto.seal_event(public_event(c), KID, key).dumps())
                                  for c in some]}
        row: dict[str, Any] = {k: round(statistics.median(v)) for k, v in forms.items()}
        row["ratio_plain"] = round(row["event_plain"] / row["change_plain"], 3)
        row["ratio_sealed"] = round(row["event_sealed"] / row["change_sealed"], 3)
        out[op] = {"changes": len(some), **row}
    return out


def produce_cost(log: Sequence[MemoryChange], key: bytes, repeats: int) -> dict[str, Any]:
    """µs per change: the changelog event alone, and with its public event."""
    def alone(sealed: bool) -> None:
        for c in log:
            (change_sealing.seal_change(c, KID, key) if sealed else c).dumps()

    def both(sealed: bool) -> None:
        for c in log:
            e = public_event(c)
            if sealed:
                c, e = change_sealing.seal_change(c, KID, key), crypto.seal_event(e, KID, key)
            c.dumps()
            e.dumps()

    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):  # interleaved: a busy moment hits every variant alike
        for mode in ("plain", "sealed"):
            for name, fn in (("changelog", alone), ("both", both)):
                t0 = time.perf_counter()
                fn(mode == "sealed")
                runs.setdefault((mode, name), []).append(
                    (time.perf_counter() - t0) / len(log) * 1e6)
    out: dict[str, Any] = {}
    for mode in ("plain", "sealed"):
        a, b = (statistics.median(runs[(mode, n)]) for n in ("changelog", "both"))
        out[mode] = {"changelog": round(a, 1), "both": round(b, 1), "ratio": round(b / a, 2)}
    return out


# --- reading ---------------------------------------------------------------------------


class Read:
    """One reader's pass: its start (to the first event) apart from the first event to the
    n-th (wall clock and this process's CPU time)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.first = self.c_first = self.end = self.c_end = 0.0
        self.got = 0
        self.contents: Counter[str] = Counter()

    def one(self, content: str = "parsed") -> None:
        self.got += 1
        self.contents[content] += 1
        if self.got == 1:
            self.first, self.c_first = time.perf_counter(), time.process_time()

    def done(self) -> None:
        self.end, self.c_end = time.perf_counter(), time.process_time()

    def figures(self) -> dict[str, float]:
        n = max(1, self.got - 1)
        return {"per_s": n / max(self.end - self.first, 1e-9),
                "start_s": self.first - self.t0,
                "cpu_us": (self.c_end - self.c_first) / n * 1e6}


async def read_raw(settings: Settings, topic: str, parse: Callable[[bytes], Any],
                   n: int) -> Read:
    """A plain aiokafka read (no group, no commits), each record parsed."""
    consumer = kafka.consumer(settings, topic, group_id=None, enable_auto_commit=False,
                              isolation_level="read_committed", auto_offset_reset="earliest")
    await kafka.started(consumer)
    run, idle = Read(), time.monotonic()
    try:
        while run.got < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batch.values():
                for r in records:
                    parse(r.value or b"")
                    run.one()
            if batch:
                idle = time.monotonic()
            elif time.monotonic() - idle > IDLE_S:
                raise RuntimeError(f"{topic}: {run.got} of {n} read")
        run.done()
    finally:
        await kafka.stopped(consumer)
    return run


async def read_changes(settings: Settings, n: int) -> Read:
    """``MemoryChanges`` in a group of its own, stopped at the n-th event."""
    run = Read()
    async with MemoryChanges(settings, group_id=f"bench-consumer-{uuid.uuid4().hex[:8]}",
                             idle_timeout_s=IDLE_S) as reader:
        async for event in reader:
            run.one(event.content)
            if run.got == n:
                run.done()
                break
        if run.got < n or reader.stats.duplicates or reader.stats.invalid:
            raise RuntimeError(f"MemoryChanges: {run.got} of {n}, {reader.stats}")
    return run


async def read_side(bootstrap: str, log: Sequence[MemoryChange], repeats: int
                    ) -> dict[str, list[Read]]:
    tag = uuid.uuid4().hex[:8]
    plain = Settings(bootstrap_servers=bootstrap, topic_prefix=f"bench-consumer-{tag}-plain")
    sealed = Settings(bootstrap_servers=bootstrap, topic_prefix=f"bench-consumer-{tag}-sealed",
                      master_key=MASTER)
    tp, ts = registry(plain), registry(sealed)
    specs = {"plain": [tp.memory_changes, tp.memory_events],
             "sealed": [ts.memory_events, ts.user_keys]}
    await create_topics(plain, specs["plain"])
    await create_topics(sealed, specs["sealed"])
    n = len(log)
    try:
        await asyncio.sleep(1.0)  # leaders elected before the first produce
        producer = kafka.producer(plain, linger_ms=20, max_request_size=16 * 1024 * 1024,
                                  compression_type=None)
        keys = UserKeys(sealed, ts.user_keys.name)
        await producer.start()
        await keys.start()
        try:
            if not await keys.wait_ready(60.0):
                raise TimeoutError("user-keys topic not read")
            for c in log:
                k, e = c.key().encode(), public_event(c)
                key_id, data_key = await keys.key_for_write(c.tenant_id, c.user_id)
                await producer.send(tp.memory_changes.name, c.dumps(), key=k)
                await producer.send(tp.memory_events.name, e.dumps(), key=k)
                await producer.send(ts.memory_events.name,
                                    crypto.seal_event(e, key_id, data_key).dumps(), key=k)
            await producer.flush()
        finally:
            await keys.stop()
            await producer.stop()
        runs: dict[str, list[Read]] = {r: [] for r in READERS}
        for _ in range(repeats):
            runs["changelog_raw"].append(await read_raw(
                plain, tp.memory_changes.name, MemoryChange.model_validate_json, n))
            runs["events_raw"].append(await read_raw(
                plain, tp.memory_events.name, MemoryEvent.model_validate_json, n))
            runs["changes_plain"].append(await read_changes(plain, n))
            runs["changes_sealed"].append(await read_changes(sealed, n))
    finally:
        await delete_topics(plain, [s.name for s in specs["plain"]])
        await delete_topics(sealed, [s.name for s in specs["sealed"]])
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--micro", type=int, default=2000, help="changes in bytes and produce")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="a running broker (else our own on --port, started and stopped)")
    ap.add_argument("--port", type=int, default=59092, help="the benchmark's own broker")
    args = smoke.parse(ap, SMOKE)
    log = list(changes(args.users, max(1, args.events // args.users), DIM))
    n, key = len(log), crypto.new_data_key()
    print(f"{n} changes ({args.users} users, {DIM}-dim vectors), {args.repeats} repeats; "
          f"{load()}", flush=True)
    bytes_ = sizes(log, key, args.micro)
    produce = produce_cost(log[:args.micro], key, args.repeats)
    broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
    started = args.bootstrap is None and \
        local_broker.read_pid(local_broker.paths_for(broker)) is None
    if started:
        local_broker.start(broker, 180.0)
    try:
        runs = asyncio.run(read_side(args.bootstrap or f"127.0.0.1:{args.port}", log,
                                     args.repeats))
    finally:
        if started:
            local_broker.stop(broker)
    opened = [r.contents["opened"] for r in runs["changes_sealed"]]
    ok = all(r.contents["plain"] == n for r in runs["changes_plain"]) and min(opened) == n
    read: dict[str, Any] = {}
    for name, rs in runs.items():
        figs = [r.figures() for r in rs]
        read[name] = {k: round(statistics.median(f[k] for f in figs), digits)
                      for k, digits in (("per_s", None), ("start_s", 3), ("cpu_us", 1))}
        read[name]["per_s_each"] = [round(f["per_s"]) for f in figs]
    per_s = {name: r["per_s"] for name, r in read.items()}
    ratios = {f"{a}/{b}": round(per_s[a] / per_s[b], 2) for a, b in (
        ("changes_plain", "changelog_raw"), ("changes_sealed", "changelog_raw"),
        ("changes_plain", "events_raw"), ("changes_sealed", "changes_plain"))}

    print(f"\nevent size, bytes (median of {bytes_['add']['changes']} adds, "
          f"{bytes_['update']['changes']} updates)")
    print(f"{'op':8} {'change':>8} {'event':>8} {'ratio':>6}   {'change sealed':>13} "
          f"{'event sealed':>12} {'ratio':>6}")
    for op, b in bytes_.items():
        print(f"{op:8} {b['change_plain']:>8,} {b['event_plain']:>8,} {b['ratio_plain']:>6} "
              f"  {b['change_sealed']:>13,} {b['event_sealed']:>12,} {b['ratio_sealed']:>6}")
    print(f"\nproduce per change, µs (medians of {args.repeats} over "
          f"{min(args.micro, n)} changes)")
    print(f"{'':8} {'changelog':>10} {'+ event':>10} {'ratio':>6}")
    for mode, p in produce.items():
        print(f"{mode:8} {p['changelog']:>10} {p['both']:>10} {p['ratio']:>6}")
    print(f"\nread {n} events (medians of {args.repeats}; {load()})")
    print(f"{'reader':16} {'events/s':>9} {'cpu µs/ev':>9} {'start s':>8}  each")
    for name, r in read.items():
        print(f"{name:16} {r['per_s']:>9,.0f} {r['cpu_us']:>9} {r['start_s']:>8}  "
              f"{r['per_s_each']}")
    print("ratios: " + ", ".join(f"{k} {v}x" for k, v in ratios.items()))
    print(f"sealed events opened: {opened} of {n}; all as expected: {ok}")
    print(json.dumps({"events": n, "users": args.users, "repeats": args.repeats,
                      "smoke": args.smoke, "load": load(), "bytes": bytes_,
                      "produce_us": produce, "read": read, "read_per_s": per_s,
                      "ratios": ratios, "opened": min(opened), "all_opened": ok}))
    if not ok:
        raise SystemExit("not every sealed event opened, or a plain one came otherwise")


if __name__ == "__main__":
    main()
