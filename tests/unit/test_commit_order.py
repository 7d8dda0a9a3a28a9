"""Under exactly-once, Faust commits offsets only after the producer flushed what the
records produced (memstream.streams.commit_order)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from faust.transport.consumer import TransactionManager
from faust.types import TP

from memstream.streams.commit_order import commit_after_outputs, drain

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
    commit_after_outputs()
    commit_after_outputs()  # idempotent: flushes once, not twice
    assert await TransactionManager.commit(manager, {tp: 10}) is True
    assert calls == ["flush", "commit ['app-0-3']"]


class SlowBuffer:
    """A producer buffer whose flush gives up early, like Faust's after 0.1 s."""

    def __init__(self, pending: int, sending: int) -> None:
        self.pending, self._memstream_sending, self.flushes = pending, sending, 0

    @property
    def size(self) -> int:
        return self.pending

    async def flush(self) -> None:
        self.flushes += 1
        self.pending = max(0, self.pending - 1)  # one message per try, then gives up


async def test_a_flush_drains_the_buffer_and_waits_for_the_record_being_handed_over():
    buffer = SlowBuffer(pending=3, sending=1)
    naps: list[float] = []

    async def sleep(s: float) -> None:
        naps.append(s)
        buffer._memstream_sending = 0  # the sender hands its record to the client

    await drain(buffer, sleep)
    assert buffer.size == 0 and buffer.flushes == 3 and len(naps) == 1
