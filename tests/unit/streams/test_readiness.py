"""Readiness is read from the loops (streams/readiness.py): joined, every owned partition
taken (tables and store shard restored), the user keys and the global copy there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memstream.core.settings import Settings
from memstream.memory.store.partitioned import partition_of
from memstream.streams.readiness import readiness, restoring
from memstream.web.backend_reads import ReadBackend

pytestmark = pytest.mark.unit
N = 4


def loop(owned=(), taking=(), assignments=1):
    return SimpleNamespace(owned=set(owned), taking=set(taking), assignments=assignments)


def pipeline(*loops, keys_ready=True, global_caught_up=None):
    return SimpleNamespace(
        loops=list(loops), settings=Settings(partitions=N),
        user_keys=SimpleNamespace(ready=keys_ready),
        standbys=None if global_caught_up is None else object(),
        global_copy=None if global_caught_up is None else SimpleNamespace(
            caught_up=global_caught_up))


@pytest.mark.parametrize(("p", "ready", "restoring_", "waiting"), [
    (pipeline(loop({0, 1}), loop({0, 1})), True, (), ()),
    (pipeline(loop({0, 1}, taking={1}), loop({0, 1})), False, (1,), ()),
    (pipeline(loop({0}), loop(assignments=0)), False, (), ()),  # a loop not joined yet
    (pipeline(loop({0}), keys_ready=False), False, (), ("user-keys",)),
    (pipeline(loop({0}), global_caught_up=False), False, (), ("global-shard",)),
    (pipeline(loop({0}), global_caught_up=True), True, (), ()),
    (pipeline(loop(), loop()), True, (), ()),  # owns nothing: answers by forwarding
], ids=["restored", "restoring", "not-joined", "keys", "global-behind", "global-ok", "none"])
def test_ready_only_when_every_owned_partition_is_taken(p, ready, restoring_, waiting):
    found = readiness(p)
    assert (found.ready, found.restoring, found.waiting) == (ready, restoring_, waiting)


def test_a_worker_that_owns_nothing_says_it_forwards():
    assert readiness(pipeline(loop(), loop())).forwarding
    assert not readiness(pipeline(loop({2}))).forwarding
    assert not readiness(pipeline(loop(assignments=0))).forwarding


def test_only_the_users_of_a_partition_being_taken_wait():
    users = {partition_of("t", f"u{i}", N): f"u{i}" for i in range(50)}
    p = pipeline(loop({0, 1, 2, 3}, taking={1}))
    assert restoring(p, "t", users[1])
    assert not any(restoring(p, "t", users[n]) for n in (0, 2, 3))


def test_the_health_body_names_what_is_restoring():
    p = pipeline(loop({0, 1}, taking={1}), loop({0, 1}))
    backend = ReadBackend(p, recorder=None)  # type: ignore[arg-type]
    assert backend.health().status == "starting" and backend.health().waiting == ["api"]
    backend.started = True
    health = backend.health()
    assert (health.status, health.owned, health.restoring) == ("starting", [0, 1], [1])
    assert backend.ready()  # requests are served meanwhile, per user
    p.loops[0].taking.clear()
    assert backend.health().status == "ok"
