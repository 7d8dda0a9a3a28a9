"""The composition root of the memory core: backends chosen by settings, built once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memstream.core.errors import ConfigError
from memstream.core.settings import Settings
from memstream.memory.embedding import Embedder, HashingEmbedder, OpenAIEmbedder, UseEmbedder
from memstream.memory.extraction import Extractor, MemoryModel, RulesModel, WindowedJobs
from memstream.memory.hybrid import Floors, Fusion
from memstream.memory.scoring import Weights
from memstream.memory.store import MemoryStore

if TYPE_CHECKING:
    from memstream.memory.llm.recorded import Recorder


@dataclass(frozen=True)
class Services:
    model: MemoryModel
    embedder: Embedder
    store: MemoryStore
    extractor: Extractor

    def close(self) -> None:
        self.store.close()


def _openai_client(settings: Settings) -> object:
    from openai import OpenAI

    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused"
    return OpenAI(base_url=settings.llm_base_url, api_key=key, max_retries=0,
                  timeout=settings.llm_timeout_s)


def build_embedder(settings: Settings) -> Embedder:
    if settings.embedder == "hashing":
        return HashingEmbedder()
    if settings.embedder == "openai":
        return OpenAIEmbedder(settings.embedding_model, settings.embedding_dim,
                              client=_openai_client(settings))
    return UseEmbedder(threads=settings.embedder_threads)


def build_store(settings: Settings, dim: int, *, offline: bool = False) -> MemoryStore:
    """The store the settings choose. ``offline``: a command that opens the embedded store
    of a stopped worker (``memstream search``, ``forget verify``): with the partitioned
    layout, every partition's shard under ``data_dir/store`` (its global copy too) instead
    of an empty set the worker fills as partitions come."""
    if settings.store == "server":
        from memstream.memory.store.server import ServerStore

        if not settings.qdrant_url:
            raise ConfigError("store=server needs MEMSTREAM_QDRANT_URL")
        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return ServerStore.connect(settings.qdrant_url, key, settings.qdrant_collection, dim)
    from memstream.memory.store.edge import EdgeStore
    from memstream.memory.store.swappable import SwappableStore

    if settings.store_partitioned:  # shards opened as partitions come (streams.shards)
        from memstream.memory.store.partitioned import SHARDS_DIR, PartitionedStore, partition_of

        n = settings.partitions
        store = PartitionedStore(lambda tenant, user: partition_of(tenant, user, n))
        if offline:
            root = settings.data_dir / SHARDS_DIR
            store.owned = {p: EdgeStore(root / str(p), dim) for p in range(n)}
            if (root / "global").is_dir():
                store.global_shard = EdgeStore(root / "global", dim)
        return store
    from memstream.memory.store.switch import current_store_path

    # the worker's store can be switched to a rebuilt one (memstream.memory.store.switch)
    return SwappableStore(EdgeStore(current_store_path(settings), dim))


def build_model(settings: Settings, recorder: Recorder | None = None) -> MemoryModel:
    """``recorder``: recorded answers around every LLM call (``memstream replay``); an
    offline one needs no endpoint (it never calls)."""
    if settings.llm == "openai":
        from memstream.memory.llm.openai_model import OpenAIModel

        offline = recorder is not None and recorder.offline
        if not settings.llm_base_url and settings.llm_api_key is None and not offline:
            raise ConfigError("MEMSTREAM_LLM=openai needs MEMSTREAM_LLM_API_KEY or "
                              "MEMSTREAM_LLM_BASE_URL")
        return OpenAIModel(settings, client=_openai_client(settings), recorder=recorder)
    return RulesModel()


def weights(settings: Settings) -> Weights:
    """The retrieval score's weights and normalisation (SPEC §5)."""
    return Weights(recency=settings.weight_recency, importance=settings.weight_importance,
                   relevance=settings.weight_relevance, decay=settings.recency_decay,
                   normalise=settings.retrieval_normalise)


def fusion(settings: Settings, embedder: Embedder) -> Fusion | None:
    """How retrieval fuses the memories with the archived turns (None: the archive is
    off): the embedder's related threshold is the memories' floor (where relevance is the
    cosine itself) and a turn's by meaning (memory.hybrid)."""
    if not settings.archive:
        return None
    related = embedder.related_threshold
    return Fusion(weights=settings.fusion_weights, k=settings.fusion_k,
                  turns_k=settings.archive_k, archive_days=settings.archive_days,
                  memory_floor=related if settings.retrieval_normalise == "absolute" else 0.0,
                  floors=Floors(dense=related, dense_share=settings.archive_turn_share))


def build_services(settings: Settings, windowed: WindowedJobs | None = None) -> Services:
    """The backends the settings choose; ``windowed``: the windowed jobs' work (the worker
    passes :class:`memstream.jobs.work.WindowedWork`)."""
    embedder = build_embedder(settings)
    if settings.similarity_threshold is not None:
        embedder.same_threshold = settings.similarity_threshold
    store = build_store(settings, embedder.dim)
    recorder = None
    if settings.llm == "openai" and settings.llm_record is not None:
        from memstream.memory.llm.recorded import Recorder

        recorder = Recorder(settings.llm_record, settings.llm_record_mode)
    model = build_model(settings, recorder)
    return Services(model, embedder, store,
                    Extractor(model, embedder, store, top_k=settings.top_k_similar,
                              windowed=windowed))
