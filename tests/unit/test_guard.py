"""No exception escapes an agent (memstream.streams.guard)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import memstream.streams.guard as guard
from memstream.streams.counters import Counters

pytestmark = pytest.mark.unit


class Flaky:
    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


@pytest.fixture
def world(monkeypatch):
    letters: list[tuple[str, str]] = []

    async def send_dead_letter(p, exc, message):
        letters.append((exc.kind, str(exc)))

    monkeypatch.setattr(guard, "send_dead_letter", send_dead_letter)
    p = SimpleNamespace(counters=Counters(), app=SimpleNamespace())
    message = SimpleNamespace(topic="t", partition=0, offset=7)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    return p, message, letters, slept, sleep


async def test_transient_failures_are_retried_in_place(world):
    p, message, letters, slept, sleep = world
    handle = Flaky(ConnectionError("broker down"), TimeoutError("slow"))
    await guard.guarded(p, message, handle, sleep=sleep)
    assert handle.calls == 3 and len(slept) == 2 and letters == []
    assert p.counters.handler_retries == 2


async def test_a_bug_sets_the_record_aside_and_moves_on(world):
    p, message, letters, slept, sleep = world
    handle = Flaky(KeyError("surprise"))
    await guard.guarded(p, message, handle, sleep=sleep)
    assert handle.calls == 1 and slept == []
    assert letters == [("internal", "KeyError: 'surprise'")]
    assert p.counters.handler_failures == 1


async def test_a_guarded_record_holds_the_commit_gate_until_it_is_handled(world):
    from memstream.streams.commit_order import gate_for

    p, message, _letters, _slept, sleep = world
    seen: list[int] = []

    async def handle() -> None:
        seen.append(gate_for(p.app).busy)

    await guard.guarded(p, message, handle, sleep=sleep)
    await guard.guarded(p, message, handle, sleep=sleep, atomic=False)
    assert seen == [1, 0] and gate_for(p.app).busy == 0
