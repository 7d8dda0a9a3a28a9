"""Switching the embedded store to a rebuilt one (issue 10), and the files it goes through.

Layout under ``data_dir``:

- ``store.current``: the path of the store the worker opens (absent: ``data_dir/qdrant``);
- ``rebuild/owner.json``: the pid of the worker that owns the live store (the CLI asks
  it to verify / switch; a store another process has open cannot be opened anyway: its
  write-ahead log is locked);
- ``rebuild/request-<id>.json`` → ``rebuild/result-<id>.json``: one request, its answer.

A switch in the running worker (reads never stop):

1. catch the new store up from the rebuild's snapshot to the topics' high watermarks now
   (``read_committed``: past every transaction open now, once resolved), in a thread;
2. copy the live cursors that are ahead (jobs that changed nothing leave no event);
3. compare the per-user checksums, leaving out the users the live store wrote in the last
   ``rebuild_settle_s`` (their newest change events may not be committed yet; a Kafka
   transaction lives at most 60 s): for every other user the topic is complete;
4. with writes held (memory.store.swappable): copy the users written since from the live
   store into the new one (exact), write the pointer, make the new store current.

A partial rebuild (``--tenant`` / ``--user``) switches nothing: its users' records in the
live store are replaced by the rebuilt ones, except users written meanwhile (retry).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

from pydantic import BaseModel

from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, end_offsets, read_range
from memstream.memory.applying import apply_change
from memstream.memory.archive import cutoff
from memstream.memory.store import MemoryStore, checksum
from memstream.memory.store.rebuild_fold import Opener, fold_access
from memstream.memory.store.rebuild_topics import Manifest, selector
from memstream.memory.store.swappable import SwappableStore, UserKey, copy_cursors, copy_user
from memstream.topics.registry import registry
from memstream.topics.schemas import AccessEvent, MemoryChange

Discard = tuple[MemoryStore, Path, bool]  # a store to close and delete; after a delay?


class SwitchRequest(BaseModel):
    request_id: str
    path: str
    swap: bool  # False: verify only
    force: bool = False  # switch even if the checksums differ
    keep: bool = False  # keep a rebuilt store that is not switched to (default: deleted)


class SwitchResult(BaseModel):
    request_id: str
    ok: bool
    switched: bool
    message: str
    caught_up: int = 0  # changes applied to the new store after the rebuild's snapshot
    seconds: float = 0.0


def rebuild_dir(settings: Settings) -> Path:
    return settings.data_dir / "rebuild"


def current_store_path(settings: Settings) -> Path:
    pointer = settings.data_dir / "store.current"
    if pointer.exists():
        return Path(pointer.read_text().strip())
    return settings.data_dir / "qdrant"


def set_current_store_path(settings: Settings, path: Path) -> None:
    """Atomically, durably (fsync of the file and its directory)."""
    pointer = settings.data_dir / "store.current"
    tmp = pointer.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(str(path.resolve()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, pointer)
    fd = os.open(pointer.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def owner_pid(settings: Settings) -> int | None:
    """The live worker owning the store, if one runs."""
    try:
        pid = int(json.loads((rebuild_dir(settings) / "owner.json").read_text())["pid"])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, KeyError):
        return None


def claim_ownership(settings: Settings) -> None:
    root = rebuild_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    (root / "owner.json").write_text(json.dumps({"pid": os.getpid()}))


def release_ownership(settings: Settings) -> None:
    (rebuild_dir(settings) / "owner.json").unlink(missing_ok=True)


def write_json(path: Path, model: BaseModel) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(model.model_dump_json())
    os.replace(tmp, path)


def discard(store: MemoryStore, path: Path) -> None:
    """Close a store and delete its files: a store nobody serves must not keep what a
    forget-me erases from the live one."""
    store.close()
    shutil.rmtree(path, ignore_errors=True)


def verify(live: MemoryStore, new: MemoryStore, manifest: Manifest, vectors: bool,
           leave_out: Collection[UserKey] = (),
           turns_since: float | None = None) -> checksum.Verification:
    """``turns_since``: archived turns said before it (past ``archive_days``) are not
    compared (checksum.digests)."""
    def digests(store: MemoryStore) -> checksum.Digests:
        found = checksum.digests(store.scan(manifest.tenant, manifest.user, vectors=vectors),
                                 turns_since)
        for key in leave_out:
            found.users.pop(key, None)
        return found

    return checksum.compare(digests(live), digests(new))


def users_of(*stores: MemoryStore, tenant: str | None, user: str | None) -> set[UserKey]:
    return {(str(p.get("tenant_id")), str(p.get("user_id")))
            for store in stores for _, p, _ in store.scan(tenant, user)}


async def catch_up(settings: Settings, new: MemoryStore, manifest: Manifest,
                   opener: Opener | None) -> int:
    """Apply to ``new`` (in a thread) what the topics got after the rebuild's snapshot, up
    to their high watermarks now."""
    reg = registry(settings)
    topics = [reg.memory_changes.name, reg.memory_access.name]
    ends = await end_offsets(settings, topics)
    select = selector(manifest.tenant, manifest.user)
    applied = 0
    erased: dict[UserKey, float] = {}

    def apply(records: list[Record]) -> None:
        nonlocal applied
        for r in records:
            if r.value is None:
                continue
            change = MemoryChange.model_validate_json(r.value)
            if select is not None and not select(change.tenant_id, change.user_id):
                continue
            opened = opener(change) if opener is not None else change
            if opened is not None and not opened.sealed:
                applied += apply_change(new, opened)
                if opened.op == "erase":
                    erased[(opened.tenant_id, opened.user_id)] = opened.decided_at.timestamp()

    accesses: list[AccessEvent] = []
    b = settings
    await read_range(b, topics[0], ends[topics[0]], lambda rs: asyncio.to_thread(apply, rs),
                     start=manifest.offsets.get(topics[0]))
    await read_range(b, topics[1], ends[topics[1]],
                     lambda rs: accesses.extend(AccessEvent.model_validate_json(r.value)
                                                for r in rs if r.value is not None),
                     start=manifest.offsets.get(topics[1]))
    await asyncio.to_thread(fold_access, new, accesses, select, erased)
    return applied


async def switch(settings: Settings, store: SwappableStore, request: SwitchRequest,
                 open_store: Callable[[Path], MemoryStore], embedder: str,
                 opener: Opener | None) -> tuple[SwitchResult, Discard | None]:
    """Run one request in the worker; returns the result and the store to discard later
    (the old one after a switch; the new one when not switched, unless kept)."""
    started = time.perf_counter()
    path = Path(request.path)
    manifest = Manifest.load(path)

    def result(ok: bool, switched: bool, message: str, caught: int = 0) -> SwitchResult:
        return SwitchResult(request_id=request.request_id, ok=ok, switched=switched,
                            message=message, caught_up=caught,
                            seconds=time.perf_counter() - started)

    if manifest.embedder != embedder:
        return result(False, False, (
            f"the store was re-embedded with {manifest.embedder!r}, this worker embeds with "
            f"{embedder!r}: stop the worker, `memstream rebuild --swap` it offline, then "
            f"start the worker with MEMSTREAM_EMBEDDER={manifest.embedder}")), None
    new = await asyncio.to_thread(open_store, path)
    try:
        return await _switch(settings, store, request, manifest, new, path, opener, result)
    except BaseException:
        await asyncio.to_thread(new.close if request.keep else lambda: discard(new, path))
        raise


async def _switch(settings: Settings, store: SwappableStore, request: SwitchRequest,
                  manifest: Manifest, new: MemoryStore, path: Path, opener: Opener | None,
                  result: Callable[..., SwitchResult],
                  ) -> tuple[SwitchResult, Discard | None]:
    partial = manifest.tenant is not None or manifest.user is not None
    since = store.now() - settings.rebuild_settle_s
    caught = await catch_up(settings, new, manifest, opener)
    if not partial:
        await asyncio.to_thread(copy_cursors, store.current, new)
    dirty = store.written_since(since)
    verdict = await asyncio.to_thread(verify, store.current, new, manifest, True, dirty,
                                      cutoff(time.time(), settings.archive_days))
    note = (f" ({len(dirty)} user(s) written in the last {settings.rebuild_settle_s:.0f} s "
            "copied from the live store, not compared)")
    summary = verdict.summary() + (note if dirty else "")
    if not request.swap or not (verdict.ok or request.force):
        what = "verified only" if not request.swap else "not switched"
        return (result(verdict.ok, False, f"{summary}; {what}", caught),
                None if request.keep else (new, path, False))
    if partial:
        users = await asyncio.to_thread(users_of, new, store.current, tenant=manifest.tenant,
                                        user=manifest.user)
        replaced: list[UserKey] = []

        def replace(live: MemoryStore, written: set[UserKey]) -> bool:
            replaced.extend(sorted(users - written))
            for tenant, user in replaced:
                copy_user(new, live, tenant, user)
            return True

        await asyncio.to_thread(store.locked, since, replace)
        skipped = len(users) - len(replaced)
        return (result(verdict.ok, True, f"{summary}; switched: {len(replaced)} user(s) "
                       f"replaced in the live store" + (f", {skipped} written meanwhile "
                                                        "left as they are" if skipped else ""),
                       caught), None if request.keep else (new, path, False))
    old, old_path = store.current, current_store_path(settings)

    def take_over(live: MemoryStore, written: set[UserKey]) -> bool:
        for tenant, user in written:
            copy_user(live, new, tenant, user)
        set_current_store_path(settings, path)
        return True

    await asyncio.to_thread(store.locked, since, take_over, new)
    return (result(verdict.ok, True, f"{summary}; switched: the worker now serves the "
                   "rebuilt store", caught), (old, old_path, True))
