"""The faust-streaming internals memstream patches, overrides or reads are still there, as
our code calls them: an upgrade of Faust must fail here, loudly, rather than silently
un-patch (a renamed private method is never called again; a subclass overriding a patched
one bypasses the patch; a renamed parameter breaks a wrapper at the first commit).

Who relies on what:

- ``streams/commit_order.py`` patches ``ProducerBuffer._send_pending``, ``Producer.flush``
  (the aiokafka driver's), ``TransactionManager.commit``, ``Consumer._new_offset``,
  ``Consumer.ack`` and ``Conductor._compile_message_handler``, and reads the consumer's
  ``_committed_offset``, ``_unacked_messages`` and ``_acked``, the conductor's
  ``on_message`` and ``acks_enabled_for``, ``ProducerBuffer.size`` / ``flush`` and the
  messages' ``acked`` / ``refcount`` / ``tracked`` / ``generation_id``;
- ``streams/faust_setup.py`` overrides ``Recovery._build_highwaters``,
  ``TableManager.on_start`` / ``recovery`` (copies of Faust's, minus a nap, with another
  Recovery), ``Web._enabled_blueprints``, ``App._new_web``, ``Worker.on_setup_root_logger``
  and calls ``Recovery._highwater_logtable``, ``server_list``,
  ``credentials_to_aiokafka_auth``;
- ``streams/metrics.py`` reads ``Consumer._committed_offset``; ``streams/api.py``
  ``app.tables.recovery.completed``.

Every patch was written against :data:`REVIEWED`. After an upgrade, re-read those files
against the new Faust (the behaviour each patch fixes may have changed without any
signature changing), then update the expectations here and the pin in pyproject.toml.
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
import faust.tables.recovery
import faust.web.base
import mode.worker
import pytest
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.transport import conductor as faust_conductor
from faust.transport import consumer as faust_consumer
from faust.transport import producer as faust_producer
from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer, TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import TP
from faust.types.tuples import Message
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from memstream.settings import Settings
from memstream.streams import commit_order, faust_setup

pytestmark = pytest.mark.unit

REVIEWED = "0.15.3"  # the faust-streaming the patches were written and checked against


def names(fn: Callable[..., Any]) -> list[str]:
    """Parameter names, ``*args`` / ``**kwargs`` included (as ``*name`` / ``**name``)."""
    def shown(p: inspect.Parameter) -> str:
        if p.kind is p.VAR_POSITIONAL:
            return f"*{p.name}"
        return f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name

    return [shown(p) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


def faust_original(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """The Faust function one of commit_order's patches wraps (its ``original``)."""
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (), strict=True))
    assert "original" in cells, f"{wrapper.__qualname__} wraps no ``original``"
    found: Callable[..., Any] = cells["original"].cell_contents
    return found


def test_the_installed_faust_is_the_one_the_patches_were_reviewed_against():
    installed = metadata.version("faust-streaming")
    assert installed == REVIEWED, (
        f"faust-streaming {installed} is installed, the patches in streams/commit_order.py "
        f"and streams/faust_setup.py were checked against {REVIEWED}: re-read them against "
        f"the new version (this module's docstring lists what they touch), then update "
        f"REVIEWED and the pin in pyproject.toml")


# --- commit_order's patches: applied, reached, wrapping what they expect ------------------

PATCHED = [
    # (class patched, method, its parameters in Faust, the class the worker really uses)
    (ProducerBuffer, "_send_pending", ["self", "fut"], ProducerBuffer),
    (faust_aiokafka.Producer, "flush", ["self"], faust_aiokafka.Transport.Producer),
    (TransactionManager, "commit", ["self", "offsets", "start_new_transaction"],
     faust_aiokafka.Transport.TransactionManager),
    (Consumer, "_new_offset", ["self", "tp"], faust_aiokafka.Transport.Consumer),
    (Consumer, "ack", ["self", "message"], faust_aiokafka.Transport.Consumer),
    (Conductor, "_compile_message_handler", ["self"], faust_aiokafka.Transport.Conductor),
]


@pytest.fixture(scope="module")
def patched() -> None:
    commit_order.commit_after_outputs()  # idempotent: what build_app does first


@pytest.mark.parametrize(("owner", "name", "params", "runtime"), PATCHED,
                         ids=[f"{o.__name__}.{n}" for o, n, _, _ in PATCHED])
def test_each_patch_wraps_a_faust_method_with_the_expected_signature(patched, owner, name,
                                                                    params, runtime):
    wrapper = owner.__dict__.get(name)
    assert wrapper is not None, f"{owner.__qualname__}.{name} is gone"
    assert wrapper.__module__ == commit_order.__name__, f"{owner.__qualname__}.{name} unpatched"
    original = faust_original(wrapper)
    # Faust's own method of that very class (not one inherited from an interface)
    assert (original.__module__, original.__qualname__) == (
        owner.__module__, f"{owner.__qualname__}.{name}"), original
    assert names(original) == params, f"Faust's {owner.__qualname__}.{name} changed"
    assert names(wrapper) == params, f"the patch of {owner.__qualname__}.{name} differs"
    # no class between the patched one and the one the worker uses overrides it
    assert getattr(runtime, name) is wrapper, (
        f"{runtime.__qualname__}.{name} is not the patched {owner.__qualname__}.{name}")
    assert issubclass(runtime, owner)


@pytest.mark.parametrize(("module", "hook"), [
    (faust_producer, "_send_pending"),  # the buffer's sender task binds it at start
    (faust_consumer, "_new_offset"),  # the commit asks it per partition
    (faust_consumer, "transactions.commit"),  # the exactly-once commit goes through it
    (faust_conductor, "_compile_message_handler"),  # Conductor.__init__ compiles on_message
])
def test_faust_still_calls_the_patched_private_methods(module, hook):
    source = Path(module.__file__).read_text()
    assert re.search(rf"\bself\.{re.escape(hook)}\b", source), (
        f"{module.__name__} no longer uses self.{hook}: its patch would never run")


# --- the Faust methods and functions the patches and overrides call --------------------

CALLED = [
    (ProducerBuffer.flush, ["self"]),  # drain(): gives up after 0.1 s without progress
    (Conductor.acks_enabled_for, ["self", "topic"]),
    (Consumer.assignment, ["self"]),
    (Consumer.highwater, ["self", "tp"]),  # streams/metrics.py
    (Recovery.__init__, ["self", "app", "tables", "**kwargs"]),
    (Recovery._highwater_logtable, ["self", "highwaters", "title"]),
    (TableManager._update_channels, ["self"]),
    (faust_aiokafka.server_list, ["urls", "default_port"]),
    (faust_aiokafka.credentials_to_aiokafka_auth, ["credentials", "ssl_context"]),
]


@pytest.mark.parametrize(("fn", "params"), CALLED, ids=[f.__qualname__ for f, _ in CALLED])
def test_the_faust_functions_we_call_keep_their_parameters(fn, params):
    assert names(fn) == params


def test_recovery_log_table_takes_title_by_keyword():
    title = inspect.signature(Recovery._highwater_logtable).parameters["title"]
    assert title.kind in (inspect.Parameter.KEYWORD_ONLY,
                          inspect.Parameter.POSITIONAL_OR_KEYWORD)


# --- faust_setup's overrides: the methods they replace, as Faust calls them ------------

OVERRIDDEN = [
    # (our class, Faust's class, method, parameters)
    (faust_setup.ExactRecovery, Recovery, "_build_highwaters",
     ["self", "consumer", "tps", "destination", "title"]),
    (faust_setup.ExactTableManager, TableManager, "on_start", ["self"]),
    (faust_setup.OwnViewsWeb, AiohttpWeb, "_enabled_blueprints", ["self"]),
    (faust_setup.App, faust.App, "_new_web", ["self"]),
    (faust_setup.Worker, faust.Worker, "on_setup_root_logger", ["self", "logger", "level"]),
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
    (faust.tables.recovery, "_build_highwaters"),
    (faust.web.base, "_enabled_blueprints"),
    (faust.app.base, "_new_web"),
    (mode.worker, "on_setup_root_logger"),
])
def test_faust_still_calls_the_overridden_private_methods(module, hook):
    source = Path(module.__file__).read_text()
    assert re.search(rf"\bself\.{hook}\b", source), (
        f"{module.__name__} no longer calls self.{hook}: our override would never run")


def test_the_table_manager_parts_copied_from_faust_are_unchanged():
    """ExactTableManager.on_start and .recovery are Faust's own, minus the 1 s nap and with
    ExactRecovery: a Faust that does more there must be copied again."""
    assert set(TableManager.on_start.__code__.co_names) == {
        "sleep", "should_stop", "_update_channels", "recovery", "start"}
    recovery = vars(TableManager)["recovery"]
    assert isinstance(recovery, property)
    assert set(recovery.fget.__code__.co_names) == {
        "_recovery", "Recovery", "app", "beacon", "loop"}
    assert isinstance(vars(faust_setup.ExactTableManager)["recovery"], property)


def test_worker_takes_the_app_first_and_keyword_options():
    params = names(faust.Worker.__init__)
    assert params[:3] == ["self", "app", "*services"] and params[-1] == "**kwargs", params


# --- private state read at run time, on a worker's objects (no broker needed) ------------


@pytest.fixture(scope="module")
def app(patched, tmp_path_factory) -> faust.App:
    settings = Settings(data_dir=tmp_path_factory.mktemp("faust-contract"))
    return faust_setup.App(settings.app_id, **settings.faust_kwargs(),
                           **faust_setup.app_options(settings))


def test_the_consumer_keeps_the_offset_state_the_patches_read(app):
    consumer = app.consumer
    assert type(consumer) is faust_aiokafka.Consumer
    tp = TP("t", 0)
    assert consumer._committed_offset[tp] is None  # a partition never committed
    assert consumer._acked[tp] == []  # acked offsets, a list per partition
    assert len(consumer._unacked_messages) == 0 and hasattr(consumer._unacked_messages, "add")
    assert consumer.app is app
    assert isinstance(app.consumer_generation_id, int)
    assert isinstance(app.in_transaction, bool)
    assert consumer.transactions.app is app  # the patched commit flushes app.producer


def test_the_producer_buffer_is_what_drain_waits_on(app):
    buffer = app.producer.buffer
    assert type(buffer) is ProducerBuffer
    assert buffer.size == 0
    assert isinstance(vars(ProducerBuffer)["size"], property)


def test_the_conductor_hands_messages_over_through_the_patched_handler(app):
    on_message = app.topics.on_message  # compiled in Conductor.__init__
    assert on_message.__qualname__.startswith("_patch_fetched.<locals>.compile_handler"), (
        on_message.__qualname__)
    assert asyncio.iscoroutinefunction(on_message)


def test_the_table_manager_and_recovery_are_ours_and_expose_what_we_read(app):
    tables = app.tables
    assert isinstance(tables, faust_setup.ExactTableManager)
    assert hasattr(tables, "_recovery")  # the override fills it on first use
    recovery = tables.recovery
    assert isinstance(recovery, faust_setup.ExactRecovery)
    assert isinstance(recovery.completed, asyncio.Event)  # streams/api.py: ready()
    conf = app.conf
    for setting in ("broker_request_timeout", "broker_consumer", "consumer_max_fetch_size",
                    "broker_credentials", "ssl_context"):
        assert hasattr(conf, setting), setting


def test_messages_carry_the_fields_a_hand_over_resets():
    for field in ("tp", "topic", "offset", "acked", "refcount", "tracked", "generation_id"):
        assert field in Message.__slots__, field
