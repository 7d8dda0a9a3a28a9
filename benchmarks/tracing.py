"""The cost of tracing (docs/tracing.md) in the ingest and extract stages, off and on side
by side (not a test).

    .venv/bin/python benchmarks/tracing.py [--users 200] [--messages 8] [--runs 5] [--smoke]

Builds the stages as the worker does (the rules model, the hashing embedder, an embedded
store; no broker) and hands them batches as their loops would: ``--users`` users'
``--messages`` chat messages each (half of them with a producer's ``traceparent``) to the
ingest stage, then the jobs it made (signed, with their headers) to the extract stage; the
spans of each batch are settled as the loop settles them after a commit. Alternates
tracing ``off`` (MEMSTREAM_TRACING=off) and ``on`` (the SDK with a batch processor whose
exporter drops the spans: the worker's own cost, not the network's), run by run, and prints
the median microseconds per message (ingest) and per job (extract), and one JSON line.
``--smoke``: tiny sizes, to check it still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from benchmarks import smoke
from memstream.core import record_auth, record_keys, tracing
from memstream.core.settings import Settings
from memstream.streams.app import build_app
from memstream.streams.extract import ExtractStage
from memstream.streams.ingest import IngestStage
from memstream.streams.stage import TaskContext, Work
from memstream.topics.schemas import ChatMessage

SMOKE = {"users": 10, "messages": 4, "runs": 1}
BATCH = 200
TEXTS = ["I moved to Berlin last spring", "My daughter started school", "ok",
         "I work at a bakery on weekends", "thanks!", "We adopted a cat named Miso"]


class Dropped(SpanExporter):
    """Takes every span and sends it nowhere."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def messages(settings: Settings, users: int, per_user: int) -> list[Any]:
    topic = settings.topic("messages")
    now = datetime.now(UTC)
    out = []
    for i in range(per_user):
        for u in range(users):
            m = ChatMessage(tenant_id="bench", user_id=f"u{u}", session_id="s1",
                            message_id=uuid.uuid4().hex, role="user",
                            content=TEXTS[(u + i) % len(TEXTS)], ts=now)
            headers = []
            if u % 2:  # half the producers send their trace
                parent = tracing.format_traceparent(uuid.uuid4().int, uuid.uuid4().int >> 64, 1)
                headers.append((tracing.TRACEPARENT, parent))
            out.append(SimpleNamespace(topic=topic, partition=0, offset=len(out),
                                       key=m.key().encode(), value=m.dumps(), headers=headers,
                                       timestamp=int(now.timestamp() * 1000)))
    return out


def as_records(settings: Settings, out: list[Any]) -> list[Any]:
    """The jobs a batch sent, as the extract stage reads them (MAC and trace headers)."""
    keys = record_keys.keys_for(settings)
    found = []
    for r in out:
        role = record_auth.role_of(r[0], settings.topic_prefix)
        headers = [*(r[3] if len(r) == 4 else ()),
                   record_auth.header(keys, role, r[1], r[2])]
        found.append(SimpleNamespace(topic=r[0], partition=0, offset=len(found), key=r[1],
                                     value=r[2], headers=headers, timestamp=0))
    return found


async def one_run(base: Settings, mode: str, users: int, per_user: int) -> dict[str, float]:
    settings = base.model_copy(update={"data_dir": Path(tempfile.mkdtemp()) / "data"})
    if mode == "on":
        tracing.configure(settings, exporter=Dropped(), batch=True)
    else:
        tracing.shutdown()
    p = build_app(settings)
    try:
        ingest, extract = IngestStage(p), ExtractStage(p)
        slices = tuple(t.slice(0) for t in ingest.tables)
        processor = ingest.open(TaskContext(0, slices))
        inputs = messages(settings, users, per_user)
        jobs: list[Any] = []
        started = time.perf_counter()
        for n in range(0, len(inputs), BATCH):
            work = await processor.process(inputs[n:n + BATCH])
            assert isinstance(work, Work)
            for piece in slices:
                piece.commit()
            tracing.settle(work.spans, "committed")
            jobs += [r for r in work.out if r[0] == p.topics.jobs.name]
        ingest_s = time.perf_counter() - started
        records = as_records(settings, jobs)
        started = time.perf_counter()
        for n in range(0, len(records), extract.max_records):
            work = await extract.handle(records[n:n + extract.max_records])
            tracing.settle(work.spans, "committed")
        extract_s = time.perf_counter() - started
        return {"ingest_us": ingest_s / len(inputs) * 1e6,
                "extract_us": extract_s / max(1, len(records)) * 1e6, "jobs": len(records)}
    finally:
        tracing.shutdown()
        p.services.store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--messages", type=int, default=8, help="per user")
    ap.add_argument("--runs", type=int, default=5)
    args = smoke.parse(ap, SMOKE)
    base = Settings(embedder="hashing", web_enabled=False, partitions=1, min_new_messages=4,
                    archive=False, store_partitioned=False,
                    cluster_secret="bench-cluster-secret-0123456789abcdef",
                    app_id="bench", topic_prefix="bench")
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for _ in range(args.runs):
        for mode in runs:  # side by side, alternating
            runs[mode].append(asyncio.run(one_run(base, mode, args.users, args.messages)))
    result: dict[str, Any] = {"params": {"users": args.users, "messages": args.messages,
                                         "runs": args.runs}}
    print(f"{'':6} {'ingest us/msg':>14} {'extract us/job':>15}")
    for mode, found in runs.items():
        result[mode] = {k: statistics.median(r[k] for r in found)
                        for k in ("ingest_us", "extract_us", "jobs")}
        print(f"{mode:6} {result[mode]['ingest_us']:14.1f} {result[mode]['extract_us']:15.1f}")
    result["ratios"] = {k: round(result["on"][k] / result["off"][k], 3)
                        for k in ("ingest_us", "extract_us")}
    print(f"on/off {result['ratios']['ingest_us']:14.3f} {result['ratios']['extract_us']:15.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
