"""Under exactly-once, Faust commits offsets only after the producer flushed what the
records produced (memstream.streams.commit_order)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust.transport.consumer import TransactionManager
from faust.types import TP

from memstream.streams.commit_order import flush_before_transactional_commit

pytestmark = pytest.mark.unit


async def test_the_producer_is_flushed_before_offsets_commit():
    calls: list[str] = []

    async def flush() -> None:
        calls.append("flush")

    async def commit_transactions(by_tid, group_id, start_new_transaction=True) -> None:
        calls.append(f"commit {sorted(by_tid)}")

    tp = TP("memstream.decisions", 3)
    app = SimpleNamespace(producer=SimpleNamespace(flush=flush), conf=SimpleNamespace(id="app"),
                          assignor=SimpleNamespace(group_for_topic=lambda topic: 0))
    manager = SimpleNamespace(app=app, producer=SimpleNamespace(
        commit_transactions=commit_transactions))
    flush_before_transactional_commit()
    flush_before_transactional_commit()  # idempotent: flushes once, not twice
    assert await TransactionManager.commit(manager, {tp: 10}) is True
    assert calls == ["flush", "commit ['app-0-3']"]
