"""``memstream replay``: the command around :mod:`memstream.ops.replay` (docs/operations.md)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from memstream.core.errors import MemstreamError
from memstream.core.settings import Settings
from memstream.memory.reextraction import Filters
from memstream.ops.replay import STOPPED_EXIT, Options, Report, run


def _when(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"not an ISO 8601 time: {value!r}", param_hint=name) from exc
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


@click.command()
@click.option("--into", type=click.Path(path_type=Path), default=None,
              help="New Qdrant Edge store path (never the live one)")
@click.option("--collection", default=None,
              help="New collection on the Qdrant server (MEMSTREAM_STORE=server)")
@click.option("--since", default=None, help="Messages at or after this time (ISO 8601; UTC "
              "when no offset)")
@click.option("--until", default=None, help="Messages before this time (ISO 8601)")
@click.option("--tenant", default=None, help="Only this tenant")
@click.option("--user", default=None, help="Only this user (with --tenant to be exact)")
@click.option("--dry-run", is_flag=True, help="Print the jobs, LLM calls and tokens; run nothing")
@click.option("--max-calls", type=click.IntRange(min=0), default=None,
              help="Stop before the first job whose LLM calls would not fit")
@click.option("--record", "record", type=click.Path(path_type=Path), default=None,
              help="Call the LLM and append every answer to FILE (JSONL)")
@click.option("--recorded", type=click.Path(path_type=Path), default=None,
              help="Offline: every answer from FILE; a missing one is an error, never a call")
@click.option("--reuse", is_flag=True,
              help="With --record: answers FILE holds are reused, only misses are called")
@click.option("--resume", is_flag=True,
              help="Continue an earlier replay (same options) in a non-empty target")
@click.pass_obj
def replay(settings: Settings, into: Path | None, collection: str | None, since: str | None,
           until: str | None, tenant: str | None, user: str | None, dry_run: bool,
           max_calls: int | None, record: Path | None, recorded: Path | None, reuse: bool,
           resume: bool) -> None:
    """Re-extract memories from the messages topic into a NEW store, with the model of the
    settings (MEMSTREAM_LLM, _LLM_MODEL, _LLM_MODE; rules by default).

    Exit codes: 0 done, 3 stopped by --max-calls (nothing half-applied), 1 an error.
    The last line printed is a JSON summary.
    """
    if record is not None and recorded is not None:
        raise click.UsageError("--record and --recorded exclude each other")
    if reuse and record is None:
        raise click.UsageError("--reuse goes with --record")
    if not dry_run and (into is None) == (collection is None):
        raise click.UsageError("give exactly one target: --into PATH or --collection NAME")
    options = Options(
        filters=Filters(_when(since, "--since"), _when(until, "--until"), tenant, user),
        into=into, collection=collection, dry_run=dry_run, max_calls=max_calls,
        recording=record or recorded,
        recording_mode="replay" if recorded is not None else "auto" if reuse else "record",
        resume=resume)
    try:
        report = run(settings, options, click.echo)
    except MemstreamError as exc:
        raise click.ClickException(str(exc)) from exc
    _print_outcome(report, into or collection)
    click.echo(json.dumps(report.summary(), ensure_ascii=False))
    if report.failed:
        sys.exit(1)
    if report.stopped is not None:
        sys.exit(STOPPED_EXIT)


def _print_outcome(r: Report, target: object) -> None:
    if r.dry_run:
        click.echo("dry run: nothing decided, nothing written")
        return
    ops = ", ".join(f"{k} {v}" for k, v in sorted(r.ops.items())) or "no changes"
    rate = f", {r.done / r.seconds:.1f} jobs/s" if r.seconds and r.done else ""
    click.echo(f"done: {r.done} of {len(r.plan.jobs)} jobs into {target} ({ops}); "
               f"{r.resumed} already there; LLM calls {r.calls}, tokens {r.prompt_tokens} + "
               f"{r.completion_tokens}; {r.seconds:.1f}s{rate}")
    if r.recorder:
        s = r.recorder
        click.echo(f"recording: {s['replayed']} answers replayed, {s['recorded']} recorded "
                   f"({s['loaded']} in the file at start, {s['skipped_lines']} unreadable "
                   "lines skipped)")
    at = r.stopped_at
    if r.stopped is not None and at is not None:
        click.echo(f"STOPPED before job {r.done + r.resumed + 1} of {len(r.plan.jobs)} "
                   f"({at.tenant_id}/{at.user_id}, session {at.session_id}, messages "
                   f"[{at.from_seq}, {at.to_seq}), {at.created_at.isoformat()}): {r.stopped}")
        if not r.failed:
            click.echo("nothing of that job was applied; raise --max-calls and add --resume "
                       "to continue")
