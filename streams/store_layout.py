"""Which embedded-store layout a worker runs, and the refusals that keep it one.

Two layouts of the embedded store (Qdrant Edge):

- **partitioned** (the default): one shard per partition under ``data_dir/store/<p>``,
  restored from the memory-change topic when the partition arrives, standbys on other
  workers. Any number of workers.
- **single** (``MEMSTREAM_STORE_PARTITIONED=false``): one store under ``data_dir`` (the
  path ``store.current`` names, else ``data_dir/qdrant``), switchable to a rebuilt one
  (``memstream rebuild --swap``). It holds the memories of whatever partitions its worker
  owns, so it is for **one** worker: two workers on it would each answer from a store that
  holds a part of the users.

Refused in one line that names the setting (exit 78): at start, a data dir that holds the
other layout's store (nothing is deleted for the operator: the memory-change topic holds
every memory, so the fix is to remove that copy, or to switch the setting back); at the
first map its groups hand it, a single-layout worker that shares them with another worker
(:func:`streams.cluster.must_leave`: the newer of two single-layout workers leaves, a
single-layout worker beside a partitioned one always), before it takes a partition.
"""

from __future__ import annotations

from pathlib import Path

from memstream.core.settings import Settings

SINGLE_SETTING = "MEMSTREAM_STORE_PARTITIONED"
EXIT_SHARED = 78  # EX_CONFIG: a setting, not a fault; a restart alone does not help


def single_layout(settings: Settings) -> bool:
    """The embedded store in one piece (one worker only)."""
    return settings.store == "edge" and not settings.store_partitioned


def _single_store_files(settings: Settings) -> list[Path]:
    found = [p for p in (settings.data_dir / "qdrant", settings.data_dir / "store.current")
             if p.exists()]
    return found


def _shard_files(settings: Settings) -> list[Path]:
    root = settings.data_dir / "store"
    return sorted(root.iterdir()) if root.is_dir() else []


def data_dir_conflict(settings: Settings) -> str | None:
    """One line when ``data_dir`` holds the store of the layout this worker does not run."""
    if settings.store != "edge":
        return None
    if settings.store_partitioned:
        stale = _single_store_files(settings)
        if stale:
            return (f"{settings.data_dir} holds a store of the single-store layout "
                    f"({', '.join(p.name for p in stale)}) but this worker runs the "
                    f"partitioned one ({SINGLE_SETTING}=true, the default): its shards are "
                    f"restored from the memory-change topic, and a second copy there would "
                    f"be out of reach of forget-me. Remove {', '.join(map(str, stale))} (the "
                    f"topic holds every memory), or set {SINGLE_SETTING}=false to keep "
                    f"running it with one worker")
        beyond = sorted(int(p.name) for p in _shard_files(settings)
                        if p.name.isdigit() and int(p.name) >= settings.partitions)
        if beyond:
            return (f"{settings.data_dir / 'store'} holds shards of partitions "
                    f"{', '.join(map(str, beyond))}, beyond the {settings.partitions} of "
                    f"MEMSTREAM_PARTITIONS: a store of another partition count (another "
                    f"topic set), whose users sit on other shards here. Give this worker a "
                    f"new MEMSTREAM_DATA_DIR (remove the old one: the memory-change topic "
                    f"holds every memory)")
        return None
    shards = _shard_files(settings)
    if shards:
        return (f"{settings.data_dir / 'store'} holds shards of the partitioned layout but "
                f"this worker runs the single-store one ({SINGLE_SETTING}=false): remove "
                f"{settings.data_dir / 'store'} (the memory-change topic holds every memory), "
                f"or set {SINGLE_SETTING}=true")
    return None


def shared_refusal(me: str, others: set[str]) -> str:
    """The line a single-layout worker that would share its groups ends with."""
    return (f"this worker ({me}) runs the single-store layout ({SINGLE_SETTING}=false) and "
            f"its groups have another worker ({', '.join(sorted(others))}): each would answer "
            f"from a store that holds only its partitions' users. Run one worker, or set "
            f"{SINGLE_SETTING}=true on every worker (the partitioned layout)")
