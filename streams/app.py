"""The composition root: the worker's pipeline built from settings, in one place.

Nothing here runs at import time. ``build_app(settings)`` builds the parts the stages share
(the topics, the services, the counters, the user keys, the cluster map, the store shards)
and hands them to the :class:`~memstream.streams.pipeline.Pipeline`, which declares each
one; then it adds the parts the Faust app runs (the shards, each stage's loop, the user
keys' follower, the rebuild swapper) in the order the app starts them. The HTTP API is
added on top by :func:`memstream.worker.build_worker` (the web layer sits above this one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import faust

from memstream.core import record_keys
from memstream.core.errors import InvalidRecord
from memstream.core.settings import Settings
from memstream.jobs.work import JobSettings, WindowedWork
from memstream.memory.governance_metrics import DEAD_LETTER_CLASSES, bounded
from memstream.memory.services import Services, build_services
from memstream.streams import faust_setup, lifecycle, scaling, store_swap
from memstream.streams.access import AccessStage
from memstream.streams.apply import ApplyStage
from memstream.streams.counters import Counters, add
from memstream.streams.extract import ExtractStage
from memstream.streams.ingest import IngestStage
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.jobs_fold import MaintenanceFold
from memstream.streams.owned_loop import run_with_app
from memstream.streams.pipeline import Pipeline, RestoredStates, policy_from
from memstream.streams.privacy import READY_S
from memstream.topics.registry import Topics, changelog_name, registry

if TYPE_CHECKING:  # imported when it is built: only with a master key
    from memstream.memory.crypto.user_keys import UserKeys

__all__ = ["Pipeline", "RestoredStates", "build_app", "policy_from"]
log = logging.getLogger(__name__)


def build_app(settings: Settings, clock: Callable[[], float] = time.time,
              services: Services | None = None) -> Pipeline:
    """The pipeline: the parts the stages share built first (nothing runs
    yet), then the parts the Faust app runs, added in the order it starts them; it stops
    them in the reverse order (:mod:`streams.lifecycle`): the loops finish their batches
    before the user keys and the store shards stop."""
    if settings.clock_offset_s and clock is time.time:
        offset = settings.clock_offset_s

        def clock() -> float:
            return time.time() + offset

    record_keys.provide(settings)  # what records that carry authority are signed with
    if settings.cluster_secret is None and not (settings.ingest_enabled
                                                and settings.extract_enabled):
        log.warning("this worker runs part of the pipeline without MEMSTREAM_CLUSTER_SECRET: "
                    "the records it exchanges with the other part are signed with the secret "
                    "of its data_dir, which a worker with another data_dir does not hold "
                    "(its records are refused): set MEMSTREAM_CLUSTER_SECRET on both")
    app = faust_setup.make_app(settings)
    topics = registry(settings)
    services = services or build_services(
        settings, windowed=WindowedWork(JobSettings.from_settings(settings)))
    counters = Counters()
    # the parts, built once here
    user_keys = user_keys_of(settings, topics, counters)
    cluster = scaling.cluster_of(settings)
    shards = scaling.store_shards(settings, services, topics, cluster, user_keys, clock)
    pipeline = Pipeline(
        settings=settings,
        app=app,
        topics=topics,
        state=LoopTable(changelog_name(settings, "ingest-state")),
        policy=policy_from(settings),
        maintenance=LoopTable(changelog_name(settings, "maintenance")),
        window=LoopTable(changelog_name(settings, "session-window")),
        services=services,
        clock=clock,
        counters=counters,
        cluster=cluster,
        user_keys=user_keys,
        shards=shards.keeper if shards is not None else None,
        standbys=shards.standbys if shards is not None else None,
        global_copy=shards.global_copy if shards is not None else None,
    )
    fold = MaintenanceFold(pipeline) if settings.jobs_enabled else None
    # the parts the app runs, in start order (each stage's loop: streams.owned_loop)
    if shards is not None:
        scaling.run_shards(app, shards)  # closed last, after the loops
    if settings.ingest_enabled:
        run_with_app(pipeline, IngestStage(pipeline))
    if user_keys is not None:
        follow_user_keys(app, user_keys)
    if settings.extract_enabled:
        run_with_app(pipeline, ExtractStage(pipeline))
        run_with_app(pipeline, ApplyStage(pipeline, fold))  # with the windowed jobs' fold
        run_with_app(pipeline, AccessStage(pipeline))
        store_swap.run_swaps(pipeline)  # memstream rebuild --verify / --swap
    elif fold is not None:  # the windowed jobs alone: they read the memory-change topic
        run_with_app(pipeline, ApplyStage(pipeline, fold, decisions=False))
    return pipeline


def user_keys_of(settings: Settings, topics: Topics, counters: Counters) -> UserKeys | None:
    """The user-keys topic's reader (streams.privacy: sealing in the apply stage, the
    forget-me fence of the API's reads) when a master key is configured and this worker
    seals changes or serves the API."""
    if settings.master_key is None or not (settings.extract_enabled or settings.web_enabled):
        return None
    from memstream.memory.crypto.user_keys import UserKeys

    def rejected(exc: InvalidRecord) -> None:  # a record set aside: a dead letter's count
        add(counters.dead_letters_by_class, bounded(exc.kind, DEAD_LETTER_CLASSES))

    return UserKeys(settings, topics.user_keys.name,
                    dead_letters=topics.dead_letters.name, on_reject=rejected)


def follow_user_keys(app: faust.App, keys: UserKeys) -> None:
    """The user keys as a part of ``app`` (background: the API and the loops wait for them
    where they need them)."""

    async def follow() -> None:
        await keys.start()
        if not await keys.wait_ready(READY_S):
            log.warning("user keys not read within %.0fs", READY_S)

    lifecycle.run(app, "user-keys", follow, keys.stop, background=True)
