"""Opening sealed public events for a downstream reader (forget-me, SPEC §7).

With ``MEMSTREAM_MASTER_KEY`` the workers seal each event's ``before``, ``after`` and
``reason`` with the user's data key. A reader follows the user-keys topic (read-only) and
opens them with tenant read keys (``MEMSTREAM_READ_KEYS``, from ``memstream keys create
--tenant T --read-events``: the events of those tenants only; another tenant's stay
sealed, content "sealed") or with the workers' master key (every tenant). One without
either gets the ids only and is told so once, clearly; a forgotten user's events no longer
open (their keys are shredded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from memstream.consumer.reader_keys import ReaderKeys
from memstream.contract.events import MemoryEvent
from memstream.contract.exceptions import MemstreamError
from memstream.sealing import envelope as crypto

log = logging.getLogger(__name__)
Content = Literal["plain", "opened", "sealed", "shredded"]
KEY_WAIT_S = 30.0  # a key is on its topic before any event sealed with it: a lagging view


class ContentUnavailable(MemstreamError):
    """A sealed event this process cannot open: no key at all (``require_content``), not
    the workers' master key, or the user's key not on the key topic. The event is not
    passed: the reader gives it again on the next call."""


class Opener:
    """Opens events with the user keys a master key or read keys unwrap
    (:class:`ReaderKeys`); ``settings``: the server's ``Settings`` or any object with
    ``master_key`` / ``read_keys`` (and the Kafka connection's fields)."""

    def __init__(self, settings: object, keys_topic: str, *, require_content: bool) -> None:
        self._settings = settings
        self._topic = keys_topic
        self._require = require_content
        self._keys: ReaderKeys | None = None
        self._warned = False
        self._foreign: set[str] = set()  # tenants told about: no read key here

    async def start(self) -> None:
        if getattr(self._settings, "master_key", None) is None and \
                getattr(self._settings, "read_keys", None) is None:
            return
        self._keys = ReaderKeys(self._settings, self._topic)
        await self._keys.start()

    async def stop(self) -> None:
        if self._keys is not None:
            await self._keys.stop()
            self._keys = None

    async def open(self, event: MemoryEvent) -> tuple[MemoryEvent, Content]:
        """The event with its content, and what became of it."""
        if event.sealed is None:
            return event, "plain"
        if self._keys is None:
            return self._without_key(event), "sealed"
        keys = self._keys
        if not keys.ready and not await keys.wait_ready(60.0):
            raise TimeoutError("the user-keys topic could not be read to its end")
        key_id = crypto.sealed_key_id(event)
        if not keys.opens(event.tenant_id):
            return self._foreign_tenant(event), "sealed"  # never an error: not ours
        if self._forgotten_before(event):
            return event, "shredded"  # its key went with the forget-me request
        deadline = time.monotonic() + KEY_WAIT_S
        keys_now = keys.keys_of(event.tenant_id, event.user_id)
        while key_id not in keys_now:
            if key_id is not None and keys.locked(event.tenant_id, event.user_id, key_id):
                return self._foreign_tenant(event), "sealed"  # under a KEK it lacks
            if time.monotonic() > deadline:  # never "shredded" by guess: content not lost
                hint = (f"; {keys.rejected} record(s) of it did not unwrap or verify here: "
                        "is MEMSTREAM_MASTER_KEY (or the read key) the workers' own?"
                        if keys.rejected else " (is the key topic readable?)")
                raise ContentUnavailable(
                    f"key {key_id} of {event.tenant_id}/{event.user_id} is not on the "
                    f"user-keys topic after {KEY_WAIT_S:.0f}s and the user was not "
                    f"forgotten{hint}")
            await asyncio.sleep(0.1)  # a key is on its topic before its first sealed event
            keys_now = keys.keys_of(event.tenant_id, event.user_id)
        opened = crypto.open_event(event, keys_now)
        return (event, "shredded") if opened is None else (opened, "opened")

    def _forgotten_before(self, event: MemoryEvent) -> bool:
        """The user asked to be forgotten after this event: its key is shredded. (An event
        decided later belongs to a user who came back, with a new key.)"""
        assert self._keys is not None
        at = self._keys.forgotten_at(event.tenant_id, event.user_id)
        return at is not None and event.decided_at.timestamp() <= at

    def _foreign_tenant(self, event: MemoryEvent) -> MemoryEvent:
        if event.tenant_id not in self._foreign and len(self._foreign) < 1000:
            self._foreign.add(event.tenant_id)
            log.warning("events of tenant %s stay sealed: no read key here opens them "
                        "(MEMSTREAM_READ_KEYS; a read key made before the tenant's newest "
                        "key: make a new one)", event.tenant_id)
        return event

    def _without_key(self, event: MemoryEvent) -> MemoryEvent:
        why = ("memory events are sealed (the workers have MEMSTREAM_MASTER_KEY) and this "
               "process has no master key and no read key (MEMSTREAM_READ_KEYS): before, "
               "after and reason stay sealed")
        if self._require:
            raise ContentUnavailable(why)
        if not self._warned:
            log.warning("%s (content='sealed' on each such event)", why)
            self._warned = True
        return event
