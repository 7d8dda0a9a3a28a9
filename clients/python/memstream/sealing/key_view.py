"""A process's view of the user-keys topic: pure, no I/O (the follower that feeds it and
writes through it is the server's ``memstream.memory.crypto.user_keys``, a downstream
reader's ``memstream.consumer.reader_keys``; the records are :mod:`memstream.sealing.key_records`).

What a producer without the keys can do is bounded here: a record that does not parse,
unwrap or verify is set aside (``rejected``, a log line with its offset, and a dead letter
without its value), leaves no entry in the view (state is made only for what opened or
verified: a flood of forged records grows nothing but counters; a reader's keys under
tenant KEKs it lacks, which it cannot check, are bounded by ``LOCKED_MAX``) and the view
goes on; a forget marker is taken by a worker only by its master-derived ``msig``, by a
reader by its KEK-derived ``sig`` (:mod:`memstream.sealing.key_records`); a later
record of a key id replaces the earlier only if it unwraps to the same key; a marker that
does not verify is ignored; a tombstone is honoured only for a key id a verified marker
lists (:meth:`KeyView.repairs` writes the key back otherwise, so compaction cannot lose
it), and such an id is never taken again (shredded anew). Legacy data keys (wrapped before
tenant KEKs) keep the old rule, their tombstone honoured, until
``memstream keys rotate-master`` rewraps them. Unwrapped keys are kept by (tenant, user,
key id).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memstream.contract.exceptions import InvalidRecord, describe
from memstream.sealing import envelope as crypto
from memstream.sealing import key_records as rec
from memstream.sealing.key_records import FORGOTTEN, KEK, ROLL, Keyring

log = logging.getLogger("memstream.memory.crypto.user_keys")
_LOGGED = 50  # rejections logged at warning level; later ones at debug
LOCKED_MAX = 100_000  # a reader: keys under tenant KEKs it lacks (unverifiable) it keeps
Sent = tuple[str, bytes | None]  # a record to write: key, value (None: a tombstone)


def kek_record(ring: Keyring, tenant: str) -> tuple[str, bytes, Sent]:
    """A new tenant KEK wrapped under the current master version: (id, KEK, record)."""
    version = ring.version
    assert version is not None, "a new tenant key needs MEMSTREAM_MASTER_KEY"
    kek_id, kek = crypto.new_key_id(), crypto.new_kek()
    return kek_id, kek, rewrapped_kek(ring, tenant, kek_id, kek)


def rewrapped_kek(ring: Keyring, tenant: str, kek_id: str, kek: bytes) -> Sent:
    version = ring.version
    assert version is not None
    wrapped = crypto.wrap_kek(ring.wrapping[version], kek, tenant, kek_id, version)
    return f"{tenant}/{KEK}/{kek_id}", rec.dumps(rec.KekRecord(
        wrapped=wrapped, master=version, created_at=time.time()))


def data_key_record(kek_id: str, kek: bytes, data_key: bytes, tenant: str, user: str,
                    key_id: str) -> Sent:
    wrapped = crypto.wrap_under(kek, kek_id, data_key, tenant, user, key_id)
    return f"{tenant}/{user}/{key_id}", rec.dumps(rec.DataKeyRecord(
        wrapped=wrapped, kek=kek_id, created_at=time.time()))


@dataclass
class _Tenant:
    keks: dict[str, bytes] = field(default_factory=dict)  # kek id -> tenant KEK
    values: dict[str, bytes] = field(default_factory=dict)  # kek id -> its record's value
    versions: dict[str, int] = field(default_factory=dict)  # kek id -> master version
    held: set[str] = field(default_factory=set)  # tombstoned KEKs kept: written back


@dataclass
class _User:
    values: dict[str, bytes] = field(default_factory=dict)  # key id -> its record's value
    legacy: set[str] = field(default_factory=set)  # key ids wrapped by kek_from(master)
    locked: set[str] = field(default_factory=set)  # key ids under a KEK this view lacks
    forgotten_at: float | None = None
    marker: bytes | None = None  # the last verified marker's value
    shredded: set[str] = field(default_factory=set)  # ids verified markers list
    held: set[str] = field(default_factory=set)  # tombstoned, no marker: kept, written back
    reshred: set[str] = field(default_factory=set)  # shredded ids written again
    held_marker: bool = False


@dataclass
class Rotation:
    """What ``rotate-master`` writes, and how many of each."""

    records: list[Sent] = field(default_factory=list)
    keks: int = 0
    data_keys: int = 0
    new_keks: int = 0
    markers: int = 0  # forget markers signed again under the current version


def _tenant_of(key: bytes | None) -> tuple[str | None, bool]:
    """The tenant a record key names (None: malformed) and whether it is a KEK record."""
    try:
        tenant, user, _ = rec.parse_key(key)
    except InvalidRecord:
        return None, False
    return tenant, user == KEK


class KeyView:
    """Tenant KEKs, data keys and forget markers as the records so far say (later records
    win, within the rules of the module docstring)."""

    def __init__(self, ring: Keyring, topic: str,
                 on_reject: Callable[[InvalidRecord], object] | None = None) -> None:
        self._ring = ring
        self.topic = topic
        self._on_reject = on_reject
        self._tenants: dict[str, _Tenant] = {t: _Tenant(keks=dict(k))
                                             for t, k in ring.read.items()}
        self._users: dict[tuple[str, str], _User] = {}
        self._plain: dict[tuple[str, str, str], bytes] = {}  # (tenant, user, key id) -> key
        self._locked = 0  # key ids locked to this reader, all users
        self.rejected_kinds: dict[str, int] = {}  # records set aside, by InvalidRecord.kind
        self.settled = False  # the first read reached the end (settle)
        self._waiting: dict[str, list[tuple[bytes | None, bytes | None, Any]]] = {}
        self._unopened: dict[bytes | None, tuple[bytes | None, Any, InvalidRecord]] = {}

    def take(self, key: bytes | None, value: bytes | None, where: Any = None) -> bool:
        """One record of the topic into the view; False when it is set aside (counted,
        logged by offset, a dead letter without its value). Never raises.

        Until :meth:`settle` (the first read to the end), a record that does not open is
        not set aside yet: a later record may replace it (a rotation rewraps a tenant KEK
        after the records that depend on it) or bring the KEK it names. Its tenant's later
        records wait behind it, in order, and :meth:`settle` takes them."""
        first_read = not self.settled and key != ROLL.encode()
        tenant, is_kek = _tenant_of(key) if first_read else (None, False)
        if tenant is not None and not is_kek and tenant in self._waiting:
            self._waiting[tenant].append((key, value, where))
            return True
        try:
            self._apply(key, value)
            if is_kek:
                self._unopened.pop(key, None)
            return True
        except InvalidRecord as exc:
            if tenant is not None and exc.kind == "undecryptable":
                if is_kek:
                    self._unopened[key] = (value, where, exc)
                else:
                    self._waiting[tenant] = [(key, value, where)]
                return True
            self._reject(exc, key, value, where)
        except Exception as exc:  # a bug must not stop the view either
            self._reject(InvalidRecord("internal", type(exc).__name__), key, value, where)
        return False

    @property
    def rejected(self) -> int:
        """Records set aside: malformed, not unwrapping or not verifying."""
        return sum(self.rejected_kinds.values())

    def _keep(self, tenant: str, user: str, name: str) -> None:
        """A record that would end the good one of its key (a tombstone no verified forget
        explains, or a value set aside): compaction keeps the last record of a key, so a
        writer writes the good one back (:meth:`repairs`)."""
        if user == KEK:
            t = self._tenants.get(tenant)
            if t is not None and name in t.values:
                t.held.add(name)
            return
        u = self._users.get((tenant, user))
        if u is None:
            return
        if name == FORGOTTEN:
            u.held_marker = u.marker is not None
        elif name in u.values and name not in u.shredded:
            u.held.add(name)

    def settle(self) -> None:
        """The first read reached the end: take what waited, set aside what still does not
        open (unless a later record of its key replaced it)."""
        if self.settled:
            return
        self.settled = True
        for key, (value, where, exc) in self._unopened.items():
            self._reject(exc, key, value, where)
        self._unopened = {}
        waiting, self._waiting = self._waiting, {}
        for queue in waiting.values():
            last = {key: i for i, (key, _, _) in enumerate(queue)}
            for i, (key, value, where) in enumerate(queue):
                try:
                    self._apply(key, value)
                except InvalidRecord as exc:
                    if last[key] == i:  # else replaced by a later record of its key
                        self._reject(exc, key, value, where)
                except Exception as exc:
                    self._reject(InvalidRecord("internal", type(exc).__name__), key, value,
                                 where)

    def _reject(self, exc: InvalidRecord, key: bytes | None, value: bytes | None,
                where: Any) -> None:
        self.rejected_kinds[exc.kind] = self.rejected_kinds.get(exc.kind, 0) + 1
        offset = getattr(where, "offset", -1)
        name = (key or b"").rsplit(b"/", 1)[-1][:40].decode("ascii", "replace")
        log.log(logging.WARNING if self.rejected <= _LOGGED else logging.DEBUG,
                "user keys: set aside the record of key id %r at offset %d (%s)",
                name, offset, describe(exc))
        if self._on_reject is not None:
            self._on_reject(exc)
        self.set_aside(exc, key, value, where)
        with contextlib.suppress(InvalidRecord):  # a key that names no record: nothing kept
            self._keep(*rec.parse_key(key))

    def set_aside(self, exc: InvalidRecord, key: bytes | None, value: bytes | None,
                  where: Any) -> None:
        """A record set aside: a writer keeps its dead letter (the workers' view)."""

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key == ROLL.encode():
            return
        tenant, user, name = rec.parse_key(key)
        if not self._ring.covers(tenant):
            return  # another tenant's record (a reader): not this view's business
        if user == KEK:
            self._take_kek(tenant, name, value)
        elif name == FORGOTTEN:
            self._take_marker(tenant, user, value)
        else:
            self._take_data_key(tenant, user, name, value)

    def _take_kek(self, tenant: str, kek_id: str, value: bytes | None) -> None:
        if value is None:  # nothing deletes a tenant KEK: keep it, write it back
            self._keep(tenant, KEK, kek_id)
            return
        found = rec.kek_record(value)
        kek = self._ring.unwrap_kek(tenant, kek_id, found)
        if kek is None:
            return  # a reader: its KEKs come from its read key
        t = self._tenants.get(tenant)
        if t is not None and t.keks.get(kek_id, kek) != kek:
            raise InvalidRecord("undecryptable", "a tenant key id already holds another key")
        t = self._tenants.setdefault(tenant, _Tenant())  # state only for what opened
        t.keks[kek_id], t.values[kek_id], t.versions[kek_id] = kek, value, found.master
        t.held.discard(kek_id)

    def _take_marker(self, tenant: str, user: str, value: bytes | None) -> None:
        if value is None:  # a marker is never deleted: keep it, write it back
            self._keep(tenant, user, FORGOTTEN)
            return
        m = rec.marker(value)
        kek = self._tenants.get(tenant, _Tenant()).keks.get(m.kek or "")
        self._ring.marker_ok(tenant, user, m, kek)  # a worker: msig; a reader: sig
        u = self._users.setdefault((tenant, user), _User())  # state only once verified
        if u.marker is not None and not u.shredded <= set(m.keys):
            # an older marker (replayed, or signed again by a rotation that raced a forget):
            # markers list every key id shredded so far, so the newer one is written back
            u.held_marker = True
            return
        u.forgotten_at, u.marker, u.held_marker = m.at, value, False
        u.shredded.update(m.keys)
        for key_id in m.keys:
            self._drop(tenant, user, key_id)

    def _drop(self, tenant: str, user: str, key_id: str) -> None:
        u = self._users[(tenant, user)]
        u.values.pop(key_id, None)
        u.legacy.discard(key_id)
        if key_id in u.locked:
            self._locked -= 1
            u.locked.discard(key_id)
        u.held.discard(key_id)
        self._plain.pop((tenant, user, key_id), None)

    def _take_data_key(self, tenant: str, user: str, key_id: str, value: bytes | None) -> None:
        u = self._users.get((tenant, user))
        if value is None:
            if u is None:
                return  # nothing of the user here: nothing to drop or keep (no state)
            if key_id in u.shredded or key_id in u.legacy or key_id in u.locked:
                self._drop(tenant, user, key_id)  # a verified forget; a legacy key's rule
            else:  # no verified marker lists it: kept, written back
                self._keep(tenant, user, key_id)
            return
        found = rec.data_key_record(value)
        if u is not None and key_id in u.shredded:
            u.reshred.add(key_id)  # written again after a verified forget: shred it anew
            return
        kek = self._tenants.get(tenant, _Tenant()).keks.get(found.kek or "")
        if kek is None and not self._ring.master:  # a reader: a legacy key, or under a
            if self._locked >= LOCKED_MAX:  # tenant KEK made after its read key: it
                raise InvalidRecord("undecryptable", "too many keys under tenant keys this "
                                    "reader lacks")  # cannot tell forged ones: bounded
            u = self._users.setdefault((tenant, user), _User())
            self._locked += key_id not in u.locked
            u.values[key_id] = value
            u.locked.add(key_id)
            return
        if found.kek is None:
            data_key = self._ring.unwrap_legacy(found.wrapped, tenant, user, key_id)
        else:
            if kek is None:
                raise InvalidRecord("undecryptable", "data key under an unknown tenant key")
            data_key = crypto.unwrap_under(kek, found.kek, found.wrapped, tenant, user, key_id)
        if self._plain.get((tenant, user, key_id), data_key) != data_key:
            raise InvalidRecord("undecryptable", "a key id already holds another data key")
        u = self._users.setdefault((tenant, user), _User())  # state only for what opened
        if key_id in u.locked:
            self._locked -= 1
        self._plain[(tenant, user, key_id)] = data_key
        u.values[key_id] = value
        u.held.discard(key_id)
        u.locked.discard(key_id)
        (u.legacy.add if found.kek is None else u.legacy.discard)(key_id)

    def repairs(self) -> list[Sent]:
        """What a writer writes once the topic is read: kept keys (and KEKs, markers) whose
        tombstone no verified forget explains, written back; keys written again after a
        verified forget, shredded anew. Cleared once returned."""
        out: list[Sent] = []
        for tenant, t in self._tenants.items():
            out += [(f"{tenant}/{KEK}/{k}", t.values[k]) for k in sorted(t.held)]
            t.held.clear()
        for (tenant, user), u in self._users.items():
            if not (u.held or u.reshred or u.held_marker):
                continue
            out += [(f"{tenant}/{user}/{k}", u.values[k]) for k in sorted(u.held)]
            out += [(f"{tenant}/{user}/{k}", None) for k in sorted(u.reshred)]
            if u.held_marker and u.marker is not None:
                out.append((f"{tenant}/{user}/{FORGOTTEN}", u.marker))
            u.held.clear()
            u.reshred.clear()
            u.held_marker = False
        return out

    # --- use ---------------------------------------------------------------------------

    def opens(self, tenant: str) -> bool:
        """This view can open the tenant's events (the master key, or its read key)."""
        return self._ring.covers(tenant)

    def locked(self, tenant: str, user: str, key_id: str) -> bool:
        """The key is on the topic under a tenant KEK this reader's read key lacks."""
        u = self._users.get((tenant, user))
        return u is not None and key_id in u.locked

    def forgotten_at(self, tenant: str, user: str) -> float | None:
        u = self._users.get((tenant, user))
        return u.forgotten_at if u else None

    def keys_of(self, tenant: str, user: str) -> dict[str, bytes]:
        """The user's data keys this view holds (unwrapped and verified as they came)."""
        u = self._users.get((tenant, user))
        if u is None:
            return {}
        return {k: self._plain[(tenant, user, k)] for k in u.values
                if (tenant, user, k) in self._plain}

    def key_ids(self, tenant: str, user: str) -> set[str]:
        """Every key id of the user on the topic (held, or locked to this reader)."""
        u = self._users.get((tenant, user))
        return set(u.values) if u else set()

    def shredded(self, tenant: str, user: str) -> set[str]:
        """The key ids verified forget markers of the user list."""
        u = self._users.get((tenant, user))
        return set(u.shredded) if u else set()

    def keks_of(self, tenant: str) -> dict[str, bytes]:
        t = self._tenants.get(tenant)
        return dict(t.keks) if t else {}

    def rotation(self) -> Rotation:
        """The records that move this view under the current master version: tenant KEKs
        rewrapped, legacy data keys wrapped under their tenant's KEK (one made where the
        tenant has none), verified forget markers signed again under it (``msig``: those
        of an older version, and those of before ``msig`` this view took, with
        ``forget_markers_legacy``). Unsigned (legacy) forget markers are not signed: any
        producer could have written one, and a signature would make its fence real."""
        version = self._ring.version
        assert version is not None, "rotating needs MEMSTREAM_MASTER_KEY"
        out = Rotation()
        for tenant, t in sorted(self._tenants.items()):
            for kek_id in sorted(k for k, v in t.versions.items() if v != version):
                out.records.append(rewrapped_kek(self._ring, tenant, kek_id, t.keks[kek_id]))
                out.keks += 1
        made: dict[str, tuple[str, bytes]] = {}
        for (tenant, user), u in sorted(self._users.items()):
            if not u.legacy:
                continue
            if tenant not in made:
                made[tenant] = self._rotation_kek(tenant, out)
            kek_id, kek = made[tenant]
            for key_id in sorted(u.legacy):
                out.records.append(data_key_record(kek_id, kek, self._plain[
                    (tenant, user, key_id)], tenant, user, key_id))
                out.data_keys += 1
        out.records += self._resigned_markers(out)
        return out

    def _resigned_markers(self, out: Rotation) -> list[Sent]:
        version, signing = self._ring.marker_key()
        records: list[Sent] = []
        for (tenant, user), u in sorted(self._users.items()):
            if u.marker is None:
                continue
            m = rec.marker(u.marker)
            kek = self.keks_of(tenant).get(m.kek or "")
            if (m.msig is not None and m.master == version) or kek is None:
                continue
            again = rec.resigned(m, kek, tenant, user, (version, signing))
            records.append((f"{tenant}/{user}/{FORGOTTEN}", rec.dumps(again)))
            out.markers += 1
        return records

    def _rotation_kek(self, tenant: str, out: Rotation) -> tuple[str, bytes]:
        keks = self.keks_of(tenant)
        if keks:
            return min(keks.items())
        kek_id, kek, record = kek_record(self._ring, tenant)
        out.records.append(record)
        out.new_keks += 1
        return kek_id, kek
