"""``memstream forget verify``: is a forgotten user's content gone from everything memstream
keeps? (SPEC §7; the README states the bound.)

It scans every record physically in every topic memstream owns (aborted transactions
included: they stay in the log until retention or compaction removes them) for the given
plaintext needles (canaries), counts the memory-change and memory-event records of the
user that still open (plain content, or sealed with a data key that still exists), and
asks the store how many records of the user it holds besides the fencing cursor (through
the worker's admin residue view when a worker serves it, else by opening the store: the
worker must not be running on an embedded store then). Nothing it finds is printed: only
where and how many.
"""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from memstream.contract.events import MemoryEvent
from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, end_offsets, read_range
from memstream.topics.registry import all_topic_names, registry
from memstream.topics.schemas import MemoryChange

READ_TIMEOUT_S = 60.0


@dataclass
class Residues:
    store_records: int | None = None  # None: the store could not be asked
    topics: dict[str, int] = field(default_factory=dict)  # topic -> records with a needle
    readable_changes: int = 0  # change and public events of the user whose content opens
    scanned: int = 0

    @property
    def total(self) -> int:
        return (self.store_records or 0) + sum(self.topics.values()) + self.readable_changes

    def rows(self) -> list[tuple[str, str]]:
        out = [("store: records of the user (besides the cursor)",
                "?" if self.store_records is None else str(self.store_records)),
               ("memory-change and memory-event records of the user that still open",
                str(self.readable_changes))]
        out += [(f"topic {name}: records holding a canary", str(n))
                for name, n in sorted(self.topics.items())]
        out.append(("records scanned", str(self.scanned)))
        return out


async def _scan(settings: Settings, tenant: str, user: str, needles: list[bytes],
                residues: Residues) -> None:
    topics = registry(settings)
    models: dict[str, type[MemoryChange] | type[MemoryEvent]] = {
        topics.memory_changes.name: MemoryChange, topics.memory_events.name: MemoryEvent}
    opener = None
    if settings.master_key is not None:
        from memstream.memory.crypto.user_keys import UserKeys

        keys = UserKeys(settings, registry(settings).user_keys.name)
        await keys.start(write=False)  # looks, never writes
        if not await keys.wait_ready(30.0):
            await keys.stop()
            raise TimeoutError("the user-keys topic could not be read: cannot tell what opens")
        opener = keys.opener()
    def scan(topic: str, records: list[Record]) -> None:
        for r in records:
            residues.scanned += 1
            raw = (r.key or b"") + b"\x00" + (r.value or b"")
            if any(n in raw for n in needles):
                residues.topics[topic] = residues.topics.get(topic, 0) + 1
            if topic in models and r.value:
                residues.readable_changes += _still_opens(models[topic], r.value, tenant, user,
                                                          opener)

    try:
        names = all_topic_names(settings)
        ends = await end_offsets(settings, names)
        for topic in names:
            await read_range(settings, topic, ends[topic], functools.partial(scan, topic),
                             idle_timeout_s=READ_TIMEOUT_S, committed=False)
    finally:
        if opener is not None:
            await keys.stop()


def _still_opens(model: type[MemoryChange] | type[MemoryEvent], value: bytes, tenant: str,
                user: str, opener: Any) -> int:
    try:
        change = model.model_validate_json(value)
    except ValueError:
        return 0
    if (change.tenant_id, change.user_id) != (tenant, user) or change.op == "erase":
        return 0
    opened = opener(change) if (change.sealed and opener is not None) else (
        None if change.sealed else change)
    return 0 if opened is None else 1


def _store_records(settings: Settings, tenant: str, user: str) -> int | None:
    if settings.admin_key is not None:
        url = (f"http://127.0.0.1:{settings.web_port}/v1/tenants/{tenant}/users/{user}"
               "/residue")
        req = urllib.request.Request(url, headers={
            "X-API-Key": settings.admin_key.get_secret_value()})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(json.loads(resp.read())["store_records"])
        except OSError:
            pass  # no worker serving: open the store
    try:
        from memstream.memory.services import build_embedder, build_store
        from memstream.memory.store import Scope, StoreError, held_records

        store = build_store(settings, build_embedder(settings).dim, offline=True)
    except Exception:
        return None
    try:
        return held_records(store, Scope(tenant, user))
    except StoreError:  # store_partitioned: the shards live with the workers that own them
        return None
    finally:
        store.close()


def verify(settings: Settings, tenant: str, user: str, needles: list[str]) -> Residues:
    residues = Residues(store_records=_store_records(settings, tenant, user))
    asyncio.run(_scan(settings, tenant, user, [n.encode() for n in needles if n], residues))
    return residues
