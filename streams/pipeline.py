"""What the stages share (:class:`Pipeline`): the Faust app, the topics, the loops' tables,
the backends, the policy and the clock, and the worker's declared parts (the cluster map,
the user keys, the store shards, the loops, the HTTP API). Built once by
:func:`streams.app.build_app`, the composition root.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import faust
from pydantic import BaseModel

from memstream.core.settings import Settings
from memstream.memory.coalescing import Policy, UserState
from memstream.memory.services import Services
from memstream.streams.counters import Counters
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.waiters import Waiters
from memstream.topics.registry import Topics

if TYPE_CHECKING:  # the parts' own modules (not imported at run time for them)
    from memstream.memory.crypto.user_keys import UserKeys
    from memstream.streams.cluster import Cluster
    from memstream.streams.shards import ShardKeeper
    from memstream.streams.standby import GlobalCopy, Standbys


def policy_from(settings: Settings) -> Policy:
    return Policy(
        min_new_messages=settings.min_new_messages,
        context_messages=settings.context_messages,
        idle_timeout_s=settings.idle_timeout_s,
        job_timeout_s=settings.job_timeout_s,
        retry_backoff_s=settings.retry_backoff_s,
        retry_backoff_max_s=settings.retry_backoff_max_s,
        dedup_window=settings.dedup_window,
        forget_after_s=settings.session_forget_after_s,
        late_grace_s=settings.session_late_grace_s,
        archive=settings.archive,
    )


class RestoredStates:
    """The states last written to the table, so the next event of a user skips re-parsing
    its snapshot. Valid only while the table still holds that very snapshot object (the
    in-memory store returns what was stored; after recovery or with another store the
    identity check fails and the snapshot is restored again). Bounded, least recent out.
    """

    def __init__(self, size: int = 50_000) -> None:
        self._size = size
        self._items: OrderedDict[bytes, tuple[object, UserState]] = OrderedDict()

    def get(self, key: bytes, snapshot: object) -> UserState | None:
        hit = self._items.get(key)
        if hit is None or snapshot is None or hit[0] is not snapshot:
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: bytes, snapshot: object, state: UserState) -> None:
        self._items[key] = (snapshot, state)
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def forget(self, key: bytes) -> None:
        self._items.pop(key, None)


class StageLoop(Protocol):
    """What the worker reads of a stage's loop (:class:`streams.owned_loop.OwnedLoop`, which
    imports this module: described here, not imported): readiness, routing and metrics."""

    @property
    def owned(self) -> set[int]: ...  # the partitions it owns

    @property
    def taking(self) -> set[int]: ...  # owned, still being taken (tables, shard, positions)

    @property
    def assignments(self) -> int: ...  # the assignments it had (0: not joined yet)

    def lags(self) -> dict[tuple[str, int], int]: ...  # (topic, partition) -> not handled


class HttpApi(Protocol):
    """The HTTP API this worker serves (:class:`web.backend.WorkerBackend`, added by
    :func:`web.serve.register`: the web layer sits above this one)."""

    started: bool  # serving requests (its keys read, its port open)


@dataclass
class Pipeline:
    """What the stages share: the app, the topics, the loops' tables, policy and clock; and
    the worker's parts, each built once by the composition root (:mod:`streams.app`; the
    API by :mod:`memstream.worker`), None where this worker runs without it."""

    settings: Settings
    app: faust.App
    topics: Topics
    state: LoopTable  # the ingest state per user (the ingest loop owns and writes it)
    policy: Policy
    window: LoopTable  # the short-term window (streams.window), written with the state
    maintenance: LoopTable  # the windowed jobs' per-user triggers (the apply loop owns it)
    services: Services
    clock: Callable[[], float] = time.time
    counters: Counters = field(default_factory=Counters)
    restored: RestoredStates = field(default_factory=RestoredStates)
    waiters: Waiters = field(default_factory=Waiters)  # API callers waiting for tool jobs
    # the cluster map each stage's group fills, which the API routes with (streams.cluster)
    cluster: Cluster | None = None
    # the per-user data keys, followed from their topic, with MEMSTREAM_MASTER_KEY (when
    # this worker seals changes or serves the API: memstream.memory.crypto.user_keys)
    user_keys: UserKeys | None = None
    # with store_partitioned: the owned shards' keeper, the standby copies, the copy of the
    # global memories (streams.shards, streams.standby)
    shards: ShardKeeper | None = None
    standbys: Standbys | None = None
    global_copy: GlobalCopy | None = None
    # the stages' loops that run here, in start order (streams.owned_loop.run_with_app)
    loops: list[StageLoop] = field(default_factory=list)
    api: HttpApi | None = None  # the HTTP API when web_enabled (web.serve.register)

    @cached_property
    def input_models(self) -> dict[str, type[BaseModel]]:
        """Which schema each input topic carries (the repartition topic: the schema of the
        topic each record names, streams.placement)."""
        return {t.name: t.schema for t in self.topics.ingest_inputs()
                if t is not self.topics.repartition}
