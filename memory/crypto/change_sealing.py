"""Sealing change events (``<prefix>.memory-changes``) with the user's data key: the
content (before / after / records / vector / reason) travels sealed; ids, versions, op
and lineage stay readable (:mod:`memstream.sealing.envelope`: the blobs, the keys, the
public events' sealing). And the opener the workers' readers use, for change events and
public events alike. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from memstream.contract.events import MemoryEvent
from memstream.sealing import envelope as crypto
from memstream.sealing.key_view import KeyView
from memstream.topics.schemas import MemoryChange, Vector

# what sealing moves into the blob, and the values those fields are left with
SEALED_FIELDS: dict[str, Any] = {"before": None, "after": {}, "records": [], "vector": None,
                                 "reason": ""}


def _aad(change: MemoryChange) -> str:
    return f"change\x1f{change.tenant_id}\x1f{change.user_id}\x1f{change.change_id}"


def seal_change(change: MemoryChange, key_id: str, data_key: bytes) -> MemoryChange:
    """The change with its content sealed (``sealed`` = "v1:<key id>:<nonce+ciphertext>")."""
    return crypto.sealed(change, key_id, data_key, _aad(change), SEALED_FIELDS)


def open_change(change: MemoryChange, keys: Mapping[str, bytes]) -> MemoryChange | None:
    """The change with its content back; unsealed ones as they are; None when its data key
    is gone (the user was forgotten)."""
    return crypto.opened(change, keys, _aad(change), _Content)


def opener(view: KeyView) -> Callable[[Any], Any]:
    """For readers: change (or public event) -> opened, or None when its key is gone."""
    def open_one(change: Any) -> Any:
        keys = view.keys_of(change.tenant_id, change.user_id)
        if isinstance(change, MemoryEvent):
            return crypto.open_event(change, keys)
        return open_change(change, keys)
    return open_one


class _Content(BaseModel):
    """The sealed part of a change event (parsed by pydantic-core: vectors are long)."""

    before: dict[str, Any] | None = None
    after: dict[str, Any]
    records: list[dict[str, Any]]
    vector: Vector = None
    reason: str = ""
