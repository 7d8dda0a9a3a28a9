"""The worker's side of ``memstream rebuild --verify / --swap`` (memstream.memory.store.switch): a
timer that takes requests from ``data_dir/rebuild`` and answers them. Only a worker that
owns an embedded store (store=edge, extract on) takes them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from memstream.core.errors import describe, trace
from memstream.memory.store import MemoryStore
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.swappable import SwappableStore
from memstream.memory.store.switch import (
    SwitchRequest,
    SwitchResult,
    claim_ownership,
    discard,
    rebuild_dir,
    release_ownership,
    switch,
    write_json,
)
from memstream.streams import lifecycle
from memstream.streams.pipeline import Pipeline

log = logging.getLogger(__name__)
CLOSE_AFTER_S = 5.0  # a read that started on a store (milliseconds) finishes before it closes


def run_swaps(p: Pipeline) -> None:
    """The rebuild requests' timer as a part of the app (background), when the store can
    be swapped."""
    store = p.services.store
    if not isinstance(store, SwappableStore):
        return
    s = p.settings
    root = rebuild_dir(s)
    dim = p.services.embedder.dim
    busy = asyncio.Lock()
    closing: set[asyncio.Task[None]] = set()

    def open_store(path: Path) -> MemoryStore:
        return EdgeStore(path, dim)

    async def own() -> None:
        claim_ownership(s)
        await lifecycle.every(1.0, take_requests)

    async def disown() -> None:
        release_ownership(s)

    async def take_requests() -> None:
        if busy.locked() or not root.exists():
            return
        async with busy:
            for path in sorted(root.glob("request-*.json")):
                try:
                    request = SwitchRequest.model_validate_json(path.read_text())
                except (OSError, ValueError) as exc:
                    log.warning("unreadable rebuild request %s: %s", path.name, describe(exc))
                    path.unlink(missing_ok=True)
                    continue
                path.unlink(missing_ok=True)  # taken once
                await _answer(request)

    async def _answer(request: SwitchRequest) -> None:
        opener: Any = p.user_keys.opener() if p.user_keys is not None else None
        try:
            result, later = await switch(s, store, request, open_store, s.embedder, opener)
        except Exception as exc:
            log.error("rebuild request %s failed\n%s", request.request_id, trace(exc))
            result, later = SwitchResult(request_id=request.request_id, ok=False,
                                         switched=False, message=f"failed: {describe(exc)}"), None
        if later is not None and not later[2]:
            # a rebuilt store nobody served (not switched to, not kept): deleted before the
            # answer, so the CLI never returns while that copy of the memories is still there
            try:
                await asyncio.to_thread(discard, later[0], later[1])
            except Exception as exc:
                log.error("rebuild request %s: deleting %s failed\n%s", request.request_id,
                          later[1], trace(exc))
            later = None
        write_json(root / f"result-{request.request_id}.json", result)
        log.info("rebuild request %s: %s", request.request_id, result.message)
        if later is not None:
            task = asyncio.create_task(_discard_later(*later))
            closing.add(task)
            task.add_done_callback(closing.discard)

    async def _discard_later(old: MemoryStore, path: Path, served: bool) -> None:
        if served:
            await asyncio.sleep(CLOSE_AFTER_S)  # reads that started on it finish first
        await asyncio.to_thread(discard, old, path)

    lifecycle.run(p.app, "store-swap", own, disown, background=True)
