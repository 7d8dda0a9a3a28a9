"""What the stages share (:class:`Pipeline`): the Faust app, the topics, the loops' tables,
the backends, the policy and the clock. Built once by :func:`streams.app.build_app`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import faust
from pydantic import BaseModel

from memstream.core.settings import Settings
from memstream.memory.coalescing import Policy, UserState
from memstream.memory.services import Services
from memstream.streams.counters import Counters
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.waiters import Waiters
from memstream.topics.registry import Topics


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


@dataclass
class Pipeline:
    """What the stages share: the app, the topics, the loops' tables, policy and clock."""

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
    api: Any = None  # the HTTP API's backend when web_enabled (web.backend.WorkerBackend)
    # per-user data keys when MEMSTREAM_MASTER_KEY is set (memstream.memory.crypto.user_keys)
    user_keys: Any = None
    # the cluster map of each stage's group (streams.cluster); the shards' keeper and
    # standbys with store_partitioned (streams.shards, streams.standby)
    cluster: Any = None
    shards: Any = None
    standbys: Any = None
    global_copy: Any = None  # the global memories' shard (streams.standby.GlobalCopy)
    # the owned loops that run here (streams.owned_loop): their lag, their stop
    loops: list[Any] = field(default_factory=list)

    @cached_property
    def input_models(self) -> dict[str, type[BaseModel]]:
        """Which schema each input topic carries (the repartition topic: the schema of the
        topic each record names, streams.placement)."""
        return {t.name: t.schema for t in self.topics.ingest_inputs()
                if t is not self.topics.repartition}
