"""The worker's parts as ``mode.Service``\\ s the Faust app starts and stops.

Faust runs the worker's lifecycle through its public API only: each part (a stage loop, the
store shards and standbys, the user-keys follower, the rebuild swapper, the HTTP API) is a
:class:`Part` added with ``app.add_dependency`` when the app is built. The app starts its
dependencies in the order they were added and stops them in the reverse order, after its
own ``on_stop``: so the API (added last) stops serving first, then the loops finish their
batches, and the store shards (added first) close last, with nothing of theirs open.

Every stage runs in its own transactional loop with its own consumer and producers
(:mod:`streams.owned_loop`); Faust starts no Kafka client of its own (no consumer, group,
leader assignor or its topic, no producer: :func:`streams.faust_setup.make_app`). Faust's
"Ready" line therefore comes as soon as the parts' ``start`` returned, before the loops
joined their groups and took their partitions: readiness is the loops' (``web/probes.py``),
not that line's (docs/faust.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mode

log = logging.getLogger(__name__)


class Part(mode.Service):
    """One part of the worker: ``start`` awaited when the app starts (``background``: run
    as a task of the part, cancelled when it stops), ``stop`` awaited when it stops."""

    def __init__(self, name: str, start: Callable[[], Awaitable[Any]] | None = None,
                 stop: Callable[[], Awaitable[Any]] | None = None, *,
                 background: bool = False) -> None:
        super().__init__()
        self.part = name
        self._start = start
        self._stop = stop
        self._background = background

    @property
    def shortlabel(self) -> str:
        return self.part

    @property
    def label(self) -> str:
        return f"Part: {self.part}"

    async def on_start(self) -> None:
        if self._start is None:
            return
        if self._background:
            self.add_future(self._start())
        else:
            await self._start()

    async def on_stop(self) -> None:
        if self._stop is not None:
            await self._stop()


def run(app: Any, name: str, start: Callable[[], Awaitable[Any]] | None = None,
        stop: Callable[[], Awaitable[Any]] | None = None, *, background: bool = False) -> Part:
    """Start ``start`` with ``app`` and ``stop`` when it stops (see the module docstring)."""
    part = Part(name, start, stop, background=background)
    app.add_dependency(part)
    return part


async def every(seconds: float, step: Callable[[], Awaitable[Any]]) -> None:
    """``step`` every ``seconds`` until cancelled (a part's background timer); a step that
    fails is logged and the timer goes on."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("timer step failed (%s)", type(exc).__name__)
