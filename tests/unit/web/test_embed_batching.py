"""Query embeddings of concurrent reads share one embedder call (memstream.web.embed_batching)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memstream.memory.embedding import HashingEmbedder
from memstream.web.embed_batching import EmbedBatcher

pytestmark = pytest.mark.unit


class Recording:
    """The hashing embedder, recording each call's texts."""

    def __init__(self, fail: bool = False) -> None:
        self.inner = HashingEmbedder(dim=16)
        self.calls: list[list[str]] = []
        self.fail = fail

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if self.fail:
            raise RuntimeError("embedder down")
        return self.inner.embed(texts)


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


async def test_concurrent_texts_share_one_call_and_each_gets_its_own_vector() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb, wait_s=0.05, run=inline)
    texts = ["where do I live", "my dog", "favourite food", "my dog"]
    got = await asyncio.gather(*(batcher.embed(t) for t in texts))
    assert emb.calls == [["where do I live", "my dog", "favourite food"]]  # deduplicated
    assert got == [HashingEmbedder(dim=16).embed([t])[0] for t in texts]
    assert batcher.batches == 1


async def test_a_full_batch_goes_without_waiting_and_the_rest_waits_for_the_next() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb, wait_s=3600, max_batch=2, run=inline)
    first = [asyncio.ensure_future(batcher.embed(t)) for t in ("a", "b")]
    done, _ = await asyncio.wait(first, timeout=5)  # never the hour-long wait
    assert len(done) == 2 and emb.calls == [["a", "b"]]
    third = asyncio.ensure_future(batcher.embed("c"))
    await asyncio.sleep(0)
    assert not third.done()  # waits for company (or its timer)
    fourth = asyncio.ensure_future(batcher.embed("d"))
    assert len(await asyncio.gather(third, fourth)) == 2
    assert emb.calls == [["a", "b"], ["c", "d"]]


async def test_a_lone_text_goes_after_the_wait() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb, wait_s=0.001, run=inline)
    assert len(await batcher.embed("alone")) == 16
    assert emb.calls == [["alone"]]


async def test_a_failure_reaches_every_caller_of_its_batch_and_not_the_next() -> None:
    emb = Recording(fail=True)
    batcher = EmbedBatcher(emb, wait_s=0.01, run=inline)
    got = await asyncio.gather(batcher.embed("x"), batcher.embed("y"), return_exceptions=True)
    assert [type(g) for g in got] == [RuntimeError, RuntimeError]
    emb.fail = False
    assert len(await batcher.embed("z")) == 16


async def test_a_short_answer_is_an_error_not_a_wrong_vector() -> None:
    class Short(Recording):
        def embed(self, texts: list[str]) -> list[list[float]]:
            return super().embed(texts)[:-1]

    batcher = EmbedBatcher(Short(), wait_s=0.01, run=inline)
    with pytest.raises(ValueError, match="1 vectors for 2 texts"):
        await asyncio.gather(batcher.embed("x"), batcher.embed("y"))


async def test_the_real_thread_runner() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb, wait_s=0.01)
    got = await asyncio.gather(*(batcher.embed(f"t{i}") for i in range(5)))
    assert len(got) == 5 and len(emb.calls) == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        EmbedBatcher(Recording(), max_batch=0)
