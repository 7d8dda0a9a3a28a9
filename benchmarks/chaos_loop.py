"""Run the CI chaos scenario (30 users, 4 SIGKILLs) again and again (not a test).

    MEMSTREAM_TEST_BOOTSTRAP=127.0.0.1:19092 .venv/bin/python benchmarks/chaos_loop.py \\
        [--runs 8] [--first 0] [--work /tmp/chaos-loop]

Prints one line per run (sessions covered, jobs re-sent by their timeout, settle time,
memories missing / stale / duplicate). A run that fails, re-sends a job or settles slowly
keeps its worker log and dumps every record of the users concerned (jobs, decisions,
results, state changelog; committed and uncommitted, so aborted records show) to
``<work>/run<N>/dump.json``: how the lost jobs of stop 13 were traced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks.chaos import (
    bench_settings,
    read_topics,
    run_chaos,
    scenario,
)
from memstream.topics.registry import all_topic_names, delete_topics, registry


async def dump(settings, figures, work: Path) -> None:
    boot = settings.bootstrap_servers
    t = registry(settings)
    jobs = await read_topics(boot, [(t.jobs.name, t.jobs.partitions)])
    users = {u for u, *_ in figures["uncovered_examples"]} | {
        json.loads(r.value)["user_id"] for r in jobs
        if json.loads(r.value).get("attempt", 1) > 1}
    out: dict[str, list] = {}
    topics = (("jobs", t.jobs.name), ("decisions", t.decisions.name),
              ("results", t.job_results.name), ("messages", t.messages.name),
              ("state", f"{settings.app_id}-ingest-state-changelog"))
    for committed in (True, False):
        for name, topic in topics:
            recs = await read_topics(boot, [(topic, settings.partitions)], committed=committed)
            out[f"{name}_{'c' if committed else 'u'}"] = [
                (r.partition, r.offset, r.timestamp, (r.value or b"").decode(errors="replace"))
                for r in recs if any(u.encode() in (r.key or b"") + (r.value or b"")
                                     for u in users)]
    (work / "dump.json").write_text(json.dumps(out, indent=1))
    (work / "figures.json").write_text(json.dumps(figures, indent=1, default=str))


async def one(boot: str, root: Path, i: int) -> bool:
    work = root / f"run{i}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = bench_settings(boot, work)
    events, truth = scenario(30, seed=11)
    out = await run_chaos(settings, events, truth, kills=4, work=work, rate=100.0,
                          seed=11 + i, settle_timeout=400, keep_topics=True)
    f = out.figures
    counts = [r.counts() for r in (out.http, out.replayed)]
    ok = f["sessions_covered"] == f["sessions"] and all(
        (c["missing"], c["stale"], c["duplicate"]) == (0, 0, 0) for c in counts)
    print(i, "OK" if ok else "FAIL", f"covered {f['sessions_covered']}/{f['sessions']}",
          f"re-sent {f['job_records_resent_by_timeout']}", f"settle {f['settle_s']}s",
          "http", counts[0], "replay", counts[1], flush=True)
    if not ok or f["job_records_resent_by_timeout"] or f["settle_s"] > 60:
        await dump(settings, f, work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    await delete_topics(settings, all_topic_names(settings))
    return ok


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/chaos-loop"))
    args = ap.parse_args()
    boot = os.environ.get("MEMSTREAM_TEST_BOOTSTRAP", "127.0.0.1:19092")
    for i in range(args.first, args.first + args.runs):
        await one(boot, args.work, i)


if __name__ == "__main__":
    asyncio.run(main())
