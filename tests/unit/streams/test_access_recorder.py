"""The API's hit publisher: never blocks a read, loses nothing on a failed send, bounded."""

from __future__ import annotations

import asyncio
import json

import pytest

from memstream.core.settings import Settings
from memstream.streams import access as recorder_module
from memstream.streams.access import AccessRecorder, access_event

pytestmark = pytest.mark.unit


class FakeProducer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[bytes] = []

    async def send(self, topic: str, key: bytes, value: bytes):
        if self.fail:
            raise ConnectionError("broker away")
        self.sent.append(value)
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def stop(self) -> None:
        pass


def event(n: int):
    return access_event("t1", "u1", "hit", [f"m{n}"], f"q{n}", f"e{n}", 1.0)


async def test_a_failed_send_keeps_the_events_in_order_then_sends_them():
    rec = AccessRecorder(Settings(bootstrap_servers="unused:1"), "topic", 0.1, 100)
    rec._producer = FakeProducer(fail=True)  # type: ignore[assignment]
    for n in range(3):
        rec.record(event(n))
    with pytest.raises(ConnectionError):
        await rec.flush()
    rec.record(event(3))  # arrived while the broker was away
    assert [e.event_id for e in rec.pending] == ["e0", "e1", "e2", "e3"]
    rec._producer.fail = False  # type: ignore[union-attr]
    assert await rec.flush() == 4
    sent = [json.loads(b)["event_id"] for b in rec._producer.sent]  # type: ignore[union-attr]
    assert sent == ["e0", "e1", "e2", "e3"] and not rec.pending and rec.sent == 4


async def test_the_queue_is_bounded_and_counts_what_it_drops(monkeypatch):
    monkeypatch.setattr(recorder_module, "MAX_PENDING", 3)
    rec = AccessRecorder(Settings(bootstrap_servers="unused:1"), "topic", 0.1, 100)
    for n in range(5):
        rec.record(event(n))
    assert [e.event_id for e in rec.pending] == ["e2", "e3", "e4"] and rec.dropped == 2
