"""The chaos benchmark's ``--broker-in-take`` (benchmarks/chaos.py): the broker is stopped
at a moment a worker's log shows partitions being taken and not all taken yet."""

from __future__ import annotations

import pytest

from benchmarks.chaos import taking_shards

pytestmark = pytest.mark.unit
ASSIGNED = ("[2026-12-04 22:57:39,274] [13625] [INFO] apply loop: partitions [0, 1, 2, 3] "
            "(new [0, 1, 2, 3], being taken {taking}) \n")
TAKEN = "[2026-12-04 22:57:40,815] [13625] [INFO] apply partition {n} taken in 1.50s \n"


def test_no_assignment_yet_is_no_take():
    assert not taking_shards("[...] [INFO] [^Worker]: Starting... \n")


def test_partitions_being_taken_until_each_is_taken():
    text = ASSIGNED.format(taking="[0, 1, 2, 3]")
    assert taking_shards(text)
    for n in (2, 0, 3):
        text += TAKEN.format(n=n)
        assert taking_shards(text)
    assert not taking_shards(text + TAKEN.format(n=1))


def test_only_the_last_assignment_counts():
    earlier = ASSIGNED.format(taking="[0, 1]")  # never finished: the run was rebalanced
    assert not taking_shards(earlier + ASSIGNED.format(taking="[]"))
    assert taking_shards(earlier + TAKEN.format(n=0) + TAKEN.format(n=1)
                         + ASSIGNED.format(taking="[3]"))


def test_another_stages_take_is_not_a_shard_take():
    text = ASSIGNED.format(taking="[0]").replace("apply loop", "ingest loop")
    assert not taking_shards(text)
