"""Callers waiting for a job's outcome in this process (an agent's tool write).

The API registers a waiter before it sends the tool request; the apply stage resolves it
once the job's changes are in the store and on the memory-change topic. A job applied by
another worker (or a request taken before) leaves the waiter to time out: the caller is
told the write is queued, which is true.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    status: str  # done | trivial | failed | fenced
    changes: list[dict[str, Any]] = field(default_factory=list)  # op, memory_id, version, content
    error: str | None = None


class Waiters:
    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[Outcome]] = {}

    def expect(self, job_id: str) -> asyncio.Future[Outcome]:
        future = self._futures.get(job_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._futures[job_id] = future
        return future

    def resolve(self, job_id: str, outcome: Outcome) -> None:
        future = self._futures.pop(job_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    async def wait(self, job_id: str, future: asyncio.Future[Outcome],
                   timeout: float) -> Outcome | None:
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout) if timeout else None
        except TimeoutError:
            return None
        finally:
            if self._futures.get(job_id) is future and not future.done():
                del self._futures[job_id]

    def __len__(self) -> int:
        return len(self._futures)
