"""Archived turns for the retrieval benchmarks (``benchmarks/retrieval.py --archive-turns``):
synthetic conversations of chat turns, seeded, written to a store as the apply stage writes
them (turn records of :mod:`memory.archive`, with their context and random unit vectors;
the store computes each turn's word weights from its text, as it does for real turns).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import numpy as np

from memstream.memory.archive import TURN_STATUS, turn_id, turn_point_id
from memstream.memory.store import MemoryStore, Record

BATCH = 2000
DAY = 86_400.0
SUBJECTS = ["the trip", "my sister", "the new job", "our flat", "the marathon", "the dog",
            "my knee", "the wedding", "the car", "the garden", "my thesis", "the band",
            "the bakery", "our neighbours", "the concert", "the course", "the kids",
            "the interview", "the hike", "the budget"]
PLACES = ["Lisbon", "Porto", "Berlin", "Kyoto", "Oslo", "Austin", "Lyon", "Vienna", "Rome",
          "Seoul", "Denver", "Cork", "Tartu", "Quito", "Perth", "Sapporo"]
VERBS = ["went", "talked", "worried", "laughed", "planned", "cooked", "painted", "argued",
         "walked", "decided", "wrote", "called", "fixed", "bought", "forgot", "finished"]
EXTRAS = ["yesterday", "last weekend", "this morning", "again", "with my brother",
          "after work", "for hours", "in the rain", "before dinner", "on the train",
          "at the market", "with the team", "in secret", "for the first time"]
ASK = ["How did {s} go?", "What happened with {s}?", "Did you finish {s}?",
       "Are you still thinking about {s}?", "How do you feel about {s} now?"]
ZH = ["我们上周去了{p}", "我昨天和姐姐吃了饺子", "{p}的天气很好", "我在学做面包"]


def _said(rng: random.Random, user_turn: bool) -> str:
    s, p = rng.choice(SUBJECTS), rng.choice(PLACES)
    if not user_turn:
        return rng.choice(ASK).format(s=s)
    if rng.random() < 0.1:
        return rng.choice(ZH).format(p=p)
    return (f"I {rng.choice(VERBS)} about {s} in {p} {rng.choice(EXTRAS)}, "
            f"and {rng.choice(VERBS)} {rng.choice(EXTRAS)}")


def turns(n: int, users: int, tenant: str, now: float, seed: int,
          dim: int, per_session: int = 20) -> Iterator[list[Record]]:
    """``n`` turns round-robin over ``users`` users, in sessions of ``per_session`` turns
    (user and assistant alternating, each with the one before it as context), dated over
    the last year; batches of records as the store takes them."""
    sessions: dict[int, tuple[int, dict | None]] = {}  # user -> (turns so far, last turn)
    for b, start in enumerate(range(0, n, BATCH)):
        rng = random.Random(f"{seed}:turns:{b}")
        size = min(BATCH, n - start)
        raw = np.random.default_rng([seed, 7, b]).standard_normal((size, dim), dtype=np.float32)
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        batch: list[Record] = []
        for j in range(size):
            u = (start + j) % users
            count, before = sessions.get(u, (0, None))
            session, seq = f"s{count // per_session}", count % per_session
            user = f"u{u}"
            message_id = f"{user}-m{count}"
            payload = {
                "memory_id": turn_id(tenant, user, session, message_id), "version": 1,
                "tenant_id": tenant, "user_id": user, "status": TURN_STATUS,
                "session_id": session, "message_id": message_id, "seq": seq,
                "role": "user" if seq % 2 == 0 else "assistant",
                "content": _said(rng, seq % 2 == 0),
                "ts": now - 365 * DAY + (count / max(1, n // users)) * 364 * DAY,
                "context": None if seq == 0 or before is None else {
                    k: before[k] for k in ("message_id", "role", "content", "ts")},
                "source": {"op_id": f"bench-{user}-{count}"}}
            batch.append((turn_point_id(payload["memory_id"]), payload, raw[j].tolist()))
            sessions[u] = (count + 1, payload)
        yield batch


def load_turns(store: MemoryStore, n: int, users: int, tenant: str, now: float, seed: int,
               dim: int) -> float:
    """Write the turns; returns the seconds it took."""
    t0 = time.perf_counter()
    for batch in turns(n, users, tenant, now, seed, dim):
        store.write_records(batch)
    return time.perf_counter() - t0
