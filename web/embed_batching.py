"""Query embeddings of concurrent reads, embedded together.

A read's query text is its only per-request model work (:mod:`memory.retrieval`). One
text at a time, eight callers pay eight forward passes; the bundled embedder's pass over
eight texts costs about two of one. :class:`EmbedBatcher` embeds a text at once when no
embedding is under way (a lone caller never waits); texts that arrive while one is under
way wait for it and then go together (at most ``max_batch`` per call), in a worker
thread; identical texts are embedded once. A failure reaches every caller of the batch;
nothing is cached across batches.
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

    def __init__(self, embedder: Embedder, *, max_batch: int = 32,
                 run: Runner = asyncio.to_thread) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.embedder = embedder
        self.max_batch = max_batch
        self.run = run
        self.waiting: list[tuple[str, asyncio.Future[list[float]]]] = []
        self.busy = False  # an embedder call under way
        self.running: set[asyncio.Task[None]] = set()

    async def embed(self, text: str) -> list[float]:
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self.waiting.append((text, future))
        if not self.busy:
            self._flush()
        return await future

    def _flush(self) -> None:
        batch, self.waiting = self.waiting[:self.max_batch], self.waiting[self.max_batch:]
        if not batch:
            return
        self.busy = True
        task = asyncio.get_running_loop().create_task(self._embed(batch))
        self.running.add(task)  # (a task nobody holds may be collected mid-way)
        task.add_done_callback(self.running.discard)

    async def _embed(self, batch: list[tuple[str, asyncio.Future[list[float]]]]) -> None:
        try:
            await self._answer(batch)
        finally:
            self.busy = False
            self._flush()  # those that came meanwhile, together

    async def _answer(self, batch: list[tuple[str, asyncio.Future[list[float]]]]) -> None:
        texts = list(dict.fromkeys(text for text, _ in batch))
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
