"""Calibrate an embedder's "about the same thing" threshold on labelled pairs.

``tests/data/similarity_pairs.jsonl`` holds paraphrases (same) and unrelated or
same-topic-different-value pairs (different), in English and Chinese. The threshold is the
one with the best accuracy; among equally good ones, the middle of that range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memstream.memory.embedding import Embedder, cosine


@dataclass(frozen=True)
class Calibration:
    threshold: float
    accuracy: float
    pairs: int


def load_pairs(path: Path) -> list[tuple[str, str, bool]]:
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    return [(r["a"], r["b"], bool(r["same"])) for r in rows]


def similarities(embedder: Embedder, pairs: list[tuple[str, str, bool]]) -> list[float]:
    va = embedder.embed([a for a, _, _ in pairs])
    vb = embedder.embed([b for _, b, _ in pairs])
    return [cosine(x, y) for x, y in zip(va, vb, strict=True)]


def accuracy(sims: list[float], labels: list[bool], threshold: float) -> float:
    return sum((s >= threshold) == same for s, same in zip(sims, labels, strict=True)) / len(sims)


def calibrate(embedder: Embedder, pairs: list[tuple[str, str, bool]]) -> Calibration:
    sims = similarities(embedder, pairs)
    labels = [same for _, _, same in pairs]
    grid = [t / 100 for t in range(5, 100)]
    scores = [accuracy(sims, labels, t) for t in grid]
    best = max(scores)
    good = [t for t, s in zip(grid, scores, strict=True) if s == best]
    return Calibration(round((good[0] + good[-1]) / 2, 2), best, len(pairs))
