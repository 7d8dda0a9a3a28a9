"""The worker as ``memstream worker`` runs it: the pipeline (:func:`streams.app.build_app`)
and, when ``web_enabled``, the HTTP API on top of it (:mod:`web.serve`).

The one place both layers meet: ``streams`` knows nothing of the web package.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from memstream.core.settings import Settings
from memstream.memory.services import Services
from memstream.streams.app import build_app
from memstream.streams.pipeline import Pipeline
from memstream.web import serve


def build_worker(settings: Settings, clock: Callable[[], float] = time.time,
                 services: Services | None = None) -> Pipeline:
    """The pipeline's stages and, when ``web_enabled``, the HTTP API they answer."""
    pipeline = build_app(settings, clock=clock, services=services)
    if settings.web_enabled:
        serve.register(pipeline)
    return pipeline
