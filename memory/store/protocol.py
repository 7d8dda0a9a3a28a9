"""The memory store: one small protocol, two Qdrant implementations.

- :class:`memory.store.edge.EdgeStore` — Qdrant Edge in-process (``qdrant-edge-py``),
  persistent on disk: the embedded default. One process owns a path.
- :class:`memory.store.server.ServerStore` — a Qdrant server through ``qdrant-client``
  (URL + API key) for multi-worker deployments; ``QdrantClient(":memory:")`` in tests.

Every read is scoped to one tenant and one user (plus, where asked, the global scope of
semantic knowledge); there is no unscoped query in the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memstream.core.errors import MemstreamError
from memstream.memory import lexical
from memstream.memory.access_stats import AccessStats
from memstream.memory.archive import TURN_STATUS, indexed_text
from memstream.memory.fencing import Cursor, Published
from memstream.memory.lexical import Sparse
from memstream.memory.model import GLOBAL_USER, Memory, version_point_id

LINEAGE = "source.message_ids"  # the messages a version came from (a turn's statement: truth)
INDEXED_KEYWORDS = ("tenant_id", "user_id", "status", "memory_id", "slot", "type", "source.op_id",
                    "extra.closed_by", "extra.restated_by", "session_id", LINEAGE)
INDEXED_FLOATS = ("ts",)  # an archived turn's event time (time ranges, the archive's sweep)
SPARSE = "text"  # the sparse vector's name: an archived turn's words (memory.lexical)


CURSOR_STATUS = "cursor"  # the per-user fencing record; never matches a memory query
ACCESS_STATUS = "access"  # a memory's hit statistics (memory.access_stats); never a memory either
PUBLISHED_STATUS = "published"  # the cursor job's change events as published (fencing)
# records no op leaves (an op's id is looked for among the others: memories, turns)
NOT_OPS = (CURSOR_STATUS, ACCESS_STATUS, PUBLISHED_STATUS)
# never a memory: no memory query (list of all statuses, count) sees these records
HIDDEN_STATUSES = (*NOT_OPS, TURN_STATUS)
BOOKKEEPING_STATUSES = (CURSOR_STATUS, PUBLISHED_STATUS)  # fencing's, not memories' records


def cursor_point_id(tenant_id: str, user_id: str) -> str:
    return version_point_id(f"cursor\x1f{tenant_id}\x1f{user_id}", 0)


def published_point_id(tenant_id: str, user_id: str) -> str:
    return version_point_id(f"published\x1f{tenant_id}\x1f{user_id}", 0)


def access_point_id(tenant_id: str, user_id: str, memory_id: str) -> str:
    return version_point_id(f"access\x1f{tenant_id}\x1f{user_id}\x1f{memory_id}", 0)


def access_payload(scope: Scope, stats: AccessStats) -> dict[str, object]:
    return {"tenant_id": scope.tenant_id, "user_id": scope.user_id, "status": ACCESS_STATUS,
            "access": stats.to_payload()}


def access_from(scope: Scope, payloads: Iterable[dict[str, Any] | None]) -> dict[str, AccessStats]:
    """memory id -> its statistics, among retrieved payloads (checked: same tenant and user)."""
    found: dict[str, AccessStats] = {}
    for payload in payloads:
        if (payload and payload.get("status") == ACCESS_STATUS
                and payload.get("tenant_id") == scope.tenant_id
                and payload.get("user_id") == scope.user_id):
            stats = AccessStats.from_payload(payload["access"])
            found[stats.memory_id] = stats
    return found


def cursor_payload(scope: Scope, cursor: Cursor) -> dict[str, object]:
    return {"tenant_id": scope.tenant_id, "user_id": scope.user_id, "status": CURSOR_STATUS,
            "cursor": cursor.to_payload()}


def published_payload(scope: Scope, published: Published) -> dict[str, object]:
    return {"tenant_id": scope.tenant_id, "user_id": scope.user_id, "status": PUBLISHED_STATUS,
            "published": published.to_payload()}


def published_from(scope: Scope, payloads: Iterable[dict[str, Any] | None]) -> Published | None:
    """The scope's kept change events among retrieved payloads (checked: same tenant)."""
    for payload in payloads:
        if payload and payload.get("tenant_id") == scope.tenant_id and "published" in payload:
            return Published.from_payload(payload["published"])
    return None


# the payload fields in which an op leaves its id: the version it opened, the one it closed,
# the one it restated
APPLIED_BY = ("source.op_id", "extra.closed_by", "extra.restated_by")


def applied_among(op_ids: Iterable[str], payloads: Iterable[dict[str, Any] | None]) -> set[str]:
    """Those of ``op_ids`` that left their id in one of ``payloads`` (:data:`APPLIED_BY`)."""
    wanted, found = set(op_ids), set()
    for payload in payloads:
        payload = payload or {}
        source, extra = payload.get("source") or {}, payload.get("extra") or {}
        found |= wanted & {source.get("op_id"), extra.get("closed_by"), extra.get("restated_by")}
    return found


def live_from(payloads: Iterable[dict[str, Any] | None]) -> dict[str, int]:
    """memory id -> highest active version, from the payloads of active records."""
    live: dict[str, int] = {}
    for payload in payloads:
        m = Memory.from_payload(payload or {})
        live[m.memory_id] = max(live.get(m.memory_id, 0), m.version)
    return live


def cursor_from(scope: Scope, payloads: Iterable[dict[str, Any] | None]) -> Cursor | None:
    """The scope's cursor among retrieved payloads (checked: same tenant, a cursor)."""
    for payload in payloads:
        if payload and payload.get("tenant_id") == scope.tenant_id and "cursor" in payload:
            return Cursor.from_payload(payload["cursor"])
    return None


def record_vectors(payload: dict[str, Any], vector: list[float], lexical_index: bool,
                   sparse_vector: Callable[..., Any]) -> Any:
    """What a store writes as a record's vectors: the dense one, and for an archived turn
    its words too (:data:`SPARSE`, ``sparse_vector(indices=, values=)`` being the backend's
    type), computed from its payload, so every path that writes a turn (a rebuild's and a
    copy's included) indexes them. A store without the word index: the dense one only."""
    if payload.get("status") != TURN_STATUS or not lexical_index:
        return vector
    words = lexical.document(indexed_text(payload))
    if not words:
        return vector
    return {"": vector, SPARSE: sparse_vector(indices=list(words.indices),
                                              values=list(words.values))}


def held_records(store: MemoryStore, scope: Scope) -> int:
    """The records a store holds of exactly ``scope``'s user besides its bookkeeping
    (memory versions, archived turns, hit statistics): what a forget-me must leave none of."""
    return sum(1 for _, payload, _ in store.scan(scope.tenant_id, scope.user_id)
               if payload.get("status") not in BOOKKEEPING_STATUSES
               and payload.get("user_id") == scope.user_id)


def unit_vector(dim: int) -> list[float]:
    """A placeholder vector for records that are never searched (the cursor)."""
    return [1.0] + [0.0] * (dim - 1)


Record = tuple[str, dict[str, Any], list[float] | None]


class StoreError(MemstreamError):
    """The vector store failed or refused an operation."""


@dataclass(frozen=True)
class Scope:
    """Whose memories a call may touch."""

    tenant_id: str
    user_id: str
    include_global: bool = False

    def users(self) -> list[str]:
        return [self.user_id, GLOBAL_USER] if self.include_global else [self.user_id]


@dataclass(frozen=True)
class TurnWindow:
    """Which of a user's archived turns a turn search sees: one session, an event-time
    range ``[since, until)`` (None: open)."""

    session_id: str | None = None
    since: float | None = None
    until: float | None = None


class MemoryStore(Protocol):
    def write(self, memories: Sequence[Memory], vectors: Sequence[list[float] | None]) -> None:
        """Upsert version records; a ``None`` vector keeps the stored one (payload only)."""
        ...

    def write_records(self, records: Sequence[Record]) -> None:
        """:meth:`write` for records as payloads (a rebuild: no Memory objects made);
        a ``None`` vector: the stored record's payload is replaced, its vector kept."""
        ...

    def search(self, scope: Scope, vector: list[float], k: int,
               statuses: Sequence[str] = ("active",), *, types: Sequence[str] | None = None,
               exclude_slots: Sequence[str] = ()) -> list[tuple[Memory, float]]:
        """Top-k by cosine among the scope's memories with one of ``statuses`` (and, if
        given, one of ``types``), leaving out the slots ``exclude_slots``."""
        ...

    def search_turns(self, scope: Scope, k: int, *, vector: list[float] | None = None,
                     sparse: Sparse | None = None, window: TurnWindow | None = None,
                     ) -> list[tuple[dict[str, Any], float]]:
        """The top-k archived turns of exactly ``scope``'s user (never the global scope) in
        ``window``: by cosine to ``vector``, or else by BM25 of ``sparse`` (the store
        applies each term's IDF over the user's turns). Payloads as stored, with scores."""
        ...

    def versions(self, scope: Scope, *, memory_ids: Sequence[str] = (),
                 message_ids: Sequence[str] = ()) -> list[Memory]:
        """Every version record of exactly ``scope``'s user, whatever its status (never a
        turn or a bookkeeping record): those of ``memory_ids``, and those whose lineage
        (:data:`LINEAGE`) holds one of ``message_ids``. What retrieval learns of the
        statements it returns: which were superseded, by what and when (memory.truth)."""
        ...

    def sweep_turns(self, before: float) -> int:
        """Delete every archived turn (all users) whose event time is before ``before``;
        returns how many."""
        ...

    def list(self, scope: Scope, statuses: Sequence[str] | None = ("active",),
             limit: int = 10_000, *, types: Sequence[str] | None = None,
             slots: Sequence[str] | None = None) -> list[Memory]:
        """Every version record in the scope (all statuses when ``statuses`` is None),
        optionally only of these types / slots."""
        ...

    def op_applied(self, scope: Scope, op_id: str) -> bool:
        """Has op ``op_id`` already left a record in this scope (idempotent apply)?"""
        ...

    def ops_applied(self, scope: Scope, op_ids: Sequence[str]) -> set[str]:
        """Those of ``op_ids`` that already left a record in this scope (one read)."""
        ...

    def live_versions(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, int]:
        """memory id -> its live (active) version, for those of ``memory_ids`` that are live."""
        ...

    def cursor(self, scope: Scope) -> Cursor | None:
        """The last job the store applied for this user (see :mod:`memory.fencing`)."""
        ...

    def set_cursor(self, scope: Scope, cursor: Cursor,
                   published: Sequence[str] | None = None) -> None:
        """Record ``cursor``; written after the job's changes. With ``published`` (the
        job's change events as published, each one's JSON), those are kept with it as
        :meth:`published`, in the same write (one upsert: both or neither)."""
        ...

    def published(self, scope: Scope) -> Published | None:
        """The change events :meth:`set_cursor` last kept for this user, and whose."""
        ...

    def access_stats(self, scope: Scope, memory_ids: Sequence[str]) -> dict[str, AccessStats]:
        """The hit statistics of these memories (those that have any)."""
        ...

    def put_access(self, scope: Scope, stats: Sequence[AccessStats]) -> None:
        """Store folded hit statistics (see :mod:`memory.access_stats`)."""
        ...

    def scan(self, tenant_id: str | None = None, user_id: str | None = None, *,
             vectors: bool = False, page: int = 1024) -> Iterator[Record]:
        """Every record (versions, cursors, hit statistics), optionally of one tenant /
        user, page by page in point id order: (point id, payload, vector if asked)."""
        ...

    def delete_records(self, point_ids: Sequence[str]) -> None:
        """Delete these records (a rebuild's per-user copy drops what the source lacks)."""
        ...

    def erase(self, scope: Scope) -> int:
        """Forget-me: physically delete every record of exactly ``scope``'s user (versions,
        vectors, hit statistics), keeping only its cursor (fencing: no older job may write
        again). Returns how many memory version records were deleted."""
        ...

    def count(self) -> int:
        """Memory version records of every tenant and user (cursors and hit statistics not
        counted): the store size gauge of the worker's metrics, nothing scoped reads it."""
        ...

    def close(self) -> None: ...
