"""Switching the embedded store to a rebuilt one (issue 10), and the files it goes through.

Layout under ``data_dir``:

- ``store.current``: the path of the store the worker opens (absent: ``data_dir/qdrant``);
- ``rebuild/owner.json``: the pid of the worker that owns the live store (the CLI asks
  it to verify / switch instead of opening a store another process owns);
- ``rebuild/request-<id>.json`` → ``rebuild/result-<id>.json``: one request and its answer.

A switch catches the new store up from the rebuild's snapshot offsets while every live
write is queued (memory.store_swap), compares the per-user checksums (memory.checksum) and
only then switches: for a full rebuild the worker's store becomes the new one (reads go on
throughout; the pointer makes it stick across restarts), for a partial one
(``--tenant`` / ``--user``) the users' records in the live store are replaced by the
rebuilt ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from memstream.memory import checksum
from memstream.memory.apply import apply_change
from memstream.memory.rebuild import Opener, fold_access
from memstream.memory.store import MemoryStore
from memstream.memory.store_swap import SwappableStore, copy_users
from memstream.rebuild_ops import Manifest, end_offsets, read_range, selector
from memstream.settings import Settings
from memstream.topics.registry import registry
from memstream.topics.schemas import AccessEvent, MemoryChange


class SwitchRequest(BaseModel):
    request_id: str
    path: str
    swap: bool  # False: verify only
    force: bool = False  # switch even if the checksums differ


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
    pointer = settings.data_dir / "store.current"
    tmp = pointer.with_suffix(".tmp")
    tmp.write_text(str(path.resolve()))
    os.replace(tmp, pointer)


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


def write_json(path: Path, model: BaseModel) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(model.model_dump_json())
    os.replace(tmp, path)


def verify(live: MemoryStore, new: MemoryStore, manifest: Manifest,
           vectors: bool) -> checksum.Verification:
    def digests(store: MemoryStore) -> checksum.Digests:
        return checksum.digests(store.scan(manifest.tenant, manifest.user, vectors=vectors))

    return checksum.compare(digests(live), digests(new))


async def catch_up(settings: Settings, new: MemoryStore, manifest: Manifest,
                   opener: Opener | None) -> int:
    """Apply to ``new`` what the topics got after the rebuild's snapshot, up to their high
    watermarks now (read_committed: past every transaction open now, once resolved)."""
    reg = registry(settings)
    topics = [reg.memory_changes.name, reg.memory_access.name]
    ends = await end_offsets(settings, topics)
    select = selector(manifest.tenant, manifest.user)
    applied = 0
    erased: dict[tuple[str, str], float] = {}

    def on_changes(values: list[bytes]) -> None:
        nonlocal applied
        for v in values:
            change = MemoryChange.model_validate_json(v)
            if select is not None and not select(change.tenant_id, change.user_id):
                continue
            opened = opener(change) if opener is not None else change
            if opened is not None and not opened.sealed:
                applied += apply_change(new, opened)
                if opened.op == "erase":
                    erased[(opened.tenant_id, opened.user_id)] = opened.decided_at.timestamp()

    accesses: list[AccessEvent] = []
    await read_range(settings, topics[0], manifest.offsets.get(topics[0]), ends[topics[0]],
                     on_changes)
    await read_range(settings, topics[1], manifest.offsets.get(topics[1]), ends[topics[1]],
                     lambda vs: accesses.extend(AccessEvent.model_validate_json(v) for v in vs))
    fold_access(new, accesses, select, erased)
    return applied


async def switch(settings: Settings, store: SwappableStore, request: SwitchRequest,
                 open_store: Callable[[Path], MemoryStore], embedder: str,
                 opener: Opener | None) -> tuple[SwitchResult, MemoryStore | None]:
    """Run one request in the worker; returns the result and the store to close later
    (the old one after a switch, the new one otherwise)."""
    started = time.perf_counter()
    path = Path(request.path)
    manifest = Manifest.load(path)
    if request.swap and manifest.embedder != embedder:
        return SwitchResult(
            request_id=request.request_id, ok=False, switched=False,
            message=f"the store was re-embedded with {manifest.embedder!r}, this worker "
                    f"embeds with {embedder!r}: stop it, `memstream rebuild --swap` again, "
                    f"then start it with MEMSTREAM_EMBEDDER={manifest.embedder}"), None
    new = await asyncio.to_thread(open_store, path)
    store.start_mirror()
    try:
        caught = await catch_up(settings, new, manifest, opener)
    except BaseException:
        store.stop_mirror()
        raise
    found: dict[str, Any] = {}
    vectors = manifest.embedder == embedder

    def check(live: MemoryStore, fresh: MemoryStore) -> bool:
        found["v"] = verify(live, fresh, manifest, vectors)
        return bool(request.swap and (found["v"].ok or request.force))

    partial = manifest.tenant is not None or manifest.user is not None
    users = None
    if partial:
        users = sorted({(str(p.get("tenant_id")), str(p.get("user_id")))
                        for _, p, _ in new.scan(manifest.tenant, manifest.user)})
    old = store.current
    switched = await asyncio.to_thread(store.switch, new, check,
                                       copy_users(users) if users is not None else None)
    verdict: checksum.Verification = found["v"]
    if switched and not partial:
        set_current_store_path(settings, path)
    what = ("switched: the worker now serves the rebuilt store" if switched and not partial
            else f"switched: {len(users or [])} user(s) replaced in the live store" if switched
            else "not switched" if request.swap else "verified only")
    result = SwitchResult(request_id=request.request_id, ok=verdict.ok, switched=switched,
                          message=f"{verdict.summary()}; {what}", caught_up=caught,
                          seconds=time.perf_counter() - started)
    return result, (old if switched and not partial else new)
