"""The demo's last part: the operator's view (issue 10): the worker's metrics summary, a
rebuild of the store from the memory-change topic (verified against the live store by the
running worker), and where the memory inspector is; and what a downstream service reads
(the public memory events)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import click
import httpx

from memstream.consumer import MemoryChanges
from memstream.core.settings import Settings
from memstream.ops.changes_cli import line
from memstream.web.models.metrics import MetricsSummary


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f} ms"


def report_metrics(settings: Settings) -> None:
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
    click.echo(f"  extraction lag p50 {_ms(s.extraction_lag.p50_s)} / p99 "
               f"{_ms(s.extraction_lag.p99_s)}   dead letters: "
               f"{sum(raw.dead_letters.values())}   store records: {raw.store_records}   "
               f"consumer lag: {raw.consumer_lag}")


def report_operations(settings: Settings, *, serve: bool, rebuild: bool = True) -> None:
    from memstream.ops.rebuild import run_rebuild

    report_metrics(settings)
    if not rebuild:  # several workers: each shard was restored from the topic already
        click.echo("\nRebuild: every worker restored its shards from the memory-change "
                   "topic (memstream status lists the restores)")
    else:
        _rebuild(settings, run_rebuild)
    _inspector(settings, serve)


def _rebuild(settings: Settings, run_rebuild: Any) -> None:
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
