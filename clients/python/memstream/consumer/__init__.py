"""Reading memory changes downstream: the public, versioned memory events
(``<prefix>.memory-events``; the contract is ``docs/consuming.md``).

    from memstream.consumer import ConsumerSettings, MemoryChanges

    async with MemoryChanges(ConsumerSettings.from_env(), group_id="crm-sync") as changes:
        async for change in changes:          # committed after your handler returned
            if change.op == "erase":
                forget_user(change.tenant_id, change.user_id)
            elif change.readable:
                upsert(change.memory_id, change.version, change.after)

It is part of the client distribution (``pip install 'memstream-client[kafka]'``); the
server's ``Settings`` is accepted wherever :class:`ConsumerSettings` is.
"""

from memstream.consumer.changes import MemoryChanges, Received, Stats
from memstream.consumer.opening import ContentUnavailable
from memstream.consumer.reader_settings import ConsumerSettings
from memstream.consumer.sync import MemoryChangesSync
from memstream.contract.events import EventLineage, MemoryEvent, MemoryState

__all__ = ["ConsumerSettings", "ContentUnavailable", "EventLineage", "MemoryChanges",
           "MemoryChangesSync", "MemoryEvent", "MemoryState", "Received", "Stats"]
