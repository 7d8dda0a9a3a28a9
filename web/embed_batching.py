"""Query embeddings of concurrent reads, embedded together.

A read's query text is its only per-request model work (:mod:`memory.retrieval`). One
text at a time, eight callers pay eight forward passes; the bundled embedder's pass over
eight texts costs about two of one. :class:`EmbedBatcher` holds the first text of a batch
at most ``wait_s`` (a millisecond or two) for others to join, or until ``max_batch`` have,
then embeds them in one call in a worker thread; identical texts are embedded once. A
failure reaches every caller of the batch; nothing is cached across batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from memstream.memory.embedding import Embedder

Runner = Callable[..., Awaitable[Any]]


class EmbedBatcher:
    """See the module docstring. ``run``: how the embedder is called off the event loop
    (``asyncio.to_thread``; the tests' inline runner)."""

    def __init__(self, embedder: Embedder, *, wait_s: float = 0.0015, max_batch: int = 32,
                 run: Runner = asyncio.to_thread) -> None:
        if max_batch < 1 or wait_s < 0:
            raise ValueError("max_batch must be >= 1 and wait_s >= 0")
        self.embedder = embedder
        self.wait_s = wait_s
        self.max_batch = max_batch
        self.run = run
        self.waiting: list[tuple[str, asyncio.Future[list[float]]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.batches = 0  # embedder calls made (for the benchmark and the tests)
        self.running: set[asyncio.Task[None]] = set()

    async def embed(self, text: str) -> list[float]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[float]] = loop.create_future()
        self.waiting.append((text, future))
        if len(self.waiting) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.waiting = self.waiting, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._embed(batch))
            self.running.add(task)  # (a task nobody holds may be collected mid-way)
            task.add_done_callback(self.running.discard)

    async def _embed(self, batch: list[tuple[str, asyncio.Future[list[float]]]]) -> None:
        texts = list(dict.fromkeys(text for text, _ in batch))
        self.batches += 1
        try:
            vectors = await self.run(self.embedder.embed, texts)
            if len(vectors) != len(texts):
                raise ValueError(f"the embedder gave {len(vectors)} vectors for "
                                 f"{len(texts)} texts")
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        by_text = dict(zip(texts, vectors, strict=True))
        for text, future in batch:
            if not future.done():  # (a caller that gave up)
                future.set_result(by_text[text])
