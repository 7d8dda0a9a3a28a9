"""The composition root: one Faust app (lifecycle, timers), the topic handles, and the
stages' loops with their tables, built from settings.

Nothing here runs at import time; ``build_app(settings)`` wires everything once and the
stages receive what they need from the :class:`~memstream.streams.pipeline.Pipeline`
bundle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from memstream.core import record_keys
from memstream.core.settings import Settings
from memstream.jobs.work import JobSettings, WindowedWork
from memstream.memory.services import Services, build_services
from memstream.streams import (
    access,
    apply,
    extract,
    faust_setup,
    ingest,
    privacy,
    scaling,
    store_swap,
)
from memstream.streams.ingest_tables import LoopTable
from memstream.streams.jobs_fold import register as register_jobs
from memstream.streams.pipeline import Pipeline, RestoredStates, policy_from
from memstream.topics.registry import changelog_name, registry

__all__ = ["Pipeline", "RestoredStates", "build_app", "policy_from"]
log = logging.getLogger(__name__)


def build_app(settings: Settings, clock: Callable[[], float] = time.time,
              services: Services | None = None) -> Pipeline:
    """Create the Faust app and the stages' loops (ingest, extract, apply) with their timers."""
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
    reg = registry(settings)
    pipeline = Pipeline(
        settings=settings,
        app=app,
        topics=reg,
        state=LoopTable(changelog_name(settings, "ingest-state")),
        policy=policy_from(settings),
        maintenance=LoopTable(changelog_name(settings, "maintenance")),
        window=LoopTable(changelog_name(settings, "session-window")),
        services=services or build_services(
            settings, windowed=WindowedWork(JobSettings.from_settings(settings))),
        clock=clock,
    )
    scaling.register(pipeline)  # the cluster map; the store shards (store_partitioned)
    if settings.ingest_enabled:
        ingest.register(pipeline)
    if settings.extract_enabled or settings.web_enabled:
        privacy.register(pipeline)  # sealing (apply) and the forget-me fence (API reads)
    fold = None
    if settings.jobs_enabled:
        fold = register_jobs(pipeline)
    if settings.extract_enabled:
        extract.register(pipeline)
        apply.register(pipeline, fold)
        access.register(pipeline)
        store_swap.register(pipeline)  # memstream rebuild --verify / --swap
    elif fold is not None:  # the windowed jobs alone: they read the memory-change topic
        apply.register(pipeline, fold, decisions=False)
    return pipeline
