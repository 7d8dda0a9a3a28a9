"""Offsets are committed only after what their records produced is in Kafka.

faust-streaming 0.15 under ``processing_guarantee="exactly_once"`` commits consumed offsets
through per-partition transactional producers, but every record an agent sends (jobs,
decisions, change events, results, table changelog writes) goes through the app's plain
producer and its send buffer, outside those transactions, and the transactional commit does
not flush that producer first (the at-least-once path does: ``Consumer._commit_offsets``).
So a worker SIGKILLed right after a commit loses outputs whose inputs count as processed: a
job whose result never arrives, change events missing from the topic that rebuilds the store.

The fix keeps Faust's transactional offset commits and adds the flush the at-least-once path
already has: every output of an acknowledged record is delivered before its offset commits.
Together with the fencing of :mod:`memstream.memory.fencing` (which makes re-processing
harmless) both guarantees give the same result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faust.transport.consumer import TransactionManager

_PATCHED = "_memstream_flushes_before_commit"


def flush_before_transactional_commit() -> None:
    """Patch ``TransactionManager.commit`` once (idempotent) to flush the producer first."""
    if getattr(TransactionManager, _PATCHED, False):
        return
    original = TransactionManager.commit

    async def commit(self: Any, offsets: Mapping[Any, int],
                     start_new_transaction: bool = True) -> bool:
        await self.app.producer.flush()
        result: bool = await original(self, offsets, start_new_transaction=start_new_transaction)
        return result

    TransactionManager.commit = commit  # type: ignore[method-assign]
    setattr(TransactionManager, _PATCHED, True)
