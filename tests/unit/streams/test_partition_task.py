"""A partition's task (streams/partition_task.py): its states move only forward, it hands
the loop only records it has not handled, and letting it go leaves nothing of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition

from memstream.streams.ingest_tables import LoopTable
from memstream.streams.partition_task import MOVES, IllegalMove, PartitionTask, TaskState

pytestmark = pytest.mark.unit
TP = TopicPartition("in", 3)


def task(*, serving: bool = True) -> tuple[PartitionTask, LoopTable]:
    table = LoopTable("state-changelog")
    t = PartitionTask(3, epoch=1, tables=[table])
    if serving:
        t.move(TaskState.RESTORING)
        t.serve(Closing())
        t.offsets[TP] = 5
    return t, table


class Closing:
    """A processor that notes its close."""

    closed = False

    def close(self) -> None:
        self.closed = True


def rec(offset: int) -> SimpleNamespace:
    return SimpleNamespace(offset=offset)


@pytest.mark.parametrize("start", list(TaskState))
@pytest.mark.parametrize("to", list(TaskState))
def test_only_the_listed_moves_are_allowed(start, to):
    t, _ = task(serving=False)
    t.state = start
    if to in MOVES[start]:
        t.move(to)
        assert t.state is to
    else:
        with pytest.raises(IllegalMove):
            t.move(to)
        assert t.state is start


def test_a_task_hands_only_records_at_or_after_its_next_offset_and_only_when_serving():
    t, _ = task(serving=False)
    assert t.fresh(TP, [rec(5)]) == []  # taking: read again after its seek
    t, _ = task()
    assert [r.offset for r in t.fresh(TP, [rec(4), rec(5), rec(6)])] == [5, 6]
    assert t.fresh(TopicPartition("other", 3), [rec(9)]) == []  # not positioned there


def test_a_commit_moves_offsets_time_and_tables_and_a_discard_drops_the_pending():
    t, table = task()
    t.slices[0][b"u1"] = {"n": 1}
    assert t.dirty() and t.changelog() == [("state-changelog", b"u1", b'{"n":1}')]
    t.failed()
    t.committed({TP: 7}, newest_s=20.0)
    assert t.offsets[TP] == 7 and t.stream_time == 20.0 and t.failed_in_row == 0
    assert table.get(b"u1") == {"n": 1} and not t.dirty()
    t.committed({}, newest_s=10.0)  # a timer round, or an older record: time stays
    assert t.stream_time == 20.0
    t.slices[0][b"u2"] = {"n": 2}
    t.discard()
    assert table.get(b"u2") is None and not t.dirty()
    assert [t.failed() for _ in range(3)] == [1, 2, 3]


def test_letting_go_drops_its_slice_and_positions_and_returns_its_producer():
    t, table = task()
    producer = object()
    t.producer = producer
    t.slices[0][b"u1"] = {"n": 1}
    t.committed({TP: 6}, 1.0)
    processor = t.processor
    assert t.let_go(fenced_at=12.5) is producer
    assert processor.closed and t.processor is None
    assert t.gone and t.fenced_at == 12.5 and t.producer is None
    assert t.offsets == {} and table.get(b"u1") is None and t.stream_time is None
    assert t.fresh(TP, [rec(7)]) == []  # nothing of it is handled again
    assert t.let_go() is None  # (twice: nothing left)


def test_lag_counts_records_not_handled_and_a_marker_at_rest_is_none():
    t, _ = task()
    t.offsets[TP] = 10
    assert t.lags({TP: 11}) == {TP: 1}
    t.caught_up = {TP: 11}  # the last idle poll: read to the end, offset 10 a marker
    assert t.lags({TP: 11}) == {TP: 0}
    assert t.lags({TP: 14}) == {TP: 4}  # new records arrived
    assert t.lags({}) == {}
