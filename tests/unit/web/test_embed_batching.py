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


class Gated(Recording):
    """Each call waits until the test opens its gate (an embedding under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []

    async def run(self, fn: Any, texts: list[str]) -> Any:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return fn(texts)


async def test_a_lone_text_goes_at_once() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb, run=inline)
    assert len(await batcher.embed("alone")) == 16
    assert emb.calls == [["alone"]] and not batcher.busy


async def test_texts_that_come_while_one_is_embedded_go_together_once_each() -> None:
    emb = Gated()
    batcher = EmbedBatcher(emb, run=emb.run)
    first = asyncio.ensure_future(batcher.embed("where do I live"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(emb.gates) == 1  # under way, alone
    rest = [asyncio.ensure_future(batcher.embed(t))
            for t in ("my dog", "favourite food", "my dog")]
    await asyncio.sleep(0)
    assert len(emb.gates) == 1 and not any(r.done() for r in rest)  # they wait for it
    emb.gates[0].set()
    assert len(await first) == 16
    while len(emb.gates) < 2:
        await asyncio.sleep(0)
    emb.gates[1].set()
    got = await asyncio.gather(*rest)
    assert emb.calls == [["where do I live"], ["my dog", "favourite food"]]  # deduplicated
    assert got == [HashingEmbedder(dim=16).embed([t])[0]
                   for t in ("my dog", "favourite food", "my dog")]


async def test_a_batch_holds_at_most_max_batch_texts() -> None:
    emb = Gated()
    batcher = EmbedBatcher(emb, max_batch=2, run=emb.run)
    calls = [asyncio.ensure_future(batcher.embed(t)) for t in "abcde"]
    while not all(c.done() for c in calls):
        for gate in emb.gates:
            gate.set()
        await asyncio.sleep(0)
    assert emb.calls == [["a"], ["b", "c"], ["d", "e"]]


async def test_a_failure_reaches_every_caller_of_its_batch_and_not_the_next() -> None:
    emb = Recording(fail=True)
    batcher = EmbedBatcher(emb, run=inline)
    got = await asyncio.gather(batcher.embed("x"), batcher.embed("y"), return_exceptions=True)
    assert [type(g) for g in got] == [RuntimeError, RuntimeError]
    emb.fail = False
    assert len(await batcher.embed("z")) == 16


async def test_a_short_answer_is_an_error_not_a_wrong_vector() -> None:
    class Short(Recording):
        def embed(self, texts: list[str]) -> list[list[float]]:
            return super().embed(texts)[:-1]

    batcher = EmbedBatcher(Short(), run=inline)
    with pytest.raises(ValueError, match="0 vectors for 1 texts"):
        await asyncio.gather(batcher.embed("x"), batcher.embed("y"))


async def test_the_real_thread_runner() -> None:
    emb = Recording()
    batcher = EmbedBatcher(emb)
    got = await asyncio.gather(*(batcher.embed(f"t{i}") for i in range(5)))
    assert len(got) == 5
    assert sorted(t for call in emb.calls for t in call) == [f"t{i}" for i in range(5)]
    assert len(emb.calls) == 2  # the first alone, the four that came meanwhile together


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        EmbedBatcher(Recording(), max_batch=0)
