"""Run the CI chaos scenario (30 users, 4 SIGKILLs) again and again (not a test).

    MEMSTREAM_TEST_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python benchmarks/chaos_loop.py \\
        [--runs 8] [--first 0] [--work /tmp/chaos-loop] [--bootstrap HOST:PORT]
    .venv/bin/python benchmarks/chaos_loop.py --smoke --bootstrap HOST:PORT   # 4 users, 1 kill

Prints one line per run (sessions covered, jobs re-sent by their timeout, settle time,
memories missing / stale / duplicate, the public events against the changelog, the archived
turns missing / duplicate / unexpected). A run that fails, re-sends a job or settles slowly
keeps its worker log and dumps every record of the users concerned (jobs, decisions,
results, state changelog; committed and uncommitted, so aborted records show) to
``<work>/run<N>/dump.json``: how the lost jobs of stop 13 were traced. The last line on
stdout is one JSON object: runs, how many were OK, and one row per run. The broker
(``--bootstrap``, default ``$MEMSTREAM_TEST_BOOTSTRAP`` or 127.0.0.1:19092) is only used,
never restarted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks.chaos import (
    EVENT_CHECKS,
    archive_consistent,
    bench_settings,
    events_consistent,
    read_topics,
    run_chaos,
    scenario,
)
from memstream.core.settings import Settings
from memstream.topics.registry import all_topic_names, delete_topics, registry


@dataclass(frozen=True)
class Size:
    users: int
    kills: int
    settle_timeout: float
    job_timeout: float


FULL = Size(users=30, kills=4, settle_timeout=400.0, job_timeout=60.0)
SMOKE = Size(users=4, kills=1, settle_timeout=120.0, job_timeout=15.0)


async def dump(settings: Settings, figures: dict[str, Any], work: Path) -> None:
    t = registry(settings)
    jobs = await read_topics(settings, [(t.jobs.name, t.jobs.partitions)])
    users = {u for u, *_ in figures["uncovered_examples"]} | {
        json.loads(r.value)["user_id"] for r in jobs
        if json.loads(r.value).get("attempt", 1) > 1}
    out: dict[str, list[Any]] = {}
    topics = (("jobs", t.jobs.name), ("decisions", t.decisions.name),
              ("results", t.job_results.name), ("messages", t.messages.name),
              ("state", f"{settings.app_id}-ingest-state-changelog"))
    for committed in (True, False):
        for name, topic in topics:
            recs = await read_topics(settings, [(topic, settings.partitions)], committed=committed)
            out[f"{name}_{'c' if committed else 'u'}"] = [
                (r.partition, r.offset, r.timestamp, (r.value or b"").decode(errors="replace"))
                for r in recs if any(u.encode() in (r.key or b"") + (r.value or b"")
                                     for u in users)]
    (work / "dump.json").write_text(json.dumps(out, indent=1))
    (work / "figures.json").write_text(json.dumps(figures, indent=1, default=str))


async def one(boot: str, root: Path, i: int, size: Size = FULL) -> dict[str, Any]:
    work = root / f"run{i}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = bench_settings(boot, work, job_timeout_s=size.job_timeout)
    events, truth = scenario(size.users, seed=11)
    out = await run_chaos(settings, events, truth, kills=size.kills, work=work, rate=100.0,
                          seed=11 + i, settle_timeout=size.settle_timeout, keep_topics=True)
    f = out.figures
    counts = [r.counts() for r in (out.http, out.replayed)]
    public = {k: f[k] for k in EVENT_CHECKS}
    archive = out.archive.counts()
    ok = f["sessions_covered"] == f["sessions"] and events_consistent(f) and all(
        (c["missing"], c["stale"], c["duplicate"]) == (0, 0, 0) for c in counts
    ) and archive_consistent({**f, "archive": archive})
    print(i, "OK" if ok else "FAIL", f"covered {f['sessions_covered']}/{f['sessions']}",
          f"re-sent {f['job_records_resent_by_timeout']}", f"settle {f['settle_s']}s",
          "http", counts[0], "replay", counts[1], "public events", public,
          "archive", archive, flush=True)
    if not ok or f["job_records_resent_by_timeout"] or f["settle_s"] > 60:
        await dump(settings, f, work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    await delete_topics(settings, all_topic_names(settings))
    return {"run": i, "ok": ok, "sessions": f["sessions"],
            "sessions_covered": f["sessions_covered"], "kills_done": f["kills_done"],
            "job_records_resent_by_timeout": f["job_records_resent_by_timeout"],
            "settle_s": f["settle_s"], "runtime_s": f["runtime_s"],
            "http": counts[0], "replay": counts[1], "public_events": public,
            "archive": archive, "archive_worker_store": f.get("archive_worker_store")}


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="default 8 (smoke 1)")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/chaos-loop"))
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="the running broker (default $MEMSTREAM_TEST_BOOTSTRAP or "
                         "127.0.0.1:19092); never restarted")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny, to check it runs: 1 run of 4 users, 1 kill, job timeout 15 s")
    args = ap.parse_args()
    boot = args.bootstrap or os.environ.get("MEMSTREAM_TEST_BOOTSTRAP", "127.0.0.1:19092")
    runs = args.runs if args.runs is not None else 1 if args.smoke else 8
    size = SMOKE if args.smoke else FULL
    rows = [await one(boot, args.work, i, size)
            for i in range(args.first, args.first + runs)]
    print(json.dumps({"benchmark": "chaos_loop", "smoke": args.smoke, **asdict(size),
                      "runs": len(rows), "ok": sum(r["ok"] for r in rows), "rows": rows}))


if __name__ == "__main__":
    asyncio.run(main())
