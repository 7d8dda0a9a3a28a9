"""The demo's last part: the operator's view (issue 10): the worker's metrics summary, a
rebuild of the store from the topics verified user by user against the worker's store
(partitioned: its shards, with the worker stopped, as ``memstream rebuild`` does it), and
where the memory inspector is; and what a downstream service reads (the public memory
events)."""

from __future__ import annotations

import asyncio
from collections import Counter

import click
import httpx

from memstream.consumer import MemoryChanges
from memstream.contract.http_api.metrics import MetricsSummary
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess
from memstream.memory.governance_metrics import LAG_BUCKETS
from memstream.ops.changes_cli import line


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f} ms"


def _span(x: float | None) -> str:
    """A lag: ms under 10 s, then s, min (from 10 min), h (from 10 h); "≥ 1 d" at the
    histogram's last finite bound (a quantile beyond it reads as that bound)."""
    if x is None:
        return "-"
    if x >= LAG_BUCKETS[-1]:
        return f"≥ {LAG_BUCKETS[-1] / 86400:.0f} d"
    for unit, size in (("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if x >= 10 * size:
            return f"{x / size:.1f} {unit}"
    return _ms(x)


def report_metrics(settings: Settings, dated_back_days: int = 0) -> None:
    """``dated_back_days``: the oldest sample conversation's age (the extraction lag counts
    from when a job's newest message was said)."""
    assert settings.admin_key is not None
    url = f"http://127.0.0.1:{settings.web_port}"
    r = httpx.get(f"{url}/v1/metrics/summary", timeout=10,
                  headers={"X-API-Key": settings.admin_key.get_secret_value()})
    r.raise_for_status()
    s = MetricsSummary.model_validate(r.json())
    g, raw = s.governance, s.raw
    click.echo(f"\nMetrics (this worker, {s.elapsed_s:.0f} s; Prometheus scrapes {url}/metrics):")
    click.echo(f"  write volume: {raw.changes} changes ({raw.adds} adds)   conflict rate: "
               f"{_pct(g.conflict_rate)}   user deletion rate: {_pct(g.user_deletion_rate)}   "
               f"consolidation merges: {raw.consolidation_merges}")
    click.echo(f"  retrievals: {raw.retrievals}, hit rate {_pct(g.hit_rate)}   latency p50 "
               f"{_ms(s.retrieval_latency.p50_s)} / p99 {_ms(s.retrieval_latency.p99_s)}")
    per_msg = "-" if g.llm_calls_per_message is None else f"{g.llm_calls_per_message:.2f}"
    triggers = ", ".join(f"{k} {v}" for k, v in sorted(raw.jobs_by_trigger.items()))
    click.echo(f"  messages: {raw.messages}   LLM calls per message: {per_msg}   jobs by "
               f"trigger: {triggers or '-'}   trivial jobs: {raw.trivial_jobs}")
    dated = (f" (from when a job's newest message was said: the samples are dated up to "
             f"{dated_back_days} days back)") if dated_back_days else ""
    click.echo(f"  extraction lag{dated} p50 {_span(s.extraction_lag.p50_s)} / p99 "
               f"{_span(s.extraction_lag.p99_s)}   dead letters: "
               f"{sum(raw.dead_letters.values())}   store records: {raw.store_records}   "
               f"consumer lag: {raw.consumer_lag}")


def report_operations(settings: Settings, *, serve: bool, worker: WorkerProcess | None = None,
                      dated_back_days: int = 0) -> None:
    """The metrics summary, a verified rebuild of ``worker``'s store (None: several
    workers, each restored its shards from the topic already) and the inspector."""
    report_metrics(settings, dated_back_days)
    if worker is None:
        click.echo("\nRebuild: every worker restored its shards from the memory-change "
                   "topic (memstream status lists the restores)")
    elif settings.store_partitioned:
        _rebuild_shards(settings, worker, serve)
    else:
        _rebuild_single(settings)
    _inspector(settings, serve)


def _rebuild_shards(settings: Settings, worker: WorkerProcess, serve: bool) -> None:
    """``memstream rebuild`` as an operator runs it on the partitioned store: the worker
    stopped (its shards closed with their checkpoints), every partition's shard rebuilt
    from the topics into a new folder and compared with the worker's shard user by user,
    record for record, then the copy deleted. With ``serve`` the worker starts again."""
    from memstream.ops.rebuild_shards import rebuild_partitioned

    click.echo("\nRebuild of the store from the topics (memstream rebuild: the worker "
               "stopped, each partition's shard rebuilt from the memory-change, job-result "
               "and memory-access topics, compared with the worker's shard user by user, "
               "record for record, then deleted):")
    code = worker.stop()
    if code:  # shards closed without their checkpoints: the comparison still holds
        click.echo(f"  (the worker exited with code {code})")
    result = rebuild_partitioned(settings, settings.data_dir / "stores" / "demo-rebuild",
                                 verify=True, swap=False, force=False, keep=False,
                                 echo=lambda line: click.echo(f"  {line}"))
    if not result.verdicts:  # else rebuild_partitioned printed the verdict
        click.echo("  verified: nothing (the worker had no shard to compare with)")
    if serve:
        click.echo("  starting the worker again (it adopts its shards from their checkpoints)")
        worker.start()


def _rebuild_single(settings: Settings) -> None:
    from memstream.ops.rebuild import run_rebuild

    click.echo("\nRebuild of the store from the memory-change topic (memstream rebuild), "
               "verified user by user against the live store by the running worker (a few "
               "changes: start-up dominates; benchmarks/rebuild.py measures throughput):")
    run_rebuild(settings, settings.data_dir / "stores" / "demo-rebuild", progress=False)


def _inspector(settings: Settings, serve: bool) -> None:
    url = f"http://127.0.0.1:{settings.web_port}/inspector"
    if serve:
        assert settings.admin_key is not None
        click.echo(f"\nMemory inspector: {url}  (key: {settings.admin_key.get_secret_value()})")
    else:
        click.echo(f"\nMemory inspector: {url} while the worker runs "
                   "(`./scripts/demo.sh --serve` keeps it open)")


def report_downstream(settings: Settings, shown: int = 4) -> None:
    """What a downstream service reads: the public memory events (memstream.consumer)."""
    async def read() -> list[str]:
        async with MemoryChanges(settings, group_id=None, idle_timeout_s=1.0) as found:
            events = [e async for e in found]
        ops = Counter(e.op for e in events)
        head = (f"\nWhat downstream services read ({found.topic}, through "
                f"memstream.consumer; lines as `memstream changes tail` prints them): "
                f"{len(events)} events (" + ", ".join(f"{op} {n}" for op, n in
                                                   sorted(ops.items())) + ")")
        return [head] + [f"  {line(e)}" for e in events[:shown]]

    for text in asyncio.run(read()):
        click.echo(text)
