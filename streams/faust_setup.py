"""Faust as memstream runs it: the app's lifecycle, only our own views, quiet client logs.

Faust reads no topic of the pipeline and holds no table: every
stage runs in its own transactional loop (:mod:`memstream.streams.owned_loop`), a part the
app starts and stops (:mod:`memstream.streams.lifecycle`). Two things stock faust-streaming
0.15 does that memstream cannot live with:

- **Web.** Faust serves ``/router``, ``/table`` (table contents), ``/`` and, depending on
  settings, ``/stats`` ``/graph`` ``/performance`` without any authentication. Faust's web
  server stays off (settings); should it be turned on, :class:`App` serves none of those.
  memstream's API is its own aiohttp app (``web/http.py``, ``web/serve.py``).
- **Logs.** With the broker unreachable, aiokafka's reconnect loops log ~70 lines a second.
  :class:`ThrottleFilter` lets the first of each repeated client message through and then one
  per interval, with the count of those it held back.
- **A broker away at start.** Faust's own producer and consumer bootstrap once as the app
  starts, and one failure ends the worker; the broker can go away between the worker's
  topic check (which waits ``broker_wait_s``) and that moment (a rolling restart). Their
  starts, and Faust's declaration of its leader topic, wait for it too, each up to
  ``broker_wait_s`` (:class:`PatientTransport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from memstream.core import json_log
from memstream.core.errors import MemstreamError, describe
from memstream.core.kafka import faust_credentials, stopped
from memstream.core.retry import RetryPolicy, retry_async
from memstream.core.settings import Settings

log = logging.getLogger(__name__)

#: Loggers whose repeated messages are throttled: the Kafka client and Faust's driver for it.
THROTTLED_LOGGERS = ("aiokafka", "faust.transport")


# --- web -------------------------------------------------------------------------------


class OwnViewsWeb(AiohttpWeb):
    """Faust's aiohttp web server without any of Faust's built-in blueprints (``/``,
    ``/router``, ``/table``, ``/stats``, ``/graph``, ``/performance``): only what the app
    registers with ``app.page`` is served."""

    def _enabled_blueprints(self) -> list[tuple[str, Any]]:
        return []


class App(faust.App):
    """``faust.App`` that serves only memstream's own views and whose own Kafka clients wait
    ``broker_wait_s`` for a broker that is away as they start (the pipeline's clients: see
    :mod:`streams.lifecycle`)."""

    broker_wait_s = 60.0  # Settings.broker_wait_s, set by streams.app

    def _new_web(self) -> OwnViewsWeb:
        return OwnViewsWeb(self)

    def _new_transport(self) -> PatientTransport:
        # the app's producer and consumer both come from it (App._new_producer/_new_consumer)
        return PatientTransport(self.conf.broker_consumer, self)


# --- Kafka clients ------------------------------------------------------------------------


class StartAbandoned(MemstreamError):
    """A client's start given up because its service is stopping (a SIGTERM while the
    broker is away)."""


async def patiently(start: Callable[[], Awaitable[None]], what: str, wait_s: float,
                    undo: Callable[[], Awaitable[None]], *,
                    stopping: Callable[[], bool] = lambda: False,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    """``start()`` again after a transient failure (the broker away: a connection refused, a
    timeout) for at most ``wait_s``; ``undo()`` drops what a failed attempt left. A
    permanent error, or no time left, is raised as it is (the worker stops, as before);
    so is :class:`StartAbandoned` once ``stopping()`` (``sleep`` should end early then)."""

    async def attempt() -> None:
        if stopping():
            raise StartAbandoned(f"{what}: not started, the worker is stopping")
        try:
            await start()
        except BaseException:  # cancelled too: nothing half-started is left open
            with contextlib.suppress(Exception):
                await undo()
            raise

    def logged(n: int, exc: BaseException, delay: float) -> None:
        log.warning("%s: the broker is not reachable (%s); trying again in %.1fs (attempt %d)",
                    what, describe(exc)[:200], delay, n)

    await retry_async(attempt, policy=RetryPolicy(first_delay_s=0.5, max_delay_s=2.0),
                      deadline=clock() + wait_s, clock=clock, sleep=sleep, on_retry=logged)


def _wait_s(transport: Any) -> float:
    return float(getattr(transport.app, "broker_wait_s", App.broker_wait_s))


async def _nothing() -> None:
    return None


class PatientProducer(driver.Producer):
    """Faust's producer whose connect waits for the broker, as does a topic it declares
    (Faust's leader topic, declared right after the consumer starts)."""

    async def on_start(self) -> None:
        await super(driver.Producer, self).on_start()  # the base's part (its buffer), once
        await patiently(self._connect, "Faust's producer", _wait_s(self.transport),
                        self._drop, stopping=lambda: self.should_stop, sleep=self.sleep)

    async def _connect(self) -> None:
        """``driver.Producer.on_start`` without its base's part (checked against Faust's by
        tests/unit/streams/test_faust_contract.py)."""
        producer = self._producer = self._new_producer()
        self.beacon.add(producer)
        await producer.start()

    async def _drop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            self.beacon.discard(producer)
            await producer.stop()

    async def create_topic(self, *args: Any, **kwargs: Any) -> None:
        await patiently(lambda: super(PatientProducer, self).create_topic(*args, **kwargs),
                        "Faust's topic declaration", _wait_s(self.transport), _nothing,
                        stopping=lambda: self.should_stop, sleep=self.sleep)


class PatientConsumerThread(driver.AIOKafkaConsumerThread):
    async def on_start(self) -> None:
        await patiently(super().on_start, "Faust's consumer", _wait_s(self.transport),
                        self._drop, stopping=lambda: self.should_stop, sleep=self.sleep)

    async def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stopped(consumer)  # aiokafka can raise CancelledError from a bare stop()


class PatientConsumer(driver.Consumer):
    def _new_consumer_thread(self) -> PatientConsumerThread:
        return PatientConsumerThread(self, loop=self.loop, beacon=self.beacon)


class PatientTransport(driver.Transport):
    """Faust's aiokafka transport with :class:`PatientProducer` and :class:`PatientConsumer`."""

    Producer = PatientProducer
    Consumer = PatientConsumer


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
    """Keyword arguments for ``faust.App``."""
    instance = settings.instance_id()
    return {
        # Static membership: a restart rejoins under the same id and gets its partitions
        # back without waiting out the dead member's session (SIGTERM does not leave the
        # group either: a worker stopped for good hands its partitions on after
        # session_timeout_s).
        "consumer_group_instance_id": instance or None,
        # Faust's own views (/router, /table, /stats, ...) have no authentication; only
        # memstream's views (web/http.py, behind X-API-Key) are served.
        "web_router_enabled": False,
        "web_tables_enabled": False,
        "web_stats_enabled": False,
        "web_graph_enabled": False,
        "web_metrics_enabled": False,
        "broker": [f"kafka://{host}" for host in settings.bootstrap_servers.split(",")],
        "broker_credentials": faust_credentials(settings),
        "store": "memory://",
        "topic_partitions": settings.partitions,
        # the layout's replication (topics.layout resolves it at start), as every topic's
        "topic_replication_factor": settings.replication_factor or 1,
        # Faust reads no topic of the pipeline: every stage runs in its own transactional
        # loop (streams.owned_loop); Faust's consumer only takes part in its group.
        "processing_guarantee": "at_least_once",
        "datadir": str(settings.data_dir / "faust"),
        # Faust's own web server stays off: the API is memstream's (web.serve).
        "web_enabled": False,
        "table_standby_replicas": 0,
        "broker_session_timeout": settings.session_timeout_s,
        "broker_heartbeat_interval": settings.heartbeat_interval_s,
        "producer_max_request_size": 16 * 1024 * 1024,
        "broker_commit_interval": 1.0,
        "stream_wait_empty": False,
    }
