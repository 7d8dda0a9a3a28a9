"""One partition of one stage, as a loop holds it (Kafka Streams' ``StreamTask``).

A :class:`PartitionTask` owns what the loop keeps of partition *p*: its transactional
producer, the next offset to handle of each input, the time of the newest record it
handled, its failed transactions in a row, what the last idle poll found read to the end,
its slice of the stage's tables (:class:`~streams.ingest_tables.TableSlice`: its pending
writes are its own), the stage's processor of it (:class:`~streams.stage.Processor`: made
when it starts serving, closed when it is let go), and its state:

- ``TAKING``: its producer is being started (``init_transactions`` fences the previous
  owner); nothing of it is read.
- ``RESTORING``: its tables and the stage's state (a store shard) are being restored.
- ``SERVING``: positioned at its committed offsets; its records are handled.
- ``LETTING_GO``: given up (revoked, or fenced by another worker's producer): its
  producer is closed and its table slice dropped; nothing of it is handled again. A
  fenced task stays in the loop's map with the time it was fenced, so that a partition
  no rebalance takes away is taken again (:mod:`streams.task_manager`).

Only the moves of :data:`MOVES` are allowed; any other raises (a loop that would serve a
partition it let go is a bug, not a state). Everything here is plain: no Kafka call, no
clock; the loop and the task manager do those and tell the task.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from aiokafka.structs import TopicPartition

from memstream.streams.ingest_tables import LoopTable, TableSlice


class TaskState(enum.Enum):
    TAKING = "taking"
    RESTORING = "restoring"
    SERVING = "serving"
    LETTING_GO = "letting go"


MOVES: dict[TaskState, frozenset[TaskState]] = {
    TaskState.TAKING: frozenset({TaskState.RESTORING, TaskState.LETTING_GO}),
    TaskState.RESTORING: frozenset({TaskState.SERVING, TaskState.LETTING_GO}),
    TaskState.SERVING: frozenset({TaskState.LETTING_GO}),
    TaskState.LETTING_GO: frozenset(),
}


class IllegalMove(RuntimeError):
    """A task asked to move where its state does not lead."""


class PartitionTask:
    """See the module docstring. ``epoch``: how many tasks of this partition the loop made
    before this one (a take that finds another epoch in the map was given up meanwhile)."""

    def __init__(self, partition: int, epoch: int, tables: Sequence[LoopTable] = ()) -> None:
        self.partition = partition
        self.epoch = epoch
        self.tables = tuple(tables)  # the stage's (restored for it from their changelogs)
        self.slices: tuple[TableSlice, ...] = tuple(t.slice(partition) for t in tables)
        self.processor: Any = None  # the stage's processor of it, while it serves
        self.state = TaskState.TAKING
        self.producer: Any = None  # installed once the take is done
        self.offsets: dict[TopicPartition, int] = {}  # input -> the next offset to handle
        self.stream_time: float | None = None  # the newest record time (s) it handled
        self.failed_in_row = 0
        self.caught_up: dict[TopicPartition, int] = {}  # read to this highwater, when idle
        self.fenced_at: float | None = None  # (monotonic) set when another worker fenced it

    def __repr__(self) -> str:
        return f"PartitionTask({self.partition}, epoch={self.epoch}, {self.state.value})"

    # --- state ---------------------------------------------------------------------------

    def move(self, to: TaskState) -> None:
        if to not in MOVES[self.state]:
            raise IllegalMove(f"partition {self.partition}: {self.state.value} -> {to.value}")
        self.state = to

    @property
    def serving(self) -> bool:
        return self.state is TaskState.SERVING

    @property
    def being_taken(self) -> bool:
        return self.state in (TaskState.TAKING, TaskState.RESTORING)

    @property
    def gone(self) -> bool:
        return self.state is TaskState.LETTING_GO

    def serve(self, processor: Any) -> None:
        """Taken: positioned, its processor opened; its records are handled from now."""
        self.move(TaskState.SERVING)
        self.processor = processor

    def let_go(self, fenced_at: float | None = None) -> Any:
        """Given up: its processor closed, its table slice dropped and its positions
        forgotten; returns the producer to close (None: it had none)."""
        if not self.gone:
            self.move(TaskState.LETTING_GO)
        processor, self.processor = self.processor, None
        if processor is not None:
            processor.close()
        self.fenced_at = fenced_at
        self.forget()
        producer, self.producer = self.producer, None
        return producer

    def forget(self) -> None:
        """Its table slice dropped and its positions forgotten (given up, or a take's
        failed attempt)."""
        for piece in self.slices:
            piece.discard()
        for table in self.tables:
            table.drop({self.partition})
        self.offsets.clear()
        self.caught_up.clear()
        self.stream_time = None

    # --- records -------------------------------------------------------------------------

    def fresh(self, tp: TopicPartition, records: list[Any]) -> list[Any]:
        """The records of ``tp`` not handled yet (none unless it serves and is positioned:
        those fetched before are read again after its seek)."""
        if not self.serving or tp not in self.offsets:
            return []
        first = self.offsets[tp]
        return [r for r in records if r.offset >= first]

    def committed(self, offsets: dict[TopicPartition, int], newest_s: float | None) -> None:
        """A transaction of it committed: its table writes are the tables' own, its
        inputs handled up to ``offsets``, its time at least ``newest_s``."""
        for piece in self.slices:
            piece.commit()
        self.offsets.update(offsets)
        if newest_s is not None:
            self.stream_time = max(self.stream_time or 0.0, newest_s)
        self.failed_in_row = 0

    def discard(self) -> None:
        """A transaction of it was not committed: its pending table writes go."""
        for piece in self.slices:
            piece.discard()

    def failed(self) -> int:
        """A transaction failed; returns how many have in a row."""
        self.failed_in_row += 1
        return self.failed_in_row

    def dirty(self) -> bool:
        """Whether it has table writes not committed yet."""
        return any(piece.dirty() for piece in self.slices)

    def changelog(self) -> list[tuple[str, bytes, bytes | None]]:
        """Its pending table writes as (changelog topic, key, value)."""
        return [(piece.topic, key, value) for piece in self.slices
                for key, value in piece.changelog()]

    def inputs(self) -> list[TopicPartition]:
        return sorted(self.offsets)

    def lags(self, highwater: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Input -> records not handled yet (0 where the last idle poll found the position
        at the highwater and none arrived since: a transaction marker is no record)."""
        found: dict[TopicPartition, int] = {}
        for tp, offset in self.offsets.items():
            high = highwater.get(tp)
            if high is not None:
                idle = self.caught_up.get(tp) == high
                found[tp] = 0 if idle else max(0, high - offset)
        return found
