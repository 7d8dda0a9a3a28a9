"""The faust-streaming internals memstream overrides or reads are still there, as our code
calls them: an upgrade of Faust must fail here, loudly, rather than silently bypass an
override (a renamed private method is never called again; a renamed parameter breaks a
caller at run time).

Faust reads no topic of the pipeline and holds no table (the stages run in their own loops,
streams/owned_loop.py); what is left:

- ``streams/faust_setup.py`` overrides ``Web._enabled_blueprints``, ``App._new_web``,
  ``Worker.on_setup_root_logger``, and, for clients that wait for a broker away at start,
  ``App._new_transport``, the aiokafka driver's ``Transport.Producer`` / ``Consumer``,
  ``Producer.on_start`` (whose body it restates) and ``create_topic``,
  ``Consumer._new_consumer_thread`` and ``AIOKafkaConsumerThread.on_start``;
- ``streams/lifecycle.py`` adds the worker's parts with ``Service.add_dependency`` (mode's
  public API: started in order with the app, stopped in reverse);
- ``memstream/cli.py`` builds ``Worker(app, **options)``.

Every override was written against :data:`REVIEWED`. After an upgrade, re-read those files
against the new Faust, then update the expectations here and the pin in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import faust
import faust.app.base
import faust.transport.base
import faust.transport.consumer
import faust.web.base
import mode.services
import mode.worker
import pytest
from faust.app.base import BootStrategy
from faust.transport.consumer import Consumer
from faust.transport.drivers import aiokafka as driver
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from memstream.core.settings import Settings
from memstream.streams import faust_setup, lifecycle

pytestmark = pytest.mark.unit

REVIEWED = "0.15.3"  # the faust-streaming the overrides were written and checked against
REVIEWED_MODE = "0.7.1"  # its mode-streaming (Service.add_dependency, add_future)


def names(fn: Callable[..., Any]) -> list[str]:
    """Parameter names, ``*args`` / ``**kwargs`` included (as ``*name`` / ``**name``)."""
    def shown(p: inspect.Parameter) -> str:
        if p.kind is p.VAR_POSITIONAL:
            return f"*{p.name}"
        return f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name

    return [shown(p) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


def test_the_installed_mode_is_the_one_pinned_with_faust():
    assert metadata.version("mode-streaming") == REVIEWED_MODE, (
        "mode-streaming changed: re-read streams/lifecycle.py against it, then update "
        "REVIEWED_MODE and the pin in pyproject.toml")


def test_the_installed_faust_is_the_one_the_overrides_were_reviewed_against():
    installed = metadata.version("faust-streaming")
    assert installed == REVIEWED, (
        f"faust-streaming {installed} is installed, streams/faust_setup.py was checked "
        f"against {REVIEWED}: re-read it against the new version (this module's docstring "
        f"lists what it touches), then update REVIEWED and the pin in pyproject.toml")


# --- faust_setup's overrides: the methods they replace, as Faust calls them ------------

OVERRIDDEN = [
    # (our class, Faust's class, method, parameters)
    (faust_setup.OwnViewsWeb, AiohttpWeb, "_enabled_blueprints", ["self"]),
    (faust_setup.App, faust.App, "_new_web", ["self"]),
    (faust_setup.Worker, faust.Worker, "on_setup_root_logger", ["self", "logger", "level"]),
    (faust_setup.App, faust.App, "_new_transport", ["self"]),
    (faust_setup.PatientProducer, driver.Producer, "on_start", ["self"]),
    (faust_setup.PatientConsumer, driver.Consumer, "_new_consumer_thread", ["self"]),
    (faust_setup.PatientConsumerThread, driver.AIOKafkaConsumerThread, "on_start", ["self"]),
]


@pytest.mark.parametrize(("ours", "theirs", "name", "params"), OVERRIDDEN,
                         ids=[f"{t.__name__}.{n}" for _, t, n, _ in OVERRIDDEN])
def test_each_override_replaces_a_faust_method_of_the_same_signature(ours, theirs, name,
                                                                    params):
    assert name in vars(ours), f"{ours.__qualname__} no longer overrides {name}"
    faust_method = getattr(theirs, name, None)
    assert faust_method is not None, f"Faust's {theirs.__qualname__}.{name} is gone"
    assert names(faust_method) == params, f"Faust's {theirs.__qualname__}.{name} changed"
    assert names(getattr(ours, name)) == params


@pytest.mark.parametrize(("module", "hook"), [
    (faust.web.base, "_enabled_blueprints"),
    (faust.app.base, "_new_web"),
    (mode.worker, "on_setup_root_logger"),
    (faust.app.base, "_new_transport"),
    (faust.app.base, "transport.create_producer"),  # the app's producer, from _new_transport
    (faust.app.base, "transport.create_consumer"),
    (faust.transport.consumer, "_new_consumer_thread"),
    (faust.transport.base, "Producer"),
    (faust.transport.base, "Consumer"),
])
def test_faust_still_calls_the_overridden_methods(module, hook):
    source = Path(module.__file__).read_text()
    assert re.search(rf"\bself\.{hook}\b", source), (
        f"{module.__name__} no longer calls self.{hook}: our override would never run")


# --- the Faust methods we call -----------------------------------------------------------

CALLED = [
    (Consumer.assignment, ["self"]),  # web/prometheus.py
    (Consumer.highwater, ["self", "tp"]),  # web/prometheus.py
    (mode.Service.add_dependency, ["self", "service"]),  # streams/lifecycle.py
    (mode.Service.add_future, ["self", "coro"]),  # lifecycle.Part (background)
]


@pytest.mark.parametrize(("fn", "params"), CALLED, ids=[f.__qualname__ for f, _ in CALLED])
def test_the_faust_functions_we_call_keep_their_parameters(fn, params):
    assert names(fn) == params


def test_the_patient_transport_is_the_drivers_with_patient_clients():
    assert issubclass(faust_setup.PatientTransport, driver.Transport)
    assert faust.transport.by_url("kafka://x") is driver.Transport  # what it stands in for
    app = faust_setup.App("contract", broker="kafka://127.0.0.1:1")
    assert type(app.transport) is faust_setup.PatientTransport
    assert type(app.producer) is faust_setup.PatientProducer
    assert type(app.consumer) is faust_setup.PatientConsumer
    assert type(app.consumer._thread) is faust_setup.PatientConsumerThread


def test_the_patient_producer_restates_the_drivers_start():
    """PatientProducer.on_start runs the base's part once and then retries the driver's own
    lines: they must still be what the driver's on_start does."""
    body = [line.strip() for line in inspect.getsource(driver.Producer.on_start).splitlines()
            if line.strip() and not line.strip().startswith(('"""', "async def"))]
    assert body == ["await super().on_start()",
                    "producer = self._producer = self._new_producer()",
                    "self.beacon.add(producer)", "await producer.start()"]
    assert names(driver.Producer.create_topic)[:4] == ["self", "topic", "partitions",
                                                      "replication"]


def test_worker_takes_the_app_first_and_keyword_options():
    params = names(faust.Worker.__init__)
    assert params[:3] == ["self", "app", "*services"] and params[-1] == "**kwargs", params


# --- state read at run time, on a worker's objects (no broker needed) --------------------


def make_app(tmp_path: Path) -> faust.App:
    settings = Settings(data_dir=tmp_path)
    return faust_setup.App(settings.app_id, **faust_setup.faust_kwargs(settings))


def test_faust_reads_no_topic_and_holds_no_table(tmp_path):
    """Faust's own consumer joins its group with nothing to read: no agent, no table (the
    stages' loops read every topic; streams/lifecycle.py says why that consumer stays)."""
    from memstream.streams.app import build_app

    p = build_app(Settings(data_dir=tmp_path, embedder="hashing"))
    assert not p.app.agents and not p.app.tables and p.loops


class _NoKafka(BootStrategy):
    enable_kafka = False  # (a unit test: no broker for Faust's own clients)


async def test_the_parts_start_in_order_with_the_app_and_stop_in_reverse(tmp_path):
    settings = Settings(data_dir=tmp_path)
    app = type("App", (faust_setup.App,), {"BootStrategy": _NoKafka})(
        settings.app_id, **faust_setup.faust_kwargs(settings))
    ran: list[str] = []

    def step(name: str) -> Callable[[], Any]:
        async def run() -> None:
            ran.append(name)
        return run

    lifecycle.run(app, "first", step("start first"), step("stop first"))
    lifecycle.run(app, "second", step("start second"), step("stop second"))
    ticks = asyncio.Event()
    lifecycle.run(app, "timer", lambda: lifecycle.every(0.01, _set(ticks)), background=True)
    await app.start()
    assert ran == ["start first", "start second"]
    await asyncio.wait_for(ticks.wait(), 5)
    await app.stop()
    assert ran[2:] == ["stop second", "stop first"]


def _set(event: asyncio.Event) -> Callable[[], Any]:
    async def step() -> None:
        event.set()
    return step
