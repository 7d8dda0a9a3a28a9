"""Faust as memstream runs it: exact changelog recovery, only our own views, quiet client logs.

Three things stock faust-streaming 0.15 does that memstream cannot live with:

- **Recovery.** Under exactly-once Faust takes the end of a changelog from the consumer's
  cached last stable offset (LSO), which is ``None`` until the partition has been fetched
  once (a paused changelog partition after a rebalance never is). ``None`` reads as -1: the
  table is not restored at all, or the offset recovery reached before the rebalance (kept in
  memory, never on disk: the store is ``memory://``) is "higher than the last offset" and
  recovery crashes with ``ConsistencyError``. And the LSO - 1 it waits for is the offset of
  a transaction marker, never delivered, so recovery only ends after 2 x 5 s of silence.
  :class:`ExactRecovery` instead reads the tail of each changelog partition once, with the
  isolation level of the worker's consumer, and waits for the last record it will actually
  be given: no silence to wait out, no race with the first fetch.
- **Web.** Faust serves ``/router``, ``/table`` (table contents), ``/`` and, depending on
  settings, ``/stats`` ``/graph`` ``/performance`` without any authentication. Faust's web
  server stays off (settings); should it be turned on, :class:`App` serves none of those.
  memstream's API is its own aiohttp app (``streams/http.py``, ``streams/serve.py``).
- **Logs.** With the broker unreachable, aiokafka's reconnect loops log ~70 lines a second.
  :class:`ThrottleFilter` lets the first of each repeated client message through and then one
  per interval, with the count of those it held back.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth, server_list
from faust.types import TP
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from memstream.errors import MemstreamError
from memstream.settings import Settings

#: Loggers whose repeated messages are throttled: the Kafka client and Faust's driver for it.
THROTTLED_LOGGERS = ("aiokafka", "faust.transport")


class RecoveryError(MemstreamError):
    """The end of a changelog partition could not be read (the broker did not answer)."""


# --- recovery ------------------------------------------------------------------------


def tail_window(begin: int, end: int, previous_start: int | None, size: int) -> tuple[int, int]:
    """The ``[start, stop)`` offsets to read next when looking for the last record before
    ``end``: the last ``size`` offsets first, then, while nothing visible was found there
    (aborted transactions, markers), the ``size`` offsets before what was already read."""
    stop = end if previous_start is None else previous_start
    return max(begin, stop - size), stop


async def _read_span(consumer: AIOKafkaConsumer, spans: Mapping[TopicPartition, tuple[int, int]],
                     deadline: float) -> dict[TopicPartition, int]:
    """Read each partition from ``start`` until its position reaches ``stop``; the offset of
    the last record seen below ``stop`` (-1: none: markers and aborted records only)."""
    last = dict.fromkeys(spans, -1)
    for tp, (start, _) in spans.items():
        consumer.seek(tp, start)
    pending = set(spans)
    while pending:
        if time.monotonic() > deadline:
            raise RecoveryError(f"changelog tail not read in time: {sorted(map(str, pending))}")
        batch = await consumer.getmany(*pending, timeout_ms=200)
        for tp, records in batch.items():
            below = [r.offset for r in records if r.offset < spans[tp][1]]
            if below:
                last[tp] = max(last[tp], *below)
        for tp in list(pending):
            # The position passes transaction markers and aborted records too.
            if await consumer.position(tp) >= spans[tp][1]:
                pending.discard(tp)
    return last


async def last_record_offsets(consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition],
                              *, timeout: float, window: int = 16) -> dict[TopicPartition, int]:
    """Offset of the last record a consumer with ``consumer``'s isolation level will be given
    from each partition (-1 when there is none). The consumer must have ``tps`` assigned.

    Under ``read_committed`` the end offset is the LSO and what precedes it is usually a
    commit marker, so the last record is searched backwards in growing windows.
    """
    tps = list(tps)
    deadline = time.monotonic() + timeout
    begins = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    found = {tp: -1 for tp in tps}
    starts: dict[TopicPartition, int | None] = {tp: None for tp in tps}
    todo = {tp for tp in tps if ends[tp] > begins[tp]}
    size = window
    while todo:
        spans = {tp: tail_window(begins[tp], ends[tp], starts[tp], size) for tp in todo}
        last = await _read_span(consumer, spans, deadline)
        for tp, offset in last.items():
            starts[tp] = spans[tp][0]
            if offset >= 0 or spans[tp][0] <= begins[tp]:
                found[tp] = offset
                todo.discard(tp)
        size *= 8
    return found


class ExactRecovery(Recovery):
    """Faust's recovery, waiting for the last changelog record it will be given (see module
    docstring) instead of a cached LSO - 1."""

    attempts = 3
    retry_pause_s = 1.0  # times the attempt number

    async def _build_highwaters(self, consumer: Any, tps: set[TP], destination: Any,
                                title: str) -> None:
        if not tps:
            destination.clear()
            return
        found = await self._last_offsets(tps)
        self.log.info("Last changelog record for %s partitions:\n%s", title,
                      self._highwater_logtable(found, title=title))
        destination.clear()
        destination.update(found)

    async def _last_offsets(self, tps: set[TP]) -> dict[TP, int]:
        # Faust gives this step broker_request_timeout in all: share it between the attempts.
        timeout = float(self.app.conf.broker_request_timeout) / (self.attempts + 1)
        for attempt in range(1, self.attempts):
            try:
                return await self._read_ends(tps, timeout)
            except Exception as exc:
                self.log.warning("reading the changelog ends failed (%r), retrying", exc)
                await asyncio.sleep(self.retry_pause_s * attempt)
        try:
            return await self._read_ends(tps, timeout)
        except Exception as exc:  # crash rather than recover nothing: a restart retries
            raise RecoveryError(f"cannot read the changelog ends: {exc!r}") from exc

    async def _read_ends(self, tps: set[TP], timeout: float) -> dict[TP, int]:
        conf = self.app.conf
        consumer = AIOKafkaConsumer(
            bootstrap_servers=server_list(conf.broker_consumer, 9092),
            group_id=None, enable_auto_commit=False,
            # what the worker's own consumer will be given: committed records under EOS
            isolation_level="read_committed" if self.app.in_transaction else "read_uncommitted",
            max_partition_fetch_bytes=conf.consumer_max_fetch_size, fetch_max_wait_ms=100,
            request_timeout_ms=int(timeout * 1000),
            **credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        )
        try:
            await consumer.start()
            parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
            consumer.assign(parts)
            found = await last_record_offsets(consumer, parts, timeout=timeout)
            return {TP(tp.topic, tp.partition): offset for tp, offset in found.items()}
        finally:
            await consumer.stop()


class ExactTableManager(TableManager):
    """Faust's table manager with :class:`ExactRecovery`, starting without Faust's 1 s nap
    (which lets tables be created while the app starts; ours all exist before, build_app)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = ExactRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


# --- web -------------------------------------------------------------------------------


class OwnViewsWeb(AiohttpWeb):
    """Faust's aiohttp web server without any of Faust's built-in blueprints (``/``,
    ``/router``, ``/table``, ``/stats``, ``/graph``, ``/performance``): only what the app
    registers with ``app.page`` is served."""

    def _enabled_blueprints(self) -> list[tuple[str, Any]]:
        return []


class App(faust.App):
    """``faust.App`` that serves only memstream's own views, and starts the services that
    need no table (``early``: the ingest loop) with the app, not after table recovery."""

    def _new_web(self) -> OwnViewsWeb:
        return OwnViewsWeb(self)

    async def on_start(self) -> None:
        await super().on_start()
        for task in getattr(self, "early", ()):
            self.add_future(task())


def start_with_app(app: Any, start: Callable[[], Any]) -> None:
    """Run ``start()`` when ``app`` starts (see :class:`App`)."""
    app.__dict__.setdefault("early", []).append(start)


def app_options(settings: Settings) -> dict[str, Any]:
    """``faust.App`` keyword arguments that select the classes of this module."""
    return {"TableManager": ExactTableManager} if settings.exact_recovery else {}


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

    def __init__(self, app: faust.App, *, log_throttle_s: float, **kwargs: Any) -> None:
        self.log_throttle_s = log_throttle_s
        super().__init__(app, **kwargs)

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        install_throttle(logger, self.log_throttle_s)
