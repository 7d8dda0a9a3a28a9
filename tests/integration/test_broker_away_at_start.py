"""A worker started while the broker is away waits for it in the clients it starts: the
stage loops' own consumer and partition producers (Faust starts no Kafka client:
streams/faust_setup.py). The broker can go between the worker's topic check and the loops'
bootstrap (a rolling restart; a chaos run caught a worker that exited there). Here a
loop's consumer starts against a port where no broker answers yet; once one attempt was
refused, a forwarder to the real broker opens there, and the loop takes its partition
(its transactional producer started) and handles a record."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import NewTopic

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.stage import StageBase, Work
from tests.integration.conftest import free_port, until

pytestmark = pytest.mark.integration


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


def forwarder(host: str, port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


class Refusals(logging.Handler):
    """Sets ``seen`` once the loop logs a refused consumer start."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen, self.lines = asyncio.Event(), []

    def emit(self, record: logging.LogRecord) -> None:
        if "consumer not started" in record.getMessage():
            self.lines.append(record.getMessage())
            self.seen.set()


class Echo(StageBase):
    """Handles every record, writes nothing."""

    name = "away"
    tables = ()
    max_records = 10

    def __init__(self, topic: str) -> None:
        self.inputs = [topic]
        self.handled: list[Any] = []

    async def handle(self, records: list[Any]) -> Work:
        self.handled.extend(records)
        return Work()


async def test_a_loop_starts_once_the_broker_answers(kafka_bootstrap: str, tmp_path: Path):
    host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
    late = free_port()
    name = f"late-{uuid.uuid4().hex[:8]}"
    real = Settings(bootstrap_servers=kafka_bootstrap, app_id=name, topic_prefix=name,
                    data_dir=tmp_path)
    settings = real.model_copy(update={"bootstrap_servers": f"127.0.0.1:{late}",
                                       "broker_wait_s": 120.0})
    topic = f"{name}.in"
    admin = kafka.admin(real)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    fatal: list[str] = []
    stage = Echo(topic)
    loop = OwnedLoop(settings, stage, on_fatal=lambda reason, code=0: fatal.append(reason))
    refusals = Refusals()
    logger = logging.getLogger("memstream.streams.owned_loop")
    logger.addHandler(refusals)
    proxy = None
    try:
        await loop.start()
        await asyncio.wait_for(refusals.seen.wait(), 60)  # an attempt was refused ...
        assert not loop.owned and not fatal, "the loop gave up instead of waiting"
        # ... and the loop keeps trying: the broker appears at the address it was given
        proxy = await asyncio.start_server(forwarder(host, int(port)), "127.0.0.1", late)
        await until(lambda: _true(loop.owned == {0}), "the loop took its partition",
                    timeout=90)
        producer = kafka.producer(real)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"v", key=b"k")
        finally:
            await producer.stop()
        await until(lambda: _true(bool(stage.handled)), "the record handled", timeout=60)
        assert not fatal
    finally:
        logger.removeHandler(refusals)
        await asyncio.wait_for(loop.stop(), 60)
        if proxy is not None:
            proxy.close()
            await proxy.wait_closed()
        with contextlib.suppress(Exception):
            await admin.delete_topics([topic])
        await admin.close()


async def _true(ok: bool) -> bool | None:
    return True if ok else None
