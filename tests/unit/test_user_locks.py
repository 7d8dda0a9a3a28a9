"""Per-user locks: one job per user at a time, users in parallel, no lock left behind."""

from __future__ import annotations

import asyncio

import pytest

from memstream.streams.extract import UserLocks

pytestmark = pytest.mark.unit


async def test_same_user_serialised_other_users_parallel_and_locks_dropped():
    locks = UserLocks()
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def work(user: str) -> None:
        async with locks.hold(user):
            running[user] = running.get(user, 0) + 1
            peak[user] = max(peak.get(user, 0), running[user])
            peak["all"] = max(peak.get("all", 0), sum(running.values()))
            await asyncio.sleep(0.01)
            running[user] -= 1

    await asyncio.gather(*(work(u) for u in ["a", "a", "a", "b", "b", "c"]))
    assert peak["a"] == peak["b"] == peak["c"] == 1
    assert peak["all"] >= 2
    assert len(locks) == 0
