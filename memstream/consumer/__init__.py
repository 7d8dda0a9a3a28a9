"""Reading memory changes downstream: the public, versioned memory events
(``<prefix>.memory-events``; the contract is ``docs/consuming.md``).

    from memstream.consumer import MemoryChanges
    from memstream.core.settings import Settings

    async with MemoryChanges(Settings(), group_id="crm-sync") as changes:
        async for change in changes:          # committed after your handler returned
            if change.op == "erase":
                forget_user(change.tenant_id, change.user_id)
            elif change.readable:
                upsert(change.memory_id, change.version, change.after)
"""

from memstream.consumer.changes import MemoryChanges, Received, Stats
from memstream.consumer.opening import ContentUnavailable
from memstream.consumer.sync import MemoryChangesSync
from memstream.contract.events import EventLineage, MemoryEvent, MemoryState

__all__ = ["ContentUnavailable", "EventLineage", "MemoryChanges", "MemoryChangesSync",
           "MemoryEvent", "MemoryState", "Received", "Stats"]
