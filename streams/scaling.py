"""The parts for more than one worker: the cluster map every loop's assignor fills (signed
and checked with the cluster secret: :mod:`streams.cluster_trust`), and, with
``store_partitioned``, the shards' keeper and standbys (:mod:`streams.shards`,
:mod:`streams.standby`). Built once by :func:`streams.app.build_app`, which hands them to
the :class:`~streams.pipeline.Pipeline`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faust

from memstream.core.settings import Settings
from memstream.memory.services import Services
from memstream.memory.store import MemoryStore
from memstream.memory.store.partitioned import PartitionedStore
from memstream.streams import lifecycle
from memstream.streams.cluster import Cluster, ClusterMap, Worker, must_leave, worker_of
from memstream.streams.cluster_trust import Trust
from memstream.streams.loop_clients import rebalance_timeout_s
from memstream.streams.owned_loop import halt
from memstream.streams.shard_builders import worker_builders
from memstream.streams.shards import ShardKeeper
from memstream.streams.standby import GlobalCopy, Standbys
from memstream.streams.store_layout import EXIT_SHARED, shared_refusal, single_layout
from memstream.topics.registry import Topics

if TYPE_CHECKING:  # imported where it is built (streams.app): only with a master key
    from memstream.memory.crypto.user_keys import UserKeys

log = logging.getLogger(__name__)


def cluster_of(s: Settings) -> Cluster:
    """This worker in the cluster map its loops' assignors fill (signed and checked with
    the cluster secret); a single-layout worker watches the maps for another worker."""
    me = worker_of(s.instance_id(), s.api_url(), single=single_layout(s), since=time.time())
    cluster = Cluster(me, trust_of(s))
    if me.single:
        cluster.listeners.append(_alone(me))
    return cluster


@dataclass(frozen=True)
class StoreShards:
    """The parts of ``store_partitioned``: the owned shards' keeper, the standby copies
    and the copy of the global memories (one part of the app: :func:`run_shards`)."""

    keeper: ShardKeeper
    standbys: Standbys
    global_copy: GlobalCopy


def store_shards(s: Settings, services: Services, topics: Topics, cluster: Cluster,
                 user_keys: UserKeys | None,
                 clock: Callable[[], float] = time.time) -> StoreShards | None:
    """The shards' keeper, standbys and global copy when the store is partitioned (None
    otherwise); the standbys follow the apply group's maps of ``cluster``."""
    store = services.store
    if not isinstance(store, PartitionedStore):
        return None
    from memstream.memory.store.edge import EdgeStore

    dim = services.embedder.dim

    def open_shard(path: Path) -> MemoryStore:
        return EdgeStore(path, dim)

    changelogs = [topics.memory_changes.name, topics.job_results.name,
                  topics.memory_access.name]

    async def opener() -> Any:
        if user_keys is None:
            return None
        if not await user_keys.wait_ready(60.0):
            raise RuntimeError("the user keys could not be read within 60 s")
        return user_keys.opener()

    keeper = ShardKeeper(s, store, open_shard, changelogs, opener, clock=clock)
    keeper.builders = worker_builders(s, dim)
    standbys = Standbys(s, store, open_shard, changelogs, opener, keeper.files, clock=clock)
    keeper.standbys = standbys
    standbys.busy = lambda: set(keeper.restoring)
    me = cluster.me.worker_id

    def on_map(stage: str, the_map: ClusterMap) -> None:
        if stage == "apply":  # the map comes before the partitions: a standby this worker
            # is about to own stays warm for the hand-over
            standbys.want(the_map.standby_of(me) | (the_map.owned_by(me) - set(store.owned)))

    cluster.listeners.append(on_map)
    shared = GlobalCopy(s, store, open_shard, topics.global_changes.name, opener,
                        keeper.files, clock=clock)
    return StoreShards(keeper, standbys, shared)


def run_shards(app: faust.App, shards: StoreShards) -> None:
    """The shards as a part of ``app``: the global copy followed when it starts; when it
    stops (after the loops: they are parts added after this one, stopped before it), the
    owned shards closed with a checkpoint (what each holds: nothing of theirs is open), the
    standbys and the global copy with theirs."""

    async def close_shards() -> None:
        await shards.standbys.stop()
        await shards.global_copy.stop()
        await shards.keeper.close()

    lifecycle.run(app, "store-shards", shards.global_copy.start, close_shards)


def trust_of(s: Settings, end: Callable[[str, int], None] = halt) -> Trust:
    """What this worker's groups sign with and check by: the cluster secret's keys (none:
    it must be alone; meeting another worker ends it through ``end``). A member's metadata
    is taken for the rebalance timeout (a member joins, then waits up to that long for the
    others) and two minutes more."""
    secret = s.cluster_secret.get_secret_value() if s.cluster_secret is not None else None
    return Trust.of(secret, end, member_max_age_s=rebalance_timeout_s(s) + 120.0)


def _alone(me: Worker, end: Callable[..., None] = halt) -> Callable[[str, ClusterMap], None]:
    """A single-layout worker's watch on the maps its groups hand it: another worker there
    ends it before it takes a partition (streams.store_layout), unless the others are
    single-layout workers newer than it, which end themselves."""

    def on_map(stage: str, the_map: ClusterMap) -> None:
        others = must_leave(the_map, me)
        if others:
            end(shared_refusal(me.worker_id, others), EXIT_SHARED)
        elif len(the_map.workers) > 1:
            log.warning("%s group: worker(s) %s joined on the single-store layout; they end "
                        "themselves (this worker keeps the store)", stage,
                        ", ".join(sorted(set(the_map.workers) - {me.worker_id})))

    return on_map
