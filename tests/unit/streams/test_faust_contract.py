"""The public faust-streaming / mode-streaming API memstream uses is still there, as our code
calls it, and nothing in the project reaches past it: an upgrade of Faust that changes
what we use must fail here, loudly.

What memstream uses (all public, no leading underscore):

- ``faust.App(id, web_enabled=..., store=..., datadir=...)`` and its boot strategy,
  ``faust.app.base.BootStrategy(app, enable_kafka=False, enable_web=False)`` set as
  ``app.boot_strategy`` (streams/faust_setup.py ``make_app``): Faust starts no Kafka
  client and no web server;
- ``faust.Worker(app, **options)`` and its hook ``on_setup_root_logger(logger, level)``
  (streams/faust_setup.py ``Worker``, memstream/cli.py);
- ``mode.Service`` with ``add_dependency``, ``add_future`` and the hooks ``on_start`` /
  ``on_stop`` (streams/lifecycle.py ``Part``).

No class of the project overrides an underscore method or attribute of a Faust or mode
class: tests/unit/project/test_private_overrides.py.
After an upgrade, re-read those files against the new versions, then update REVIEWED and
the pin in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import faust
import mode
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faust.app.base import BootStrategy

from memstream.core.settings import Settings
from memstream.streams import faust_setup, lifecycle

pytestmark = pytest.mark.unit

REVIEWED = "0.15.3"  # the faust-streaming this module was written and checked against
REVIEWED_MODE = "0.7.1"  # its mode-streaming


def names(fn: Callable[..., Any]) -> list[str]:
    """Parameter names, ``*args`` / ``**kwargs`` included (as ``*name`` / ``**name``)."""
    def shown(p: inspect.Parameter) -> str:
        if p.kind is p.VAR_POSITIONAL:
            return f"*{p.name}"
        return f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name

    return [shown(p) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


def test_the_installed_faust_and_mode_are_the_reviewed_ones():
    assert metadata.version("faust-streaming") == REVIEWED, (
        "faust-streaming changed: re-read streams/faust_setup.py and streams/lifecycle.py "
        "against it (this module's docstring lists what they use), then update REVIEWED and "
        "the pin in pyproject.toml")
    assert metadata.version("mode-streaming") == REVIEWED_MODE


# --- the public API we call ---------------------------------------------------------------

CALLED = [
    (BootStrategy.__init__, ["self", "app", "enable_web", "enable_kafka",
                             "enable_kafka_producer", "enable_kafka_consumer",
                             "enable_sensors"]),
    (faust.Worker.on_setup_root_logger, ["self", "logger", "level"]),  # faust_setup.Worker
    (mode.Service.add_dependency, ["self", "service"]),  # lifecycle.run
    (mode.Service.add_future, ["self", "coro"]),  # lifecycle.Part (background)
    (mode.Service.on_start, ["self"]),  # lifecycle.Part
    (mode.Service.on_stop, ["self"]),
]


@pytest.mark.parametrize(("fn", "params"), CALLED, ids=[f.__qualname__ for f, _ in CALLED])
def test_the_faust_functions_we_call_keep_their_parameters(fn, params):
    assert names(fn) == params


def test_worker_takes_the_app_first_and_keyword_options():
    params = names(faust.Worker.__init__)
    assert params[:3] == ["self", "app", "*services"] and params[-1] == "**kwargs", params


def test_the_settings_we_give_are_faust_settings(tmp_path):
    app = faust_setup.make_app(Settings(data_dir=tmp_path))
    assert app.conf.web_enabled is False
    assert str(app.conf.store) == "memory:"
    assert Path(app.conf.datadir) == tmp_path / "faust"


def test_the_app_boots_only_its_agent_manager(tmp_path):
    """No consumer (so no group, leader assignor or its topic), no producer, no conductor,
    no table manager, no web server: the boot strategy's public switches."""
    app = faust_setup.make_app(Settings(data_dir=tmp_path))
    assert isinstance(app.boot_strategy, BootStrategy)
    assert app.boot_strategy.app is app
    assert [type(s).__name__ for s in app.boot_strategy.server()] == ["AgentManager"]
    booted = {type(s).__name__ for s in app.on_init_dependencies()}
    assert booted == {"Monitor", "AgentManager"}, booted


def test_the_pipeline_gives_faust_no_agent_or_table(tmp_path):
    from memstream.streams.app import build_app

    p = build_app(Settings(data_dir=tmp_path, embedder="hashing"))
    assert not p.app.agents and not p.app.tables and p.loops


async def test_the_app_starts_and_stops_without_a_kafka_client(tmp_path, monkeypatch):
    """The app's whole lifecycle with every aiokafka client start failing: none is asked;
    and no web server of Faust's listens."""
    asked: list[str] = []

    async def refuse(self: Any) -> None:
        asked.append(type(self).__name__)
        raise AssertionError("Faust started a Kafka client")

    monkeypatch.setattr(AIOKafkaConsumer, "start", refuse)
    monkeypatch.setattr(AIOKafkaProducer, "start", refuse)
    app = faust_setup.make_app(Settings(data_dir=tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app.conf.web_port, app.conf.web_bind = port, "127.0.0.1"
    await asyncio.wait_for(app.start(), 30)
    try:
        with pytest.raises(OSError):  # refused: nothing listens
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        await asyncio.wait_for(app.stop(), 30)
    assert asked == []


async def test_the_parts_start_in_order_with_the_app_and_stop_in_reverse(tmp_path):
    app = faust_setup.make_app(Settings(data_dir=tmp_path))
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
