"""A worker started while the broker is away waits for it (``broker_wait_s``) in every
client it starts, Faust's own included: the broker can go between the worker's topic check
and the moment Faust's producer and consumer bootstrap (a rolling restart; a chaos run
caught a worker that exited there). Here Faust's clients start against a port where no
broker answers yet; once one attempt was refused, a forwarder to the real broker opens
there, and both starts complete."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import pytest

from memstream.streams import faust_setup
from tests.integration.conftest import free_port

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
    """Sets ``seen`` (from any thread) once a client logs a refused start."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.WARNING)
        self.loop, self.seen, self.lines = loop, asyncio.Event(), []

    def emit(self, record: logging.LogRecord) -> None:
        if "the broker is not reachable" in record.getMessage():
            self.lines.append(record.getMessage())
            self.loop.call_soon_threadsafe(self.seen.set)


@pytest.mark.parametrize("client", ["producer", "consumer"])
async def test_faust_clients_start_once_the_broker_answers(kafka_bootstrap, client):
    host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
    late = free_port()
    app = faust_setup.App(f"late-{uuid.uuid4().hex[:8]}", broker=f"kafka://127.0.0.1:{late}")
    app.broker_wait_s = 120.0
    refusals = Refusals(asyncio.get_running_loop())
    logger = logging.getLogger("memstream.streams.faust_setup")
    logger.addHandler(refusals)
    service = app.producer if client == "producer" else app.consumer
    proxy, refused, starting = None, None, None
    try:
        starting = asyncio.ensure_future(service.start())
        refused = asyncio.ensure_future(refusals.seen.wait())
        await asyncio.wait({starting, refused}, timeout=60,
                           return_when=asyncio.FIRST_COMPLETED)  # an attempt was refused ...
        assert refused.done() and not starting.done(), "the start gave up instead of waiting"
        # ... and the client keeps trying: the broker appears at the address it was given
        proxy = await asyncio.start_server(forwarder(host, int(port)), "127.0.0.1", late)
        await asyncio.wait_for(starting, 90)
        assert f"Faust's {client}: the broker is not reachable" in refusals.lines[0]
        if client == "producer":
            assert service._producer is not None and service._producer.client.cluster.brokers()
        else:
            thread = service._thread
            assert thread._consumer is not None and thread._consumer._client.cluster.brokers()
    finally:
        logger.removeHandler(refusals)
        for task in (refused, starting):
            if task is not None and not task.done():
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(service.stop(), 30)
        if proxy is not None:
            proxy.close()
            await proxy.wait_closed()
