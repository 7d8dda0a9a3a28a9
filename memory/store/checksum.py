"""A checksum per user of what a store holds, to prove a rebuilt store equals the live one.

Each record (version, hit statistics, cursor) of a user is written canonically (sorted keys,
no whitespace) with its point id; the user's digest is the SHA-256 of the sorted lines.
What may legitimately differ between a store written by the live path and one rebuilt from
the topics is left out: the fencing cursors and the change events kept with them
(bookkeeping, not memory: the live path also moves a user's cursor for a job that changed
nothing, which leaves no change event, and keeps what its job published), and,
when a rebuild re-embeds with another embedder, the vectors. Vectors otherwise count, as
float32: what Edge keeps, what change events carry (packed, since 2026-12-02) and what the
live path writes (``MemoryChange.vector`` holds float32 values); a store that keeps float64,
or a vector rebuilt from an older event's float64 list, reads back the same float32.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memstream.memory.archive import TURN_STATUS
from memstream.memory.store import BOOKKEEPING_STATUSES, Record

UserKey = tuple[str, str]


def _present(value: Any) -> Any:
    """A payload without its null fields: a store may keep ``"slot": null`` or drop it
    (Edge's payload merge does), which reads back the same."""
    if isinstance(value, dict):
        return {k: _present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_present(v) for v in value]
    return value


def canonical(point_id: str, payload: dict[str, Any], vector: list[float] | None) -> str:
    line = json.dumps([point_id, _present(payload)], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    if vector is not None:  # as float32, what a store keeps (read back as float64 or not)
        line += "|" + hashlib.sha256(array("f", vector).tobytes()).hexdigest()
    return line


@dataclass
class Digests:
    """user -> (records, digest) of one store."""

    users: dict[UserKey, tuple[int, str]] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(n for n, _ in self.users.values())

    def to_json(self) -> dict[str, Any]:
        return {f"{t}/{u}": [n, d] for (t, u), (n, d) in sorted(self.users.items())}


def digests(records: Iterable[Record], turns_since: float | None = None) -> Digests:
    """Per user, the count and hash of its records; ``turns_since``: archived turns said
    before it are left out (past ``archive_days``: no read returns them, and a store that
    has not swept them yet is not different for that)."""
    lines: dict[UserKey, list[str]] = defaultdict(list)
    for pid, payload, vector in records:
        if payload.get("status") in BOOKKEEPING_STATUSES:
            continue
        if (turns_since is not None and payload.get("status") == TURN_STATUS
                and float(payload.get("ts", 0.0)) < turns_since):
            continue
        key = (str(payload.get("tenant_id", "")), str(payload.get("user_id", "")))
        lines[key].append(canonical(pid, payload, vector))
    found = Digests()
    for key, user_lines in lines.items():
        h = hashlib.sha256()
        for line in sorted(user_lines):
            h.update(line.encode())
            h.update(b"\n")
        found.users[key] = (len(user_lines), h.hexdigest())
    return found


@dataclass(frozen=True)
class Verification:
    users: int  # compared
    equal: int
    differ: list[UserKey]  # in both, different records
    only_live: list[UserKey]
    only_rebuilt: list[UserKey]

    @property
    def ok(self) -> bool:
        return not (self.differ or self.only_live or self.only_rebuilt)

    def summary(self) -> str:
        if self.ok:
            return f"verified: {self.equal}/{self.users} users equal record for record"
        parts = [f"{len(self.differ)} differ", f"{len(self.only_live)} only live",
                 f"{len(self.only_rebuilt)} only rebuilt"]
        shown = [f"{t}/{u}" for t, u in (self.differ + self.only_live + self.only_rebuilt)[:5]]
        return (f"MISMATCH: {self.equal}/{self.users} users equal; {', '.join(parts)} "
                f"(e.g. {', '.join(shown)})")


def compare(live: Digests, rebuilt: Digests) -> Verification:
    keys = set(live.users) | set(rebuilt.users)
    differ = sorted(k for k in keys if k in live.users and k in rebuilt.users
                    and live.users[k] != rebuilt.users[k])
    only_live = sorted(k for k in keys if k not in rebuilt.users)
    only_rebuilt = sorted(k for k in keys if k not in live.users)
    equal = len(keys) - len(differ) - len(only_live) - len(only_rebuilt)
    return Verification(len(keys), equal, differ, only_live, only_rebuilt)
