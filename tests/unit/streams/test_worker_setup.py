"""How the worker runs Faust (streams/faust_setup.py): the log
throttle, static membership ids, a web server that serves memstream's key-protected views
and none of Faust's own, and the tables' changelogs created up front."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from memstream.core.settings import Settings
from memstream.streams.faust_setup import ThrottleFilter, install_throttle
from memstream.worker import build_worker as build_app

pytestmark = pytest.mark.unit

# --- the log throttle ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(msg: str, *args: object, name: str = "aiokafka.conn",
           level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or None, None)


def test_repeats_pass_once_per_interval_with_the_count_held_back():
    clock = Clock()
    f = ThrottleFilter(10.0, clock=clock)
    passed = []
    for i in range(1000):  # 100 lines a second for 10 s, then one more
        clock.now = 1000.0 + i / 100
        r = record("Unable connect to node with id %s: %s", 1, f"refused {i}")
        if f.filter(r):
            passed.append(r)
    clock.now = 1010.0
    last = record("Unable connect to node with id %s: %s", 1, "refused")
    assert f.filter(last)
    assert len(passed) == 1
    assert "[999 more like this in 10s]" in last.getMessage()


@pytest.mark.parametrize(("first", "second", "throttled"), [
    (record("Failed fetch from %s", 1), record("Failed fetch from %s", 2), True),
    (record("Unable connect to node 1"), record("Unable connect to node 22"), True),
    (record("Failed fetch from %s", 1), record("Heartbeat failed %s", 1), False),
    (record("x %s", 1, level=logging.ERROR), record("x %s", 1, level=logging.WARNING), False),
    (record("x %s", 1, name="aiokafka.conn"), record("x %s", 1, name="aiokafka.client"), False),
    (record("dead letter %s", 1, name="memstream.streams.ingest"),
     record("dead letter %s", 2, name="memstream.streams.ingest"), False),  # ours: never
    (record("x", name="faust.transport.drivers.aiokafka"),
     record("x", name="faust.transport.drivers.aiokafka"), True),
    (record("x", name="aiokafkax"), record("x", name="aiokafkax"), False),  # prefix, not str
])
def test_what_counts_as_a_repeat(first, second, throttled):
    f = ThrottleFilter(10.0, clock=Clock())
    assert f.filter(first)
    assert f.filter(second) is not throttled


def test_interval_zero_lets_everything_through_and_keys_are_bounded():
    assert all(ThrottleFilter(0.0, clock=Clock()).filter(record("same")) for _ in range(5))
    f = ThrottleFilter(10.0, clock=Clock(), max_keys=3)
    for i in range(10):
        f.filter(record(f"msg {'x' * i}"))
    assert len(f._seen) == 3


def test_installed_on_every_handler_of_the_logger():
    logger = logging.Logger("test-root")
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            seen.append(r.getMessage())

    logger.addHandler(Collect())
    logger.addHandler(Collect())  # a second handler sees the same records, same decisions
    assert install_throttle(logger, 0) is None
    throttle = install_throttle(logger, 10.0)
    assert throttle is not None
    noisy = logging.Logger("aiokafka.client")
    noisy.parent = logger  # propagates to the handlers of our stand-in root
    for _ in range(50):
        noisy.error("Unable to update metadata from %s", [1])
    logger.error("ours")
    assert seen == ["Unable to update metadata from [1]"] * 2 + ["ours"] * 2


# --- static membership (the loops' consumers: streams/owned_loop.py connect) -------------


def test_static_membership_id_is_stable_per_data_dir_and_can_be_turned_off(tmp_path):
    one = Settings(data_dir=tmp_path / "a").instance_id()
    again = Settings(data_dir=tmp_path / "a").instance_id()
    other = Settings(data_dir=tmp_path / "b").instance_id()
    assert one == again and one != other and one
    assert Settings(group_instance_id="w-7").instance_id() == "w-7"
    assert Settings(group_instance_id="").instance_id() == ""  # no static member


def _pipeline(tmp_path: Path, **overrides: object):
    settings = Settings(data_dir=tmp_path, embedder="hashing", extract_enabled=True,  # type: ignore[arg-type]
                        web_enabled=True, admin_key=SecretStr("k-1-admin-0123456789abcdef01234567"),
                        **overrides)
    return build_app(settings)


# --- the web server ----------------------------------------------------------------------

def test_faust_serves_nothing_and_the_api_is_memstreams(tmp_path):
    """Faust's web server (its views /router, /table, /stats, ... have no authentication)
    never starts: off in its settings and in its boot strategy (the start itself:
    tests/unit/streams/test_faust_contract.py)."""
    p = _pipeline(tmp_path)
    assert p.app.conf.web_enabled is False
    assert p.app.boot_strategy.enable_web is False
    assert p.api is not None  # web_enabled: memstream's API (streams.serve) is registered


def test_every_table_changelog_is_created_with_the_topics_before_the_worker_joins(tmp_path):
    """The loops create no topic: every table's changelog is among the topics created up
    front, under the name each table writes to, with the inputs' partition count."""
    from memstream.topics.registry import table_changelogs

    p = _pipeline(tmp_path, jobs_enabled=True, partitions=6)
    specs = {s.name: s for s in table_changelogs(p.settings)}
    assert not p.app.tables  # Faust holds no table: the loops own them
    assert {p.state.topic, p.window.topic, p.maintenance.topic} == set(specs)
    assert all(s.partitions == 6 and s.cleanup_policy == "compact" for s in specs.values())


# --- the cluster secret ------------------------------------------------------------------

CLUSTER_SECRET = "cluster-secret-setup-0123456789abcdef0123"


@pytest.mark.parametrize("secret", [CLUSTER_SECRET, None])
def test_every_loops_assignor_signs_with_the_cluster_secret_of_the_settings(tmp_path, secret):
    """The secret flows from Settings to each stage's group (streams.scaling, owned_loop):
    with it every member's metadata is signed; without it, as before (one worker only)."""
    from memstream.core.cluster_auth import MEMBER, key_for, verify

    p = _pipeline(tmp_path, cluster_secret=SecretStr(secret) if secret else None)
    assert p.cluster is not None and p.cluster.trust is not None
    assert p.cluster.trust.signs == (secret is not None)
    assert p.loops
    for loop in p.loops:
        raw = json.loads(loop.assignor.metadata(["t"]).user_data)
        assert raw["worker"] == p.cluster.me.worker_id and raw["url"] == p.settings.api_url()
        if secret is None:
            assert "sig" not in raw
        else:
            assert verify(key_for(secret, MEMBER), raw["sig"], raw["worker"], raw["url"],
                          "1" if raw["single"] else "0", f"{raw['since']:.6f}",
                          f"{raw['at']:.6f}", raw["group"])
