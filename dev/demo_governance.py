"""The demo's last part: one user's history with lineage, then a forget-me and its
verification (SPEC §4 audit, §7)."""

from __future__ import annotations

from collections.abc import Sequence

import click

from memstream.client import MemoryClient
from memstream.core.settings import Settings
from memstream.ops.forget_verify import verify


def report_governance(settings: Settings, tenant: str, user: str, canary: str) -> None:
    assert settings.admin_key is not None
    url = f"http://127.0.0.1:{settings.web_port}"
    with MemoryClient(url, settings.admin_key.get_secret_value(), tenant_id=tenant) as c:
        memories = c.get_all(user_id=user, status="all")
        changed = max(memories, key=lambda m: m.version, default=None)
        click.echo(f"\nHistory of one of {tenant}/{user}'s memories "
                   "(every version, with where it came from):")
        if changed is not None:
            for v in c.history(changed.memory_id, user_id=user).versions:
                lin = v.lineage
                click.echo(f"  v{v.version} {v.status:10} {v.content!r}  <- {lin.kind} job "
                           f"{lin.job_id[:8]}, session {lin.session_id} messages "
                           f"{lin.from_seq}..{lin.to_seq}" + (
                               f", closed by job {lin.closed_by_job[:8]}"
                               if lin.closed_by_job else ""))
        log = c.changes(user_id=user, limit=5)
        click.echo("  change log (newest first): " + "; ".join(
            f"{x.lineage.kind} v{x.version} {x.status}" for x in log))
        click.echo(f"\nForget-me for {tenant}/{user} (data keys shredded, reads fenced at "
                   "once, then the erasure runs as a job of the user) ...")
        done = c.forget(user_id=user, reason="demo: the user asked", wait_s=30)
        left = c.get_all(user_id=user)
        click.echo(f"  {done.status}: {', '.join(x.op for x in done.changes) or '-'}; "
                   f"memories readable now: {len(left)}")
    found = verify(settings, tenant, user, [canary])
    click.echo(f"  memstream forget verify --needle {canary!r}:")
    _rows(found.rows())
    click.echo(f"  residues: {found.total}. The store and the change events are clean at "
               "once (sealed, key shredded); what is left sits in topics that go by "
               "retention (the chat services' messages, jobs, decisions: "
               f"{settings.retention_days} days here) and in changelogs until compaction "
               f"({settings.erasure_bound_s:.0f}s bound). tests/integration/test_forget.py "
               "waits for 0 with a short bound.")


def _rows(rows: Sequence[tuple[str, str]]) -> None:
    for what, n in rows:
        click.echo(f"    {what:<58} {n}")
