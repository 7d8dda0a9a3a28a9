"""Concurrent reads, done in batches off the event loop.

A read's per-request work is its query's embedding, then its store reads and ranking
(:mod:`memory.retrieval`). One read at a time, eight callers pay eight forward passes of
the embedder and sixteen thread hand-offs; the bundled embedder's pass over eight texts
costs about two of one, and with the embedded store every read holds the GIL anyway, so
more threads only fight over it.

:class:`ReadBatcher` runs a read at once when no batch is under way (a lone caller never
waits); reads that arrive while one is under way wait for it and then go together (at most
``max_batch``): one call hands the batch to a worker thread, which embeds its texts in one
embedder call (identical texts once) and then runs each read's own work in turn. With
the embedded store one batch is under way at a time, in one thread; a store across the
network (a Qdrant server) lets ``in_flight`` batches overlap their round trips. An
embedder failure reaches every read of its batch; a read's own failure only that read.
Nothing is kept across batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from memstream.memory.embedding import Embedder

T = TypeVar("T")
Runner = Callable[..., Awaitable[Any]]


@dataclass
class _Read(Generic[T]):
    texts: tuple[str, ...]
    work: Callable[[list[list[float]]], T]
    future: asyncio.Future[T]


def run_reads(embedder: Embedder,
              reads: list[tuple[tuple[str, ...], Callable[[list[list[float]]], Any]]],
              ) -> list[tuple[bool, Any]]:
    """A batch, in the calling thread: the texts embedded once (every read's, in one
    embedder call), then each read's work with its texts' vectors; (True, result) or
    (False, its exception) per read, in order."""
    texts = list(dict.fromkeys(text for some, _ in reads for text in some))
    try:
        vectors = embedder.embed(texts)
        if len(vectors) != len(texts):
            raise ValueError(f"the embedder gave {len(vectors)} vectors for {len(texts)} texts")
    except Exception as exc:
        return [(False, exc)] * len(reads)
    by_text = dict(zip(texts, vectors, strict=True))
    out: list[tuple[bool, Any]] = []
    for some, work in reads:
        try:
            out.append((True, work([by_text[text] for text in some])))
        except Exception as exc:
            out.append((False, exc))
    return out


class ReadBatcher:
    """See the module docstring. ``run``: how a batch is run off the event loop (default:
    this batcher's own threads, ``in_flight`` of them; the tests' inline runner)."""

    def __init__(self, embedder: Embedder, *, max_batch: int = 32, in_flight: int = 1,
                 run: Runner | None = None) -> None:
        if max_batch < 1 or in_flight < 1:
            raise ValueError("max_batch and in_flight must be >= 1")
        self.embedder = embedder
        self.max_batch = max_batch
        self.in_flight = in_flight
        self._pool: ThreadPoolExecutor | None = None
        self.run = run or self._in_pool
        self.waiting: list[_Read[Any]] = []
        self.busy = 0  # batches under way
        self.running: set[asyncio.Task[None]] = set()

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="memstream-reads")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def read(self, text: str, work: Callable[[list[float]], T]) -> T:
        """``work(vector of text)``, run in a batch; its result or its exception."""
        return await self.read_all((text,), lambda vectors: work(vectors[0]))

    async def read_all(self, texts: tuple[str, ...], work: Callable[[list[list[float]]], T],
                       ) -> T:
        """``work(vectors of texts)``, run in a batch (the texts embedded with the batch's
        others, in one call); its result or its exception."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.waiting.append(_Read(texts, work, future))
        if self.busy < self.in_flight:
            self._flush()
        return await future

    async def embed(self, text: str) -> list[float]:
        """The text's vector alone (a read with no store work)."""
        return await self.read(text, lambda vector: vector)

    def close(self) -> None:
        """Stop the threads once their batches are done (a later read starts them again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def _flush(self) -> None:
        batch, self.waiting = self.waiting[:self.max_batch], self.waiting[self.max_batch:]
        if not batch:
            return
        self.busy += 1
        task = asyncio.get_running_loop().create_task(self._batch(batch))
        self.running.add(task)  # (a task nobody holds may be collected mid-way)
        task.add_done_callback(self.running.discard)

    async def _batch(self, batch: list[_Read[Any]]) -> None:
        try:
            outcomes = await self.run(run_reads, self.embedder,
                                      [(r.texts, r.work) for r in batch])
        except asyncio.CancelledError:
            for r in batch:
                r.future.cancel()
            raise
        except BaseException as exc:  # the runner itself failed: no read may hang on it
            outcomes = [(False, exc)] * len(batch)
        finally:
            self.busy -= 1
            self._flush()  # those that came meanwhile, together
        for r, (ok, value) in zip(batch, outcomes, strict=True):
            if r.future.done():  # (a caller that gave up)
                continue
            if ok:
                r.future.set_result(value)
            else:
                r.future.set_exception(value)
