"""``memstream topics grow``, its pure parts: what counts as drained, where a copied record
goes, which names are refused (the copy itself: tests/integration/test_topics_grow.py)."""

from __future__ import annotations

import pytest

from memstream.core.settings import Settings
from memstream.memory.store.partitioned import partition_of, partition_of_key
from memstream.ops.topics_grow import (
    durable,
    pending,
    place,
    same_names,
    target_settings,
)
from memstream.topics.registry import registry

pytestmark = pytest.mark.unit


def snap(user: str, sessions: dict[str, tuple[int, int]], *, flight=False, tools=0):
    return {"tenant_id": "acme", "user_id": user,
            "sessions": {s: {"count": c, "watermark": w} for s, (c, w) in sessions.items()},
            "in_flight": {"seq": 3} if flight else None, "tools": [["t"]] * tools}


def test_a_state_with_every_message_scanned_and_nothing_in_flight_is_drained():
    found = pending({b"acme/a": snap("a", {"s1": (8, 8), "s2": (3, 3)}),
                     b"acme/b": snap("b", {})})
    assert found.drained and found.users == 0


def test_unscanned_messages_a_job_in_flight_and_queued_tools_are_each_pending():
    found = pending({b"acme/a": snap("a", {"s1": (8, 5), "s2": (4, 3)}),
                     b"acme/b": snap("b", {"s1": (2, 2)}, flight=True),
                     b"acme/c": snap("c", {}, tools=2),
                     b"acme/d": snap("d", {"s1": (1, 1)})})
    assert not found.drained
    assert (found.users, found.unscanned, found.in_flight, found.tools) == (3, 4, 1, 2)
    assert found.examples == ["acme/a", "acme/b", "acme/c"]


def test_a_copied_record_goes_to_its_keys_partition_of_the_new_count():
    for user in ("alice", "bob", "u-17", "用户"):
        key = f"acme/{user}".encode()
        for n in (1, 4, 12, 48):
            assert place(key, n) == (0 if n == 1 else partition_of("acme", user, n))
            assert place(key, n) == (0 if n == 1 else partition_of_key(key, n))
    assert place(None, 1) == 0  # one partition: wherever the key is
    with pytest.raises(ValueError):
        place(None, 12)  # a co-partitioned record without its user


def test_the_new_set_needs_its_own_prefix_and_app_id():
    old = Settings(topic_prefix="ms", app_id="ms", partitions=4)
    assert same_names(old, target_settings(old, "ms2", "ms2", 12)) == []
    lines = same_names(old, target_settings(old, "ms", "ms", 12))
    assert len(lines) == 2 and "--prefix" in lines[0] and "--app-id" in lines[1]
    new = target_settings(old, "ms2", "ms2", 12)
    assert (new.topic_prefix, new.app_id, new.partitions) == ("ms2", "ms2", 12)


def test_what_is_copied_is_what_memstream_keeps_and_never_an_input():
    topics = registry(Settings(topic_prefix="ms", partitions=4))
    names = {t.name for t in durable(topics)}
    assert {"ms.memory-changes", "ms.memory-access", "ms.memory-events", "ms.user-keys",
            "ms.api-keys", "ms.global-changes", "ms.dead-letters"} == names
    # every topic kept forever (or compacted) is copied: nothing a rebuild needs is left
    kept = {t.name for t in topics.all() if t.retention_ms < 0 or t.cleanup_policy == "compact"}
    assert kept <= names
