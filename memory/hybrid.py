"""Hybrid retrieval (pure over the store protocol): the ranked memories and the user's
archived turns (:mod:`memory.archive`) fused into one list.

The turns are searched twice, by meaning (the vector of the query without its proper
names: :func:`meaning_query`) and by words (BM25 over the user's archive:
:mod:`memory.lexical`); the memories keep their own ranking (recency,
importance, relevance: :mod:`memory.scoring`). Weighted reciprocal-rank fusion joins the
rankings, each item scoring ``weight / (k + rank)`` in every list it is in, plus a
ranking of the candidate turns by event time (recency, a small weight). A memory less
related to the query than the embedder's related threshold is left out (the memories'
ranking always has a first), and so is a turn that a returned memory states in full (its
lineage lies within the turn's messages).
``sources`` and ``match`` choose parts of it (the benchmark's ablation rows).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from memstream.memory import lexical
from memstream.memory.archive import Turn, cutoff, stated_by, weighted_rrf
from memstream.memory.scoring import Scored, Weights
from memstream.memory.store import MemoryStore, Scope, TurnWindow

Sources = Literal["fused", "memories", "turns"]
MAX_DELETED = 1_000  # deleted memories read for the turns they hide
Match = Literal["hybrid", "dense", "sparse"]


@dataclass(frozen=True)
class Fusion:
    """How memories and turns are fused (from settings; a request may narrow it)."""

    weights: tuple[float, float, float, float] = (0.5, 1.0, 1.0, 0.1)  # memories, dense,
    k: float = 5.0                                                    # sparse, recency
    turns_k: int = 40  # candidates of each turn search
    sources: Sources = "fused"
    match: Match = "hybrid"
    recency: bool = True
    archive_days: float | None = None
    # a memory less related to the query than this (cosine) is left out of the fusion: the
    # memories' ranking always has a first, however unrelated, and a turn that matches
    # must not lose its place to it (the embedder's related_threshold; 0: none left out)
    memory_floor: float = 0.0

    def memory_weights(self, weights: Weights) -> Weights:
        return weights if self.recency else replace(weights, recency=0.0)


@dataclass(frozen=True)
class Item:
    """One fused result: a memory or an archived turn."""

    kind: Literal["memory", "turn"]
    score: float
    memory: Scored | None = None
    turn: Turn | None = None

    @property
    def key(self) -> str:
        if self.memory is not None:
            return "m:" + self.memory.memory.memory_id
        assert self.turn is not None
        return "t:" + self.turn.memory_id


_WORD = re.compile(r"[^\W\d_]+(?:['’]s\b)?")
_OPENS = re.compile(r"(?:^|[.?!:;\n])[\s\"'“‘(\[{«¿¡-]*$")  # what a sentence's first word follows


def _is_name(word: str, before: str) -> bool:
    """A capitalised word (then lower case: not an acronym, not "I") that does not open a
    sentence."""
    return (len(word) > 1 and word[0].isupper() and word[1].islower()
            and _OPENS.search(before) is None)


def meaning_query(text: str) -> str:
    """The query the turns are searched by meaning with: the text without proper names.
    An embedder's vector of "What did Caroline paint?" is drawn to every turn that names
    Caroline (greetings above all), not to the painting; the words' search keeps the
    names, where BM25 weighs them by how rare they are in the user's archive. (LOCOMO:
    turns-only recall@10 0.827 -> 0.849, docs/benchmarks.md.) Unchanged when nothing would
    be left, and for scripts without capitals."""
    text = text.strip()
    bare = _WORD.sub(lambda m: " " if _is_name(m.group(), text[:m.start()]) else m.group(),
                     text)
    bare = " ".join(bare.split())
    return bare if any(ch.isalnum() for ch in bare) else text


def deleted_sources(store: MemoryStore, scope: Scope) -> frozenset[str]:
    """The messages the user's deleted memories came from (deleted by the user or an
    operator, lineage kind ``deletion``): their turns are never returned, as the memories
    are not (SPEC §5: deleted memories are not searchable)."""
    own = Scope(scope.tenant_id, scope.user_id)
    return frozenset(i for m in store.list(own, statuses=["deleted"], limit=MAX_DELETED)
                     if m.extra.get("closed_kind") == "deletion" for i in m.source.message_ids)


def turn_candidates(store: MemoryStore, scope: Scope, vector: list[float], text: str,
                    f: Fusion, now: float, window: TurnWindow | None = None,
                    ) -> tuple[list[Turn], list[Turn]]:
    """The user's turns near the query (by meaning) and matching its words (by BM25), within
    ``window`` and the archive's age bound; none whose message a deleted memory came from
    (:func:`deleted_sources`)."""
    oldest = cutoff(now, f.archive_days)
    window = window or TurnWindow()
    if oldest is not None and (window.since is None or window.since < oldest):
        window = replace(window, since=oldest)
    own = Scope(scope.tenant_id, scope.user_id)
    dense = sparse = []
    if f.match in ("hybrid", "dense"):
        dense = [Turn.from_payload(p, s)
                 for p, s in store.search_turns(own, f.turns_k, vector=vector, window=window)]
    words = lexical.query(text)
    if f.match in ("hybrid", "sparse") and words:
        sparse = [Turn.from_payload(p, s)
                  for p, s in store.search_turns(own, f.turns_k, sparse=words, window=window)]
    if dense or sparse:
        hidden = deleted_sources(store, own)
        if hidden:
            dense = [t for t in dense if t.message_id not in hidden]
            sparse = [t for t in sparse if t.message_id not in hidden]
    return dense, sparse


def fuse(memories: Sequence[Scored], dense: Sequence[Turn], sparse: Sequence[Turn],
         f: Fusion, k: int) -> list[Item]:
    """The top ``k`` of the fused rankings (see the module doc), best first."""
    w_memory, w_dense, w_sparse, w_recent = f.weights
    if f.match != "hybrid":  # one way of matching: its list weighs what both would
        w_dense = w_sparse = max(w_dense, w_sparse)
    memories = [m for m in memories if m.relevance >= f.memory_floor]
    if f.sources == "turns":
        memories = []
    if f.sources == "memories":
        dense = sparse = []
    turns = {t.memory_id: t for t in (*sparse, *dense)}
    lineages = [m.memory.source.message_ids for m in memories]
    turns = {i: t for i, t in turns.items() if not stated_by(t, lineages)}
    recent = sorted(turns.values(), key=lambda t: (-t.ts, t.memory_id)) if f.recency else []
    lists = [(w_memory, ["m:" + m.memory.memory_id for m in memories]),
             (w_dense, ["t:" + t.memory_id for t in dense if t.memory_id in turns]),
             (w_sparse, ["t:" + t.memory_id for t in sparse if t.memory_id in turns]),
             (w_recent, ["t:" + t.memory_id for t in recent])]
    if f.sources == "memories" or not turns:  # the memories' own order, unchanged
        lists = lists[:1]
    fused = weighted_rrf(lists, f.k)
    by_key = {"m:" + m.memory.memory_id: m for m in memories}
    order = sorted(fused, key=lambda key: (-fused[key], key))[:k]
    return [Item("memory", fused[key], memory=by_key[key]) if key in by_key
            else Item("turn", fused[key], turn=turns[key[2:]]) for key in order]
