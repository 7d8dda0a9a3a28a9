"""``memstream changes tail`` (operators watch the public memory events) and ``memstream
schemas`` (the contract's JSON Schema files). See docs/consuming.md."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from datetime import UTC
from pathlib import Path

import click

from memstream.consumer import MemoryChanges, Received
from memstream.core.settings import Settings
from memstream.topics import jsonschema

SCHEMA_DIR = Path("docs/schemas")


def line(e: Received) -> str:
    """One event as one human line (never longer than about 200 characters)."""
    when = e.decided_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    head = f"{when} {e.tenant_id}/{e.user_id} {e.op:<6} {e.memory_id} v{e.version}"
    if e.op == "erase":
        body = f"erased {e.erased_versions} version records ({e.reason})"
    elif e.content == "sealed":
        body = "[sealed: this process has no MEMSTREAM_MASTER_KEY]"
    elif e.content == "shredded":
        body = "[erased: the user was forgotten]"
    else:
        state = e.before if e.op == "delete" else e.after
        text = state.content if state is not None else ""
        body = repr(text if len(text) <= 100 else text[:99] + "…")
    return f"{head} {body} [{e.lineage.kind}]"


@click.group()
def changes() -> None:
    """The public memory events (the topic downstream services read)."""


@changes.command("tail")
@click.option("--tenant", default=None, help="Only this tenant")
@click.option("--user", default=None, help="Only this user (needs --tenant; reads only the "
              "user's partition)")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line (the event, with partition, offset, content)")
@click.option("--from-beginning", is_flag=True, help="Every event kept, not only new ones")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Stop after N events")
@click.option("--idle", type=float, default=None,
              help="Stop after this many seconds without an event (default: follow)")
@click.pass_obj
def tail(settings: Settings, tenant: str | None, user: str | None, as_json: bool,
         from_beginning: bool, limit: int | None, idle: float | None) -> None:
    """Print memory events as they are committed (no consumer group, nothing committed);
    sealed content is opened when MEMSTREAM_MASTER_KEY is set."""
    if user is not None and tenant is None:
        raise click.UsageError("--user needs --tenant")

    async def run() -> None:
        n = 0
        async with MemoryChanges(settings, group_id=None, tenant=tenant, user=user,
                                 from_beginning=from_beginning, idle_timeout_s=idle) as found:
            async for event in found:
                click.echo(event.model_dump_json() if as_json else line(event))
                n += 1
                if limit is not None and n >= limit:
                    return

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run())
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.stdout.flush()


@click.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=SCHEMA_DIR,
              show_default=True)
@click.option("--check", is_flag=True, help="Exit 1 if a file differs from the models")
def schemas(directory: Path, check: bool) -> None:
    """Write the contract's JSON Schema files (generated from the pydantic models; run it
    from the repository root, or give --dir)."""
    if check:
        stale = jsonschema.stale(directory)
        for name in stale:
            click.echo(f"stale: {directory / name} (run: memstream schemas)", err=True)
        raise SystemExit(1 if stale else 0)
    for name in jsonschema.write(directory):
        click.echo(directory / name)
