"""The cost of sealing change events (forget-me crypto-shredding), side by side (not a test).

    .venv/bin/python benchmarks/crypto.py [--changes 5000] [--repeats 5] [--smoke]

Builds ``--changes`` realistic change events (a 512-dim embedding, before/after/records,
a reason) and times, in one run, what the apply stage does per published change with
sealing off and on (serialise; or seal with the user's data key and serialise), what a
reader does (parse; or parse and open), and one change applied to an embedded Qdrant Edge
store for scale (the work a published change rides on). Prints a table of medians per
change and one JSON line. ``--smoke``: tiny sizes (seconds), to check it still runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.memory.applying import apply_change
from memstream.memory.crypto import change_sealing
from memstream.memory.model import Memory, MemoryType, Source
from memstream.memory.store.edge import EdgeStore
from memstream.sealing import envelope as crypto
from memstream.topics.schemas import Lineage, MemoryChange

DIM = 512
SMOKE = {"changes": 100, "repeats": 1}  # --smoke: defaults for a run of seconds


def changes(n: int, rng: random.Random) -> list[MemoryChange]:
    out = []
    for i in range(n):
        vec = [rng.gauss(0, 1) for _ in range(DIM)]
        norm = sum(x * x for x in vec) ** 0.5
        m = Memory(f"m{i}", "bench", f"u{i % 50}", MemoryType.EPISODIC,
                   f"Lives in city number {i}, moved there with two kids", 5, 0.0, 0.0, 0.0,
                   Source("s", 0, 4, f"j{i}", f"op{i}"))
        out.append(MemoryChange(
            change_id=f"op{i}", op="add", tenant_id="bench", user_id=m.user_id,
            memory_id=m.memory_id, version=1, before=None, after=m.to_payload(),
            records=[m.to_payload()], vector=[x / norm for x in vec],
            reason="the user said where they live now", model="rules", prompt_version="v1",
            lineage=Lineage(session_id="s", from_seq=0, to_seq=4, job_id=f"j{i}", seq=i + 1),
            decided_at=datetime(2026, 1, 1, tzinfo=UTC)))
    return out


def per_item_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--changes", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    args = smoke.parse(ap, SMOKE)
    n, r = args.changes, args.repeats
    items = changes(n, random.Random(7))
    key = crypto.new_data_key()
    plain_wire = [c.dumps() for c in items]
    sealed_wire = [change_sealing.seal_change(c, "k1", key).dumps() for c in items]
    f: dict[str, float] = {
        "publish_plain_us": per_item_us(lambda: [c.dumps() for c in items], n, r),
        "publish_sealed_us": per_item_us(
            lambda: [change_sealing.seal_change(c, "k1", key).dumps() for c in items], n, r),
        "read_plain_us": per_item_us(
            lambda: [MemoryChange.model_validate_json(w) for w in plain_wire], n, r),
        "read_sealed_us": per_item_us(
            lambda: [change_sealing.open_change(MemoryChange.model_validate_json(w), {"k1": key})
                     for w in sealed_wire], n, r),
    }
    with tempfile.TemporaryDirectory() as tmp:
        store = EdgeStore(Path(tmp) / "edge", DIM)
        k = min(n, 1000)
        t0 = time.perf_counter()
        for c in items[:k]:
            apply_change(store, c)
        f["apply_to_store_us"] = (time.perf_counter() - t0) / k * 1e6
        store.close()
    f = {k: round(v, 1) for k, v in f.items()}
    f["bytes_plain"] = round(statistics.mean(len(w) for w in plain_wire))
    f["bytes_sealed"] = round(statistics.mean(len(w) for w in sealed_wire))
    extra_pub = f["publish_sealed_us"] - f["publish_plain_us"]
    rows = [
        ("publish one change: serialise (off) / seal + serialise (on), us",
         f"{f['publish_plain_us']} / {f['publish_sealed_us']} "
         f"(x{f['publish_sealed_us'] / f['publish_plain_us']:.2f})"),
        ("read one change: parse (off) / parse + open (on), us",
         f"{f['read_plain_us']} / {f['read_sealed_us']} "
         f"(x{f['read_sealed_us'] / f['read_plain_us']:.2f})"),
        ("apply one change to Qdrant Edge (for scale), us", f"{f['apply_to_store_us']}"),
        ("sealing's share of publish + apply",
         f"{100 * extra_pub / (f['publish_sealed_us'] + f['apply_to_store_us']):.1f}%"),
        ("record size off / on, bytes", f"{f['bytes_plain']} / {f['bytes_sealed']}"),
    ]
    width = max(len(a) for a, _ in rows)
    print(f"{n} changes, {r} repeats, medians per change")
    for a, b in rows:
        print(f"{a:<{width}}  {b}")
    print(json.dumps({"changes": n, "repeats": r, "smoke": args.smoke, **f}))


if __name__ == "__main__":
    main()
