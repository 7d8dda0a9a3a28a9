"""Searches through the front port: one worker process against ``--processes N`` (not a test).

    .venv/bin/python benchmarks/read_processes.py [--users 200] [--messages 6000]
        [--processes 2] [--clients 8] [--requests 2000] [--runs 3]
        [--bootstrap HOST:PORT] [--smoke]

``benchmarks/read_load.py`` measures the HTTP API of one process over a store it fills
itself; N member processes need real workers that own parts of the users and forward to
each other. So here the memories come from the pipeline: ``benchmarks/pipeline.py``'s
backlog of ``--users`` users (about ``--messages`` chat messages) is worked through once
by one worker; then, alternating run by run on the same topics and the same requests, a
deployment of 1 process and one of ``--processes`` N (``memstream worker --processes N``)
is started on a fresh data dir (its shards restored from the memory-change topic), waited
for until every member serves its partitions, and loaded by ``--clients`` keep-alive
callers through the one front port (``read_load.py``'s closed-loop raw HTTP client; a
search that lands on a child that does not own the user is forwarded to the owner). req/s
and p50 / p99 per run, medians per deployment and the ratio N / 1. The machine's cores are
shared by the callers and the workers, as a chat service beside its workers would.

Prints a table and, last, one JSON line. ``--smoke``: tiny sizes, to check it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.ingest import produce, with_broker
from benchmarks.pipeline import backlog
from benchmarks.read_load import Row, one_pass
from benchmarks.retrieval import ADMIN_KEY, query_pool
from benchmarks.scale import follow_results
from benchmarks.scale_checks import TENANT, Coverage
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess, free_port_block
from memstream.ops.status import serves_what_it_owns
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics

SMOKE = {"users": 8, "messages": 200, "requests": 100, "runs": 1}
TIMEOUT_S = 1800.0


class Deployment:
    """One ``memstream worker`` (``processes`` of them) serving the front ``port``; CPU
    seconds summed over the supervisor and its children (read_load's ``Server`` shape)."""

    def __init__(self, settings: Settings, processes: int, log: Path) -> None:
        self.settings = settings
        self.processes = processes
        self.port = settings.web_port
        self.proc = WorkerProcess(settings, log)

    def pids(self) -> list[int]:
        assert self.proc.proc is not None
        if self.processes == 1:
            return [self.proc.proc.pid]
        try:
            found = json.loads((self.settings.data_dir / "processes.json").read_text())
        except (OSError, ValueError):
            return [self.proc.proc.pid]
        return [found["supervisor"], *found["children"].values()]

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def own_ports(self) -> list[int]:
        if self.processes == 1:
            return [self.port]
        return [self.port + 1 + i for i in range(self.processes)]


async def serving(d: Deployment, timeout: float = 600.0) -> float:
    """Until every member reports a map of all members, every partition it owns served;
    the seconds it took from the spawn."""
    import httpx

    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(headers=headers, timeout=10.0) as web:
        while time.monotonic() - t0 < timeout:
            if not d.proc.alive():
                raise RuntimeError(f"worker exited: {d.proc.log_text()[-2000:]}")
            ok = True
            for port in d.own_ports():
                try:
                    r = await web.get(f"http://127.0.0.1:{port}/v1/cluster")
                    status = r.json() if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    status = None
                if (status is None or len(status["workers"]) != d.processes
                        or not serves_what_it_owns(status)):
                    ok = False
                    break
            if ok:
                return round(time.monotonic() - t0, 1)
            await asyncio.sleep(0.5)
    raise RuntimeError(f"not serving after {timeout:.0f}s")


def requests_for(users: list[str], n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    pool = query_pool()
    out = []
    for _ in range(n):
        body = json.dumps({"query": rng.choice(pool)}).encode()
        head = (f"POST /v1/tenants/{TENANT}/users/{rng.choice(users)}/search HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        out.append(head.encode() + body)
    return out


async def fill(settings: Settings, args: argparse.Namespace, work: Path) -> None:
    """The backlog worked through once by one worker (its memories on the change topic)."""
    stream, events = backlog(args.users, args.messages)
    coverage = Coverage()
    follower = asyncio.create_task(follow_results(settings, coverage))
    await produce(settings, events, None)
    worker = WorkerProcess(settings.model_copy(update={
        "web_enabled": False, "data_dir": work / "fill", "group_instance_id": "fill"}),
        work / "fill.log").spawn()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while coverage.uncovered(stream.expected):
            if time.monotonic() > deadline or not worker.alive():
                raise RuntimeError(f"fill: not covered ({worker.poll()})")
            await asyncio.sleep(0.5)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        worker.stop()


async def one_run(settings: Settings, processes: int, label: str, work: Path,
                  requests: list[bytes], clients: int) -> dict[str, Any]:
    run = f"{label}-{uuid.uuid4().hex[:6]}"
    port = free_port_block(processes)
    d = Deployment(settings.model_copy(update={
        "processes": processes, "data_dir": work / run, "web_port": port,
        "group_instance_id": run}), processes, work / f"{run}.log")
    d.proc.spawn()
    try:
        ready_s = await serving(d)
        await one_pass(d, requests[:100], clients, Row())  # type: ignore[arg-type]  # warm
        row = Row()
        await one_pass(d, requests, clients, row)  # type: ignore[arg-type]
        return {"code": label, "processes": processes, "serving_after_s": ready_s,
                **row.summary()}
    finally:
        d.proc.stop(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--messages", type=int, default=6000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3, help="runs per deployment (median)")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT")
    args = smoke.parse(ap, SMOKE)
    name = f"readp-{uuid.uuid4().hex[:6]}"
    settings = with_broker(Settings(
        partitions=4, topic_prefix=name, app_id=name, web_enabled=True, admin_key=ADMIN_KEY,
        idle_timeout_s=5.0, tick_interval_s=1.0, leave_group_on_stop=True), args.bootstrap)
    work = Path(tempfile.mkdtemp(prefix="memstream-read-processes-"))
    users = [u for u in backlog(args.users, 0)[0].users]
    requests = requests_for(users, args.requests, seed=11)
    labels = [("1proc", 1), (f"{args.processes}proc", args.processes)]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in labels}

    async def everything() -> None:
        await create_topics(settings)
        try:
            await fill(settings, args, work)
            for i in range(args.runs):  # alternating, A B B A ...
                order = labels if i % 2 == 0 else labels[::-1]
                for label, n in order:
                    runs[label].append(await one_run(settings, n, label, work, requests,
                                                     args.clients))
                    print(json.dumps(runs[label][-1]), flush=True)
        finally:
            await delete_topics(settings, all_topic_names(settings))

    asyncio.run(everything())
    print(f"searches through the front port, {args.clients} callers, {args.requests} "
          f"requests per run, {os.cpu_count()} cores (the callers share them)")
    print(f"{'code':8} {'runs':>4} {'req/s median':>13} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'errors':>6} {'(req/s each)':30}")
    summary: dict[str, Any] = {}
    for label, rows in runs.items():
        each = [r["req_per_s"] for r in rows]
        summary[label] = {"req_per_s_median": median(each), "req_per_s_each": each,
                          "p50_ms_median": median(r["p50_ms"] for r in rows),
                          "p99_ms_median": median(r["p99_ms"] for r in rows),
                          "errors": sum(r["errors"] for r in rows), "runs": rows}
        s = summary[label]
        print(f"{label:8} {len(rows):>4} {s['req_per_s_median']:>13.0f} "
              f"{s['p50_ms_median']:>8.1f} {s['p99_ms_median']:>8.1f} {s['errors']:>6} "
              f"{each!s:30}")
    many = labels[1][0]
    ratio = summary[many]["req_per_s_median"] / summary["1proc"]["req_per_s_median"]
    print(f"req/s {many} / 1proc at {args.clients} callers: {ratio:.2f}x")
    if args.smoke:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"users": args.users, "messages": args.messages,
                      "clients": args.clients, "requests": args.requests,
                      "smoke": args.smoke, "ratio": round(ratio, 3), "codes": summary}))


if __name__ == "__main__":
    main()
