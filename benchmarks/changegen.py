"""A synthetic memory-change log, made by the real decision code (memory.decisions.resolve
and memory.applying.change_for): per user a stream of jobs whose candidates ADD new facts,
UPDATE or DELETE live ones; optional duplicates (a re-published decision) and forget-mes.
Used by benchmarks/rebuild.py and the rebuild unit tests.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

from memstream.memory.applying import change_for, erase_change
from memstream.memory.decisions import Candidate, Context, Decision, IdMap, resolve
from memstream.memory.extraction import JobOutcome, RulesModel
from memstream.memory.model import Memory, OpKind
from memstream.topics.schemas import ExtractionJob, JobMessage, MemoryChange, Role, ToolWrite


def _job(tenant: str, user: str, seq: int, now: float, tool: ToolWrite | None = None,
         ) -> ExtractionJob:
    msg = JobMessage(message_id=f"{user}-m{seq}", seq=seq, role=Role.USER, content="-",
                     ts=datetime.fromtimestamp(now, UTC))
    return ExtractionJob(job_id=f"{user}-j{seq}", tenant_id=tenant, user_id=user,
                         session_id=f"{user}-s", from_seq=seq, to_seq=seq, seq=seq,
                         messages=[] if tool else [msg], tool=tool,
                         reason="tool" if tool else "threshold",
                         created_at=datetime.fromtimestamp(now, UTC))


def changes(users: int, per_user: int, dim: int = 512, *, tenant: str = "bench",
            seed: int = 7, duplicates: float = 0.0, forget_every: int = 0,
            ) -> Iterator[MemoryChange]:
    """About ``users * per_user`` changes, interleaved across users like a topic's
    partitions; every ``forget_every``-th user (if set) is forgotten half-way."""
    rng = random.Random(seed)
    model = RulesModel()
    live: dict[str, dict[str, Memory]] = {f"u{i}": {} for i in range(users)}
    seqs = dict.fromkeys(live, 0)
    now = 1_700_000_000.0
    order = [u for u in live for _ in range(per_user)]
    rng.shuffle(order)
    done = dict.fromkeys(live, 0)
    for user in order:
        now += 1.0
        seqs[user] += 1
        done[user] += 1
        seq = seqs[user]
        if forget_every and int(user[1:]) % forget_every == 0 and done[user] == per_user // 2:
            tool = ToolWrite(request_id=f"{user}-forget", name="forget", all_memories=True)
            job = _job(tenant, user, seq, now, tool)
            yield erase_change(job, len(live[user]), model, now)
            live[user].clear()
            continue
        job = _job(tenant, user, seq, now)
        mine = live[user]
        roll = rng.random()
        if mine and roll < 0.25:
            target, kind = rng.choice(list(mine.values())), OpKind.UPDATE
        elif mine and roll < 0.32:
            target, kind = rng.choice(list(mine.values())), OpKind.DELETE
        else:
            target, kind = None, OpKind.ADD
        cand = Candidate(f"fact {seq} of {user}: {rng.randrange(10**6)}",
                         importance=rng.randint(1, 10), new_fact=kind != OpKind.DELETE)
        ctx = Context(tenant, user, job.session_id, seq, seq, job.job_id, now, (), seq)
        shown = IdMap((target,) if target else ())
        [op] = resolve(cand, 0, shown, Decision(kind, 1 if target else None, "bench"), ctx)
        vector = None if kind == OpKind.DELETE else [rng.gauss(0, 1) for _ in range(dim)]
        change = change_for(op, vector, job, JobOutcome(), model, now)
        if kind == OpKind.DELETE:
            mine.pop(op.memory_id, None)
        else:
            mine[op.memory_id] = op.after
        yield change
        if duplicates and rng.random() < duplicates:
            yield change
