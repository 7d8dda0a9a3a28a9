"""A downstream service on ``memstream.consumer``: each user's live memories as a profile
table in SQLite (what a CRM sync or a cache keeps), from the public memory events.

    MEMSTREAM_BOOTSTRAP_SERVERS=127.0.0.1:9092 \\
        .venv/bin/python examples/profile_projection.py --db profiles.sqlite
    .venv/bin/python examples/profile_projection.py --db profiles.sqlite --show

Exactly once into its own table, whatever Kafka redelivers:

- each event is applied in one SQLite transaction together with the partition's next
  offset; at start the reader is placed there (``start_at``), so a crash between the
  SQLite commit and Kafka's offset commit re-reads nothing;
- a republished copy (the same ``change_id``) is dropped by the reader; a change older than
  the row it would overwrite (``version``, then a delete after the update of the same
  version) is skipped, so even a copy outside the reader's window changes nothing;
- an ``erase`` (forget-me) deletes every row of the user (once); a forgotten user's
  earlier events arrive shredded (content gone) and create nothing, and a late plain copy
  of one (no master key) is older than the erasure and skipped.

The ``delivered`` table logs every event the reader handed over, ``applied`` each one that
changed the table (no unique keys: a change delivered or applied twice shows as two rows);
the integration test checks both.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from memstream.consumer import ConsumerSettings, MemoryChanges, Received

SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    tenant TEXT NOT NULL, user TEXT NOT NULL, memory_id TEXT NOT NULL,
    version INTEGER NOT NULL, closed INTEGER NOT NULL,  -- 1: a delete closed this version
    status TEXT NOT NULL, content TEXT NOT NULL, type TEXT NOT NULL,
    importance INTEGER NOT NULL, updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, user, memory_id));
CREATE TABLE IF NOT EXISTS positions (partition INTEGER PRIMARY KEY, next_offset INTEGER);
CREATE TABLE IF NOT EXISTS applied (change_id TEXT NOT NULL, op TEXT NOT NULL,
    partition INTEGER NOT NULL, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS delivered (change_id TEXT NOT NULL, content TEXT NOT NULL,
    partition INTEGER NOT NULL, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS erased (tenant TEXT, user TEXT, change_id TEXT, decided_at TEXT);
"""


def _utc(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()  # one offset: the strings compare as times


class Projection:
    """The profile table and the offsets it holds, in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)  # transactions by hand
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def position(self, partition: int) -> int | None:
        row = self.db.execute("SELECT next_offset FROM positions WHERE partition = ?",
                              (partition,)).fetchone()
        return None if row is None else int(row[0])

    def apply(self, e: Received) -> bool:
        """One event and its position in one transaction; True if it changed the table."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("INSERT INTO delivered VALUES (?, ?, ?, ?)",
                            (e.change_id, e.content, e.partition, e.offset))
            changed = self._apply(e)
            if changed:
                self.db.execute("INSERT INTO applied VALUES (?, ?, ?, ?)",
                                (e.change_id, e.op, e.partition, e.offset))
            self.db.execute("INSERT OR REPLACE INTO positions VALUES (?, ?)",
                            (e.partition, e.offset + 1))
            self.db.execute("COMMIT")
            return changed
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _apply(self, e: Received) -> bool:
        erased = self.db.execute(
            "SELECT max(decided_at), sum(change_id = ?) FROM erased WHERE tenant = ? AND "
            "user = ?", (e.change_id, e.tenant_id, e.user_id)).fetchone()
        if e.op == "erase":
            if erased[1]:
                return False  # a copy of an erase applied before
            self.db.execute("DELETE FROM memories WHERE tenant = ? AND user = ?",
                            (e.tenant_id, e.user_id))
            self.db.execute("INSERT INTO erased VALUES (?, ?, ?, ?)",
                            (e.tenant_id, e.user_id, e.change_id, _utc(e.decided_at)))
            return True
        if not e.readable or e.after is None:
            return False  # sealed without a key here, or shredded: the user is forgotten
        if erased[0] is not None and _utc(e.decided_at) <= erased[0]:
            return False  # a late copy of a change the user's erasure removed
        closed = int(e.op == "delete")
        row = self.db.execute(
            "SELECT version, closed FROM memories WHERE tenant = ? AND user = ? AND "
            "memory_id = ?", (e.tenant_id, e.user_id, e.memory_id)).fetchone()
        if row is not None and (row[0], row[1]) >= (e.version, closed):
            return False  # this change or a later one is in already
        a = e.after
        self.db.execute(
            "INSERT OR REPLACE INTO memories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (e.tenant_id, e.user_id, e.memory_id, e.version, closed, a.status, a.content,
             a.type, a.importance, a.updated_at.isoformat()))
        return True

    def profile(self, tenant: str, user: str) -> list[tuple[str, int, str]]:
        """The user's live memories: (memory id, version, content)."""
        return [(r[0], int(r[1]), r[2]) for r in self.db.execute(
            "SELECT memory_id, version, content FROM memories WHERE tenant = ? AND user = ? "
            "AND status = 'active' ORDER BY memory_id", (tenant, user))]

    def close(self) -> None:
        self.db.close()


async def run(settings: ConsumerSettings, db: Path, group: str, idle: float | None) -> int:
    projection = Projection(db)
    applied = 0
    try:
        async with MemoryChanges(settings, group_id=group, start_at=projection.position,
                                 idle_timeout_s=idle) as changes:
            async for event in changes:
                applied += projection.apply(event)
            logging.info("idle for %.0fs: %d applied, %s", idle or 0, applied, changes.stats)
    finally:
        projection.close()
    return applied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, required=True, help="The SQLite file")
    ap.add_argument("--group", default="profile-projection", help="Kafka consumer group")
    ap.add_argument("--idle", type=float, default=None,
                    help="Exit after this many seconds without an event (default: follow)")
    ap.add_argument("--show", action="store_true", help="Print the profiles and exit")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.show:
        p = Projection(args.db)
        users = p.db.execute("SELECT DISTINCT tenant, user FROM memories ORDER BY 1, 2")
        for tenant, user in users.fetchall():
            print(f"{tenant}/{user}")
            for memory_id, version, content in p.profile(tenant, user):
                print(f"  {memory_id} v{version}: {content}")
        p.close()
        return
    asyncio.run(run(ConsumerSettings.from_env(), args.db, args.group, args.idle))


if __name__ == "__main__":
    main()
