"""Reflection (SPEC §6, Generative Agents): higher-level statements over the user's recent
memories, each resting on the memories it cites.

A model with a reflection step (the OpenAI-compatible one: its prompt pair is
:mod:`memory.llm.reflect_step`) answers insights with the numbers of the memories they rest on
("... (because of 1, 5, 3)"); each becomes a reflection memory with its evidence ids. The
offline rules model has none: the honest deterministic reflection is a profile summary by
slot and type (:func:`profile_reflection`). Pure: the caller gives the memories and the time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from memstream.memory.decisions import Candidate, Context, Decision, IdMap, PlannedOp, resolve
from memstream.memory.extraction import Insight, Usage
from memstream.memory.model import Memory, MemoryType, OpKind, new_memory_id
from memstream.memory.plan import REFLECTION, Plan, age, eligible, is_reflection, revise

REFLECTION_SLOT = "reflection:profile"
REFLECTION_METHOD = "rules-profile-1"
REFLECTION_IMPORTANCE = 8
MAX_REFLECTION_CHARS = 600
MAX_ITEM_CHARS = 160

Reflect = Callable[[list[tuple[int, Memory]]], tuple[list[Insight], Usage]]


def insight_ops(insights: list[Insight], shown: list[Memory], ctx: Context,
                ) -> list[PlannedOp]:
    """One reflection memory per insight, its evidence numbers turned back into ids."""
    ops: list[PlannedOp] = []
    for index, insight in enumerate(insights):
        evidence = sorted({shown[n - 1].memory_id for n in insight.evidence})
        cand = Candidate(insight.text, MemoryType.EPISODIC, max(8, insight.importance))
        for op in resolve(cand, index, IdMap(()), Decision(OpKind.ADD, reason="reflection"),
                          ctx):
            after = op.after.evolve(extra={"kind": REFLECTION, "evidence": evidence,
                                           "method": "llm"})
            ops.append(replace(op, after=after, writes=(after,)))
    return ops


def plan_reflection(live: Sequence[Memory], recent: int, reflect: Reflect | None, now: float,
                    ctx: Context) -> tuple[Plan, Usage]:
    """The model's insights over the ``recent`` newest facts when it has a reflection step
    and finds any; else the profile reflection."""
    facts = sorted((m for m in live if not is_reflection(m)), key=lambda m: -m.created_at)
    facts = facts[:recent]
    usage = Usage()
    if reflect is not None and facts:
        insights, usage = reflect(list(enumerate(facts, start=1)))
        if insights:
            ops = insight_ops(insights, facts, ctx)
            return Plan(ops, {m.memory_id: m.version for m in facts}), usage
    current = next((m for m in live if m.slot == REFLECTION_SLOT), None)
    return profile_reflection(facts, current, now, ctx), usage


def _item(text: str) -> str:
    """One memory as a clause: one line, no closing stop, lower-case start ("has 3 ...")."""
    text = re.sub(r"\s+", " ", text).strip().rstrip(".。!！;；")
    if len(text) > MAX_ITEM_CHARS:
        text = text[:MAX_ITEM_CHARS - 1].rstrip() + "…"
    if text[:1].isupper() and not text[1:2].isupper():
        text = text[:1].lower() + text[1:]
    return text


def _render(chosen: Sequence[Memory]) -> str:
    facts = [_item(m.content) for m in chosen if m.type != MemoryType.PROCEDURAL]
    rules = [_item(m.content) for m in chosen if m.type == MemoryType.PROCEDURAL]
    parts = [f"{label}: {'; '.join(items)}." for label, items in
             (("Profile", facts), ("Preferences and rules", rules)) if items]
    return " ".join(parts)


def _profile_sources(memories: Sequence[Memory], ctx: Context) -> list[Memory]:
    """The user's durable facts and rules, most important first, one per slot (the newest):
    no reflection, no core block, nothing with a time to live (a budget "this month" is no
    part of a profile), no shared knowledge."""
    by_slot: dict[str, Memory] = {}
    found: list[Memory] = []
    for i in eligible(memories, ctx):
        m = memories[i]
        if (is_reflection(m) or (m.slot or "").startswith("reflection:")
                or m.expires_at is not None or m.type == MemoryType.SEMANTIC
                or not _item(m.content)):
            continue
        if m.slot is None:
            found.append(m)
        elif m.slot not in by_slot or age(by_slot[m.slot]) < age(m):
            by_slot[m.slot] = m
    found += by_slot.values()
    return sorted(found, key=lambda m: (-m.importance, m.slot is None, -m.updated_at,
                                        m.memory_id))


def profile_reflection(memories: Sequence[Memory], existing: Memory | None, now: float,
                       ctx: Context) -> Plan:
    """The rules model's honest, deterministic reflection: a short profile of what the user's
    live memories say, by slot and type, with those memories as its evidence. No insight
    is invented; an LLM reflection is the production path. Nothing to say: no change."""
    plan = Plan()
    chosen: list[Memory] = []
    for m in _profile_sources(memories, ctx):
        if len(_render([*chosen, m])) <= MAX_REFLECTION_CHARS:
            chosen.append(m)
    if not chosen:
        return plan
    text = _render(chosen)
    extra = {"kind": REFLECTION, "evidence": [m.memory_id for m in chosen],
             "method": REFLECTION_METHOD}
    reason = f"reflection: profile of {len(chosen)} memories"
    if existing is None:
        oid = plan.next_id(ctx, OpKind.ADD)
        mid = new_memory_id(oid)
        added = Memory(mid, ctx.tenant_id, ctx.user_id, MemoryType.EPISODIC, text,
                       REFLECTION_IMPORTANCE, now, now, now, ctx.source(oid),
                       slot=REFLECTION_SLOT, extra=extra)
        plan.add(PlannedOp(oid, OpKind.ADD, mid, None, added, (added,), reason), "added")
    elif existing.content != text:
        revise(plan, ctx, existing, now, reason, "updated", content=text,
                type=MemoryType.EPISODIC, importance=REFLECTION_IMPORTANCE,
                slot=REFLECTION_SLOT, updated_at=now, expires_at=None, extra=extra)
    return plan
