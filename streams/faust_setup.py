"""Faust as memstream runs it: the app's lifecycle and quiet client logs, through Faust's
public API only.

Faust reads no topic of the pipeline, holds no table, serves no view and starts no Kafka
client: every stage runs in its own transactional loop (:mod:`memstream.streams.owned_loop`)
with its own consumer and producers, a part the app starts and stops
(:mod:`memstream.streams.lifecycle`). :func:`make_app` builds a plain ``faust.App`` whose
boot strategy (Faust's public ``BootStrategy(app, enable_kafka=False, enable_web=False)``,
set as ``app.boot_strategy``) starts only its sensors and its (empty) agent manager: no
consumer and so no group ``{app_id}``, no leader assignor or its topic, no producer, no
table or changelog topic, no web server (memstream's API is its own aiohttp app,
``web/http.py``, ``web/serve.py``). A broker that is away at start is waited for by those
clients of our own (the loop's consumer start, the partitions' producers:
:mod:`streams.task_manager`), nothing of Faust's.

Why Faust's idle clients once seemed to make ingest faster (and why they no longer do):
docs/faust.md.

- **Logs.** With the broker unreachable, aiokafka's reconnect loops log ~70 lines a second.
  :class:`ThrottleFilter` lets the first of each repeated client message through and then one
  per interval, with the count of those it held back.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import faust
from faust.app.base import BootStrategy

from memstream.core import json_log
from memstream.core.settings import Settings

log = logging.getLogger(__name__)

#: Loggers whose repeated messages are throttled: the Kafka client and Faust's driver for it.
THROTTLED_LOGGERS = ("aiokafka", "faust.transport")


def make_app(settings: Settings) -> faust.App:
    """The worker's ``faust.App``: its lifecycle only (see the module docstring)."""
    app = faust.App(settings.app_id, **faust_kwargs(settings))
    app.boot_strategy = BootStrategy(app, enable_kafka=False, enable_web=False)
    return app


# --- logs --------------------------------------------------------------------------------

_DIGITS = re.compile(r"\d+")
_DECIDED = "_memstream_throttle_passes"


class ThrottleFilter(logging.Filter):
    """Repeated messages of the Kafka client loggers: the first through at once, then one per
    ``interval`` seconds per (logger, level, message template); that one carries the number
    held back since. Other loggers pass untouched. ``clock`` is injected for tests."""

    def __init__(self, interval: float, *, prefixes: tuple[str, ...] = THROTTLED_LOGGERS,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 1024) -> None:
        super().__init__()
        self.interval = interval
        self.prefixes = prefixes
        self.clock = clock
        self.max_keys = max_keys
        # key -> (time the last record was let through, records held back since)
        self._seen: OrderedDict[tuple[str, int, str], tuple[float, int]] = OrderedDict()

    def _throttled(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.interval <= 0 or not self._throttled(record.name):
            return True
        decided = getattr(record, _DECIDED, None)
        if decided is not None:  # the same record at the next handler: same answer
            return bool(decided)
        passes = self._decide(record)
        setattr(record, _DECIDED, passes)
        return passes

    def _decide(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        if not record.args:  # pre-formatted (f-string): node ids, offsets, ports vary
            template = _DIGITS.sub("#", template)
        key = (record.name, record.levelno, template)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            self._seen[key] = (seen[0], seen[1] + 1)
            return False
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        if seen is not None and seen[1] and isinstance(record.msg, str):
            record.msg = f"{record.msg} [{seen[1]} more like this in {now - seen[0]:.0f}s]"
        return True


def install_throttle(logger: logging.Logger, interval: float) -> ThrottleFilter | None:
    """Add one shared :class:`ThrottleFilter` to every handler of ``logger`` (the root logger
    once Faust's worker has configured it); ``interval`` 0 installs nothing."""
    if interval <= 0:
        return None
    throttle = ThrottleFilter(interval)
    for handler in logger.handlers:
        handler.addFilter(throttle)
    return throttle


class Worker(faust.Worker):
    """``faust.Worker`` that throttles repeated Kafka client log lines (see ThrottleFilter)."""

    def __init__(self, app: faust.App, *, log_throttle_s: float, log_format: str = "text",
                 **kwargs: Any) -> None:
        self.log_throttle_s = log_throttle_s
        self.log_format = log_format
        super().__init__(app, **kwargs)

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        install_throttle(logger, self.log_throttle_s)
        json_log.install(logger, self.log_format)  # JSON lines with trace ids (opt-in)


# --- settings ----------------------------------------------------------------------------


def faust_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``faust.App``: public settings only. Faust connects to no
    broker (:func:`make_app`), so no connection, group or topic setting is given."""
    return {
        # Faust's own web server stays off (its views /router, /table, /stats, ... have no
        # authentication): the API is memstream's (web.serve).
        "web_enabled": False,
        "store": "memory://",
        "datadir": str(settings.data_dir / "faust"),
    }
