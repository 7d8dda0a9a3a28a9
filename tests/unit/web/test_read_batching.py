"""Concurrent reads go in batches: one embedder call per batch, each read's own work after
it in the same thread (memstream.web.read_batching)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from memstream.memory.embedding import HashingEmbedder
from memstream.web.read_batching import ReadBatcher

pytestmark = pytest.mark.unit


def vector(text: str) -> list[float]:
    return HashingEmbedder(dim=16).embed([text])[0]


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
    """Each batch waits until the test opens its gate (a batch under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []

    async def run(self, fn: Any, *args: Any) -> Any:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return fn(*args)


def tagged(tag: str) -> Any:
    """A read's work: its tag and the vector it was given."""
    return lambda v: (tag, v)


async def test_a_lone_read_goes_at_once_with_its_own_vector() -> None:
    emb = Recording()
    batcher = ReadBatcher(emb, run=inline)
    assert await batcher.read("alone", tagged("a")) == ("a", vector("alone"))
    assert emb.calls == [["alone"]] and batcher.busy == 0
    assert await batcher.embed("plain") == vector("plain")


async def test_reads_that_come_while_one_is_under_way_go_together_texts_once() -> None:
    emb = Gated()
    batcher = ReadBatcher(emb, run=emb.run)
    first = asyncio.ensure_future(batcher.read("where do I live", tagged("first")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(emb.gates) == 1  # under way, alone
    rest = [asyncio.ensure_future(batcher.read(t, tagged(f"r{i}")))
            for i, t in enumerate(("my dog", "favourite food", "my dog"))]
    await asyncio.sleep(0)
    assert len(emb.gates) == 1 and not any(r.done() for r in rest)  # they wait for it
    emb.gates[0].set()
    assert await first == ("first", vector("where do I live"))
    while len(emb.gates) < 2:
        await asyncio.sleep(0)
    emb.gates[1].set()
    got = await asyncio.gather(*rest)
    assert emb.calls == [["where do I live"], ["my dog", "favourite food"]]  # deduplicated
    assert got == [("r0", vector("my dog")), ("r1", vector("favourite food")),
                   ("r2", vector("my dog"))]


async def test_a_read_of_several_texts_gets_their_vectors_from_the_batchs_one_call() -> None:
    emb = Gated()
    batcher = ReadBatcher(emb, run=emb.run)
    first = asyncio.ensure_future(batcher.read("hold", tagged("first")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    both = asyncio.ensure_future(batcher.read_all(("What did Ana paint?", "What did paint?"),
                                                  lambda vs: vs))
    one = asyncio.ensure_future(batcher.read("What did paint?", tagged("one")))
    await asyncio.sleep(0)
    emb.gates[0].set()
    await first
    while len(emb.gates) < 2:
        await asyncio.sleep(0)
    emb.gates[1].set()
    assert await both == [vector("What did Ana paint?"), vector("What did paint?")]
    assert await one == ("one", vector("What did paint?"))
    assert emb.calls == [["hold"], ["What did Ana paint?", "What did paint?"]]


async def test_a_batch_holds_at_most_max_batch_reads() -> None:
    emb = Gated()
    batcher = ReadBatcher(emb, max_batch=2, run=emb.run)
    calls = [asyncio.ensure_future(batcher.embed(t)) for t in "abcde"]
    while not all(c.done() for c in calls):
        for gate in emb.gates:
            gate.set()
        await asyncio.sleep(0)
    assert emb.calls == [["a"], ["b", "c"], ["d", "e"]]


async def test_in_flight_batches_overlap_up_to_the_limit() -> None:
    emb = Gated()
    batcher = ReadBatcher(emb, in_flight=2, run=emb.run)
    calls = [asyncio.ensure_future(batcher.embed(t)) for t in "abc"]
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(emb.gates) == 2 and batcher.busy == 2  # a and b under way, c waits
    for gate in emb.gates:
        gate.set()
    while not all(c.done() for c in calls):
        for gate in emb.gates:
            gate.set()
        await asyncio.sleep(0)
    assert emb.calls == [["a"], ["b"], ["c"]]


async def test_an_embedder_failure_reaches_its_batch_and_not_the_next() -> None:
    emb = Recording(fail=True)
    batcher = ReadBatcher(emb, run=inline)
    got = await asyncio.gather(batcher.embed("x"), batcher.embed("y"), return_exceptions=True)
    assert [type(g) for g in got] == [RuntimeError, RuntimeError]
    emb.fail = False
    assert await batcher.embed("z") == vector("z")


async def test_a_reads_own_failure_reaches_only_that_read() -> None:
    emb = Gated()
    batcher = ReadBatcher(emb, run=emb.run)

    def broken(v: list[float]) -> Any:
        raise KeyError("no such shard")

    first = asyncio.ensure_future(batcher.embed("first"))
    await asyncio.sleep(0)
    together = [asyncio.ensure_future(batcher.read("a", broken)),
                asyncio.ensure_future(batcher.read("b", tagged("b")))]
    while not (first.done() and all(t.done() for t in together)):
        for gate in emb.gates:
            gate.set()
        await asyncio.sleep(0)
    assert emb.calls == [["first"], ["a", "b"]]  # one batch
    with pytest.raises(KeyError):
        together[0].result()
    assert together[1].result() == ("b", vector("b"))


async def test_a_short_answer_is_an_error_not_a_wrong_vector() -> None:
    class Short(Recording):
        def embed(self, texts: list[str]) -> list[list[float]]:
            return super().embed(texts)[:-1]

    batcher = ReadBatcher(Short(), run=inline)
    with pytest.raises(ValueError, match="0 vectors for 1 texts"):
        await asyncio.gather(batcher.embed("x"), batcher.embed("y"))


async def test_the_real_threads_run_the_work_off_the_event_loop() -> None:
    emb = Recording()
    batcher = ReadBatcher(emb)
    loop_thread = threading.current_thread().name
    got = await asyncio.gather(*(batcher.read(f"t{i}", lambda v: threading.current_thread().name)
                                 for i in range(5)))
    assert all(name.startswith("memstream-reads") and name != loop_thread for name in got)
    assert sorted(t for call in emb.calls for t in call) == [f"t{i}" for i in range(5)]
    assert len(emb.calls) == 2  # the first alone, the four that came meanwhile together
    batcher.close()
    assert await batcher.embed("after close") == vector("after close")  # threads again
    batcher.close()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ReadBatcher(Recording(), max_batch=0)
    with pytest.raises(ValueError):
        ReadBatcher(Recording(), in_flight=0)
