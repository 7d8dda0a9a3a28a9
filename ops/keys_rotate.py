"""``memstream keys rotate-master`` and ``memstream keys create --read-events``: the master
key's side of the user-keys topic (:mod:`memstream.memory.crypto.user_keys`).

Rotating the master key, while the workers run:

1. give every worker the new master (``MEMSTREAM_MASTER_KEY``, ``_VERSION=N``) and the old
   one in ``MEMSTREAM_MASTER_KEY_PREVIOUS`` ("<old version>:<old key>"), restart them one by
   one: new tenant KEKs are wrapped under N, the old ones still unwrap;
2. run ``memstream keys rotate-master`` with the same settings: it reads the topic to its
   end and writes every tenant KEK not under N again, wrapped under N (the same KEK, so
   data keys, sealed events and read keys stay as they are), wraps every legacy data key
   under its tenant's KEK and signs every forget marker not under N again under N (the
   workers' marker key is derived from the master key, so a marker of the old version
   must be signed again before step 4, as the KEKs are rewrapped; legacy unsigned forget
   markers stay unsigned: anyone could have written one; markers signed with the tenant
   key only, of before marker keys, are signed again only with
   ``MEMSTREAM_FORGET_MARKERS_LEGACY=true``, the upgrade's setting);
3. it reports the counts and fails when a record did not open (a master version missing
   from the settings): dropping the old version then would lose those tenants;
4. once it reports no failure, remove ``MEMSTREAM_MASTER_KEY_PREVIOUS`` from the workers
   and the readers that hold the master, and restart them;
5. destroy the old master key.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.core.errors import ConfigError
from memstream.core.settings import Settings
from memstream.memory.crypto.user_keys import UserKeys
from memstream.sealing import key_records as rec
from memstream.topics.layout import create_topics
from memstream.topics.registry import registry
from memstream.topics.schemas import ID_PATTERN


@dataclass
class RotateReport:
    version: int
    keks: int  # tenant KEKs rewrapped under the new version
    data_keys: int  # legacy data keys wrapped under their tenant's KEK
    new_keks: int  # tenant KEKs made for tenants that had only legacy keys
    markers: int  # forget markers signed again under the new version
    unopened: int  # records that did not open with these settings (not rotated)
    rejected: dict[str, int]  # every record set aside, by kind (unsigned: legacy markers)

    @property
    def complete(self) -> bool:
        return self.unopened == 0


def _master(settings: Settings, what: str) -> None:
    if settings.master_key is None or not settings.master_key.get_secret_value():
        raise ConfigError(f"{what} needs the master key: set MEMSTREAM_MASTER_KEY (and "
                          "MEMSTREAM_MASTER_KEY_VERSION) as the workers have them")


async def rotate_master(settings: Settings) -> RotateReport:
    """Move every tenant KEK (and legacy record) of the topic under the current version."""
    _master(settings, "rotating the master key")
    rec.Keyring.of(settings)
    keys = UserKeys(settings, registry(settings).user_keys.name)
    try:
        await keys.load(write=True)
        plan = keys.rotation()
        await keys.write(plan.records)
    finally:
        await keys.stop()
    kinds = dict(keys.rejected_kinds)
    return RotateReport(settings.master_key_version, plan.keks, plan.data_keys,
                        plan.new_keks, plan.markers, kinds.get("undecryptable", 0), kinds)


async def read_key(settings: Settings, tenant: str) -> tuple[str, list[str]]:
    """The read key of ``tenant`` (its KEKs; one is made if it has none) and the KEK ids."""
    _master(settings, "a read key")
    if not ID_PATTERN.fullmatch(tenant):
        raise ConfigError(f"{tenant!r} is not a tenant id")
    rec.Keyring.of(settings)  # a bad master setting: a ConfigError before the broker
    spec = registry(settings).user_keys
    await create_topics(settings, [spec])
    keys = UserKeys(settings, spec.name)
    try:
        await keys.load(write=True)
        await keys.tenant_kek(tenant)
    finally:
        await keys.stop()
    again = UserKeys(settings, spec.name)  # a KEK a worker made meanwhile is in it too
    await again.load()
    keks = again.keks_of(tenant)
    return rec.encode_read_key(tenant, keks), sorted(keks)
