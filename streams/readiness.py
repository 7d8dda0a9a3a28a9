"""Whether this worker serves what it owns: read from the loops, not from a framework.

A worker is ready when every stage loop running here has joined its group (had its first
assignment: before that it does not know what it owns) and none of the partitions it owns
is still being taken (its producer fenced the previous owner, its tables and store shard
restored, its consumer positioned: :mod:`streams.task_manager`), the per-user data keys
are known (forget-me markers: a read must not return a forgotten user) and, with the
partitioned store, the copy of the global memories has caught up once. A worker that owns
no partition (more workers than partitions) is ready: it answers by forwarding.

Requests are gated per user (:func:`restoring`): a user whose partition is being taken here
gets 503 and retries, the others are served meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.memory.store.partitioned import partition_of
from memstream.streams.pipeline import Pipeline


@dataclass(frozen=True)
class Readiness:
    joined: bool  # every loop here had its first assignment
    owned: tuple[int, ...]  # partitions some loop here owns
    restoring: tuple[int, ...]  # owned, still being taken (tables, shard, positions)
    waiting: tuple[str, ...] = ()  # what else is not there yet

    @property
    def ready(self) -> bool:
        return self.joined and not self.restoring and not self.waiting

    @property
    def forwarding(self) -> bool:
        """Joined and owns nothing: every user's requests go to their owners."""
        return self.joined and not self.owned


def readiness(p: Pipeline) -> Readiness:
    owned: set[int] = set()
    restoring: set[int] = set()
    for loop in p.loops:
        owned |= loop.owned
        restoring |= loop.taking
    waiting = []
    if p.user_keys is not None and not p.user_keys.ready:
        waiting.append("user-keys")
    if p.global_copy is not None and not p.global_copy.caught_up:
        waiting.append("global-shard")
    joined = all(loop.assignments > 0 for loop in p.loops)
    return Readiness(joined, tuple(sorted(owned)), tuple(sorted(restoring)), tuple(waiting))


def restoring(p: Pipeline, tenant: str, user: str) -> bool:
    """Whether the user's partition is being taken here (their answer would be partial)."""
    partition = partition_of(tenant, user, p.settings.partitions)
    return any(partition in loop.taking for loop in p.loops)
