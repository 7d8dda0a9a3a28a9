"""The episodic archive's sparse lexical vectors: BM25 term weights computed here, the IDF
applied by the store (Qdrant's ``Modifier.IDF`` on the sparse vector), pure.

- **Tokens.** Text is NFKC-normalised and lower-cased. Runs of letters and digits are words;
  English stop words are dropped and the rest stemmed (Snowball, PyStemmer). Runs of CJK
  ideographs, kana and hangul have no spaces between words, so each becomes its characters
  and their overlapping pairs ("记住咖啡" -> 记 住 咖 啡 记住 住咖 咖啡): the CJK bigram
  indexing of Lucene's ``CJKBigramFilter``, which needs no dictionary and matches a word
  of one or two characters wherever it stands.
- **Document weights.** A term's BM25 saturation ``tf (k1 + 1) / (tf + k1 (1 - b + b
  len / avg_len))`` with a fixed ``avg_len`` (the archive grows one turn at a time: no
  corpus statistic is known when a turn is written, and none may change what a rebuild
  writes). The store multiplies by the term's IDF over the searched corpus at query time.
- **Query weights.** Each distinct query term once (weight 1): its IDF makes the score.
- **Term ids.** CRC-32 of the term's UTF-8 bytes: stable across processes and versions (a
  rebuild writes the same indices), no vocabulary to keep.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

K1 = 1.2
B = 0.75
AVG_LEN = 24.0  # terms of an archived turn with its context (LOCOMO: 22-26)
MAX_TERMS = 512  # a longer text keeps its most frequent terms (the store bounds a record)

_CJK = ("\u3040-\u30ff"  # hiragana, katakana
        "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
        "\uac00-\ud7af")  # hangul syllables
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_IS_CJK = re.compile(rf"[{_CJK}]")

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself no nor not now of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself
yourselves s t don d ll m re ve y
""".split())


@dataclass(frozen=True)
class Sparse:
    """A sparse vector: term ids ascending, one weight each."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __bool__(self) -> bool:
        return bool(self.indices)


@lru_cache(maxsize=1)
def _stemmer() -> object:
    import Stemmer  # PyStemmer: the Snowball algorithms in C

    return Stemmer.Stemmer("english", 0)  # cache off: lru below keeps the hot words


@lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    return str(_stemmer().stemWord(word))  # type: ignore[attr-defined]


def terms(text: str) -> list[str]:
    """The text's index terms, in order (a term once per occurrence)."""
    out: list[str] = []
    for run in _TOKEN.findall(unicodedata.normalize("NFKC", text).lower()):
        if _IS_CJK.match(run):
            out.extend(run)
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
        elif run not in STOP_WORDS:
            out.append(_stem(run) if run.isascii() and run.isalpha() else run)
    return out


def is_cjk(term: str) -> bool:
    """Whether a term is of CJK script (a character, or a pair of them)."""
    return _IS_CJK.match(term) is not None


def term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))


def _vector(weights: dict[int, float]) -> Sparse:
    order = sorted(weights)
    return Sparse(tuple(order), tuple(weights[i] for i in order))


def document(text: str, *, k1: float = K1, b: float = B, avg_len: float = AVG_LEN) -> Sparse:
    """A stored text's BM25 term weights (without IDF: the store applies it)."""
    found = terms(text)
    counts: dict[str, int] = {}
    for t in found:
        counts[t] = counts.get(t, 0) + 1
    if len(counts) > MAX_TERMS:
        counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_TERMS])
    norm = k1 * (1 - b + b * len(found) / avg_len)
    weights: dict[int, float] = {}
    for t, tf in counts.items():  # two terms of one id (a CRC collision) add up
        i = term_id(t)
        weights[i] = weights.get(i, 0.0) + tf * (k1 + 1) / (tf + norm)
    return _vector(weights)


def query(text: str, also: Iterable[str] = (), weight: float = 1.0) -> Sparse:
    """A query's terms, each once with weight 1; ``also``: more terms with ``weight``
    (the cues of the query's subjects: memory.subjects), where the text has not named
    them."""
    weights = {term_id(t): weight for t in also}
    weights.update({term_id(t): 1.0 for t in terms(text)})
    return _vector(weights)
