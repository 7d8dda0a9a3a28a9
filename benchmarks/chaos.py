"""Chaos benchmark: do users' memories survive crashed workers and a broker restart? (not a test)

    .venv/bin/python benchmarks/chaos.py [--users 40] [--kills 6] [--rate 100]
        [--workers 1] [--partitions 4]   # N workers on the partitioned store
        [--processes 2]   # the worker runs as `memstream worker --processes 2`
        [--seed 7] [--no-broker-restart] [--port 29092]
        [--job-timeout 60] [--settle-timeout 900] [--keep-broker] [--reuse-broker]
        [--seeds 1-10]   # one run per seed, a table of the runs and one JSON line
        [--shuffle-producers]   # each user's messages delivered out of event-time order
        [--producer aiokafka|librdkafka|random]   # who places the records on partitions
        [--brokers 3 [--kill-leader 5] [--leader-down 5]]   # its own 3-node cluster
        [--bootstrap HOST:PORT]   # a running broker instead of its own (never restarted)
    .venv/bin/python benchmarks/chaos.py --smoke [--bootstrap HOST:PORT]   # 4 users, 1 kill

``scenario`` writes conversations for N users (English and Chinese) whose live memories
under the offline rules extractor are known exactly: several moves (the last city is
true), changing child counts, restatements of the current value, several allergies, explicit
"remember this" notes, an employer change, a habit retracted ("I no longer ..."), chit-chat
and session ends. The run starts its own broker (``--port``, never the shared test broker),
a worker with the embedded Qdrant Edge store, and produces at a steady rate with an
idempotent producer while the worker is SIGKILLed ``--kills`` times (while running, during
start-up and right after it is ready, i.e. during recovery) and the broker is stopped and
started once. With ``--workers N`` the workers share the load on the partitioned store (a
shard per partition restored from the change topic, standbys on the others) and each kill
hits one of them. With ``--processes N`` (one worker) the worker is a supervisor of N member
processes (docs/processes.md): a kill SIGKILLs one child at random and the supervisor
restarts it; the HTTP view is read through the front port. Then it ends every session,
waits until every message is covered by a done/trivial job result, and ``check`` compares
the truth with each user's live memories from the worker's HTTP view and from the
memory-change topic replayed into an empty store.

Every message id whose send a producer acknowledged is kept: after the run each must be on
the messages topic (read committed) in a covered session. A send that fails is retried with
the same message id (the pipeline drops repeats); the retries are counted. ``--producer``
picks the client: ``aiokafka`` (memstream's, murmur2 of the key), ``librdkafka``
(confluent_kafka.Producer, its default partitioner: CRC-32 of the key; idempotent,
acks=all) or ``random`` (aiokafka placing each record on a random partition). Records
acknowledged off their key's murmur2 partition (from the delivery reports), the records
off it on the producers' topics and those on the repartition topic are counted: each
misplaced record must be re-routed exactly once. The workers' ``misplaced_records``
counters are scraped before each worker kill and at the end (informational: a kill resets
them).

``--brokers 3`` starts its own KRaft cluster of three nodes (``--port``, default 29192:
nodes on 29192, 29202, 29212) and the workers create their topics replicated 3 with
min.insync.replicas 2 (the default on three brokers). ``--kill-leader N`` SIGKILLs, N
times, the node that leads the busiest partition of the messages or memory-change topic
at that moment (the most records written in the last 2 s), restarts it after
``--leader-down`` seconds and waits until every partition's ISR is full again before the
next kill; the worker kills go on beside. The whole-broker restart of a single-broker run
is off with a cluster: stopping every node is that run's test, and a node's loss is what
the leader kills measure, harder (SIGKILL, not a controlled shutdown).

The episodic archive is checked too: every produced user or assistant message that is not
trivial must be archived by exactly one ``archive`` change on the memory-change topic
(missing, duplicate: more than one change id, unexpected: a turn not produced or trivial,
mismatched: a payload not the message's), and the replayed store and the workers' own stores
(read from disk once they are stopped) must hold exactly those turns.

Prints missing / stale / duplicate / unexpected live memories, change ids with differing
payloads, jobs decided more than once, restart-to-processing times, acknowledged messages
lost, misplaced records against re-routed ones, the leader kills, and one JSON line last.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import logging
import random
import re
import secrets
import socket
import tempfile
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from aiokafka import TopicPartition
from pydantic import SecretStr

from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import CHILD_RESTARTED, WorkerProcess, free_port_block
from memstream.dev.tls import write_dev_tls
from memstream.memory.archive import ARCHIVE_OP, TURN_STATUS, turn_id
from memstream.memory.rules import extract_text
from memstream.memory.store.partitioned import partition_of_key
from memstream.memory.trigger_rules import is_trivial
from memstream.ops.status import serves_what_it_owns
from memstream.topics.layout import prepare
from memstream.topics.publishing import PRIVATE_OPS
from memstream.topics.registry import (
    Topics,
    all_topic_names,
    delete_topics,
    registry,
)
from memstream.topics.schemas import ChatMessage, Event, MemoryChange, SessionEvent
from memstream.web.forwarding import client_ssl

TENANT = "chaos"

# --------------------------------------------------------------------------- scenario


@dataclass(frozen=True)
class Lang:
    """Phrasings the rules extractor understands, and the memory texts they become."""

    cities: tuple[str, ...]
    allergens: tuple[str, ...]
    notes: tuple[str, ...]
    orgs: tuple[str, ...]
    max_kids: int
    numerals: Mapping[int, str]
    live: str  # {city}
    restate_city: tuple[str, ...]
    move: tuple[str, ...]  # {old} {new}
    kids: str  # {n} {w}
    kids_change: tuple[str, ...]
    allergy: tuple[str, ...]  # {a}
    note: str  # {note}
    employer: str  # {org}
    employer_change: str
    habit: str
    retract: str
    chat: tuple[str, ...]  # not trivial, no fact
    trivial: tuple[str, ...]
    assistant: str
    lives_in: str  # memory texts
    has_kids: str
    allergic: str
    works_at: str
    habit_text: str


EN = Lang(
    cities=("Berlin", "Munich", "Hamburg", "Lisbon", "Porto", "Oslo", "Rome", "Vienna",
            "Madrid", "Dublin", "Prague", "Zurich", "Buenos Aires", "New York"),
    allergens=("penicillin", "peanuts", "shellfish", "latex", "pollen", "cats", "gluten",
               "bee stings", "dust mites", "sesame"),
    notes=("my passport expires in June", "my daughter's name is Mia",
           "my car is a blue Volvo", "my mother's birthday is in October",
           "the spare key is under the blue pot", "my gym class is on Tuesdays",
           "my bank is in the old town", "my favourite tea is Earl Grey"),
    orgs=("Siemens", "Bosch", "Acme", "Zalando", "Spotify", "Adidas"),
    max_kids=9,
    numerals={1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
              8: "eight", 9: "nine"},
    live="I live in {city}",
    restate_city=("I live in {city}", "I now live in {city}, as you know."),
    move=("Big news: we moved from {old} to {new}.", "We relocated to {new} last month.",
          "I moved to {new} in May."),
    kids="we have {n} kids",
    kids_change=("so we have {n} kids now", "We have {w} children now."),
    allergy=("I am allergic to {a}.", "Remember this: I am allergic to {a}",
             "By the way, I'm allergic to {a}."),
    note="Remember this: {note}",
    employer="I work at {org}",
    employer_change="These days I work at {org}",
    habit="I use mocks in my tests",
    retract="I no longer use mocks in my tests.",
    chat=("What is the weather like today?", "Can you suggest a recipe for dinner?",
          "Tell me a joke.", "How long does it take to boil an egg?",
          "What time is it in Tokyo?"),
    trivial=("ok", "thanks", "hi", "great, thanks"),
    assistant="Noted.",
    lives_in="Lives in {city}",
    has_kids="Has {n} children",
    allergic="Allergic to {a}",
    works_at="Works at {org}",
    habit_text="Uses mocks in my tests",
)

ZH = Lang(
    cities=("上海", "深圳", "杭州", "北京", "广州", "成都", "南京", "武汉", "西安", "苏州"),
    allergens=("花生", "青霉素", "海鲜", "花粉", "牛奶", "芒果", "猫毛", "鸡蛋"),
    notes=("我的护照六月到期", "我女儿叫小美", "我的车是蓝色的", "我妈妈的生日在十月",
           "我每周三去游泳", "我的狗叫旺财"),
    orgs=("阿里巴巴", "腾讯", "华为", "百度", "小米", "字节跳动"),
    max_kids=6,
    numerals={1: "一", 2: "两", 3: "三", 4: "四", 5: "五", 6: "六"},
    live="我住在{city}。",
    restate_city=("我现在住在{city}。", "我住在{city}。"),
    move=("我们搬到了{new}。", "上个月我们搬到{new}了。", "我以前住在{old}，上个月搬到{new}了。"),
    kids="我有{w}个孩子。",
    kids_change=("我们现在有{w}个孩子了。",),
    allergy=("我对{a}过敏。", "记住：我对{a}过敏。"),
    note="记住：{note}。",
    employer="我在{org}工作。",
    employer_change="我在{org}上班了。",
    habit="我喜欢吃辣。",
    retract="我不再吃辣了。",
    chat=("今天天气怎么样？", "给我讲个笑话吧。", "推荐一本书。", "东京现在几点？"),
    trivial=("好的", "谢谢", "继续", "你好"),
    assistant="好的，已记录。",
    lives_in="住在{city}",
    has_kids="有{n}个孩子",
    allergic="对{a}过敏",
    works_at="在{org}工作",
    habit_text="喜欢吃辣",
)


@dataclass(frozen=True)
class Truth:
    """A user's exact live memory texts, and the texts that would be stale if live."""

    live: frozenset[str]
    old: frozenset[str]  # earlier values of a slot, retracted facts


class _Person:
    """One user's facts while the script is written; every statement updates them."""

    def __init__(self, lang: Lang, rng: random.Random) -> None:
        self.lang, self.rng = lang, rng
        self.city = rng.choice(lang.cities)
        self.kids = rng.randint(2, 3)
        self.org = rng.choice(lang.orgs)
        self.allergies: list[str] = []
        self.notes: list[str] = []
        self.habit = rng.random() < 0.6
        self.old: set[str] = set()

    def intro(self) -> list[str]:
        lang = self.lang
        lines = [lang.live.format(city=self.city), self._kids(lang.kids),
                 lang.employer.format(org=self.org), self.allergy(), self.note()]
        if self.habit:
            lines.append(lang.habit)
        self.rng.shuffle(lines)
        return lines

    def _kids(self, template: str) -> str:
        return template.format(n=self.kids, w=self.lang.numerals[self.kids])

    def allergy(self) -> str:
        a = self.rng.choice([x for x in self.lang.allergens if x not in self.allergies])
        self.allergies.append(a)
        return self.rng.choice(self.lang.allergy).format(a=a)

    def note(self) -> str:
        note = self.rng.choice([x for x in self.lang.notes if x not in self.notes])
        self.notes.append(note)
        return self.lang.note.format(note=note)

    def statement(self) -> str | None:
        """One random new statement, or None when the picked kind has nothing left."""
        lang, rng = self.lang, self.rng
        kind = rng.choices(["move", "kids", "city", "restate_kids", "allergy", "restate_allergy",
                            "note", "employer", "retract"],
                           weights=[5, 3, 2, 2, 2, 1, 2, 1, 1])[0]
        if kind == "move":
            new = rng.choice([c for c in lang.cities if c != self.city])
            self.old.add(lang.lives_in.format(city=self.city))
            line = rng.choice(lang.move).format(old=self.city, new=new)
            self.city = new
            return line
        if kind == "kids" and self.kids < lang.max_kids:
            self.old.add(lang.has_kids.format(n=self.kids))
            self.kids += 1
            return self._kids(rng.choice(lang.kids_change))
        if kind == "city":
            return rng.choice(lang.restate_city).format(city=self.city)
        if kind == "restate_kids":
            return self._kids(lang.kids)
        if kind == "allergy" and len(self.allergies) < 4:
            return self.allergy()
        if kind == "restate_allergy":
            return rng.choice(lang.allergy).format(a=rng.choice(self.allergies))
        if kind == "note" and len(self.notes) < 4:
            return self.note()
        if kind == "employer":
            self.old.add(lang.works_at.format(org=self.org))
            self.org = rng.choice([o for o in lang.orgs if o != self.org])
            return lang.employer_change.format(org=self.org)
        if kind == "retract" and self.habit:
            self.habit = False
            self.old.add(lang.habit_text)
            return lang.retract
        return None

    def chat(self) -> str:
        lang = self.lang
        return self.rng.choice(lang.chat if self.rng.random() < 0.6 else lang.trivial)

    def truth(self) -> Truth:
        lang = self.lang
        live = {lang.lives_in.format(city=self.city), lang.has_kids.format(n=self.kids),
                lang.works_at.format(org=self.org)}
        live |= {lang.allergic.format(a=a) for a in self.allergies}
        live |= {remembered(lang.note.format(note=n)) for n in self.notes}
        if self.habit:
            live.add(lang.habit_text)
        return Truth(frozenset(live), frozenset(self.old - live))


def remembered(said: str) -> str:
    """The memory a "remember this" turn makes: the rules model's reading of what follows
    (a fact it knows, in its own words: "Favourite tea: Earl Grey"), else the text itself."""
    return extract_text(said)[0].text


def _session(person: _Person, user: str, sid: str, lines: list[str]) -> list[Event]:
    """User turns each answered by the assistant. Every session ends with two chit-chat
    turns (4 messages after the last fact): the threshold then puts its last fact into a
    job before the user's next session starts, whenever the session-end event (another
    topic) arrives, so facts reach the store in conversation order."""
    lines = [*lines, person.chat(), person.chat()]
    now = datetime.now(UTC)
    out: list[Event] = []
    for text in lines:
        for role, content in (("user", text), ("assistant", person.lang.assistant)):
            out.append(ChatMessage(tenant_id=TENANT, user_id=user, session_id=sid,
                                   message_id=f"{sid}-m{len(out)}", role=role,
                                   content=content, ts=now))
    out.append(SessionEvent(tenant_id=TENANT, user_id=user, session_id=sid, ts=now))
    return out


def scenario(users: int, seed: int = 7, zh_share: float = 0.3,
             ) -> tuple[list[Event], dict[str, Truth]]:
    """Events of ``users`` users, randomly interleaved (each user's order kept), and each
    user's truth. Deterministic for a seed; message ids are stable (re-sends dedup)."""
    rng = random.Random(seed)
    per_user: list[list[Event]] = []
    truth: dict[str, Truth] = {}
    for i in range(users):
        lang = ZH if rng.random() < zh_share else EN
        user = f"{'zh' if lang is ZH else 'en'}-u{i:03d}"
        person = _Person(lang, rng)
        events = _session(person, user, f"{user}-s0", person.intro())
        for s in range(1, rng.randint(4, 6)):
            lines: list[str] = []
            want = rng.randint(1, 3)
            while len(lines) < want:
                line = person.statement()
                if line is not None:
                    lines.append(line)
            if rng.random() < 0.5:
                lines.insert(rng.randrange(len(lines) + 1), person.chat())
            events += _session(person, user, f"{user}-s{s}", lines)
        per_user.append(events)
        truth[user] = person.truth()
    order = [u for u, evs in enumerate(per_user) for _ in evs]
    rng.shuffle(order)
    cursors = [0] * users
    merged: list[Event] = []
    for u in order:
        merged.append(per_user[u][cursors[u]])
        cursors[u] += 1
    return merged, truth


# --------------------------------------------------------------------------- checking


@dataclass
class Report:
    """Live memories against the truth, for one view (HTTP or replayed change log)."""

    view: str
    users: int = 0
    expected: int = 0
    live: int = 0
    missing: list[tuple[str, str]] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)  # one per live record
    duplicate: list[tuple[str, str, int]] = field(default_factory=list)
    unexpected: list[tuple[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"users": self.users, "expected": self.expected, "live": self.live,
                "missing": len(self.missing), "stale": len(self.stale),
                "duplicate": sum(n - 1 for *_, n in self.duplicate),
                "unexpected": len(self.unexpected)}


def check(truth: Mapping[str, Truth], live_by_user: Mapping[str, Sequence[str]],
          view: str = "live") -> Report:
    """missing: a truth text not live; stale: a live text that is an older value (or a
    retracted fact) of the user; duplicate: a truth text live more than once (counted
    beyond the first); unexpected: anything else live."""
    report = Report(view, users=len(truth))
    for user in sorted(set(truth) | set(live_by_user)):
        t = truth.get(user, Truth(frozenset(), frozenset()))
        live = Counter(live_by_user.get(user, []))
        report.expected += len(t.live)
        report.live += sum(live.values())
        report.missing += [(user, x) for x in sorted(t.live) if live[x] == 0]
        report.duplicate += [(user, x, n) for x, n in sorted(live.items())
                             if x in t.live and n > 1]
        for x, n in sorted(live.items()):
            if x not in t.live:
                (report.stale if x in t.old else report.unexpected).extend([(user, x)] * n)
    return report


def change_stats(changes: Sequence[MemoryChange]) -> dict[str, int]:
    """Change ids published more than once, and those whose payloads differ (exactly, and
    in what they change: op, memory, version, before/after content and status)."""
    exact: dict[str, set[str]] = defaultdict(set)
    content: dict[str, set[str]] = defaultdict(set)
    for c in changes:
        exact[c.change_id].add(c.model_dump_json())
        content[c.change_id].add(json.dumps([
            c.op, c.memory_id, c.version, (c.before or {}).get("content"),
            c.after.get("content"), c.after.get("status")], ensure_ascii=False))
    seen = Counter(c.change_id for c in changes)
    return {"change_records": len(changes), "change_ids": len(seen),
            "change_records_republished": sum(n - 1 for n in seen.values()),
            "change_ids_differing_payloads": sum(len(v) > 1 for v in exact.values()),
            "change_ids_differing_content": sum(len(v) > 1 for v in content.values())}


TurnKey = tuple[str, str, str, str]  # tenant, user, session, message id


def expected_turns(events: Iterable[Event]) -> dict[TurnKey, ChatMessage]:
    """The turns the episodic archive must keep: every produced user or assistant message
    that is not trivial (:func:`memory.trigger_rules.is_trivial`), by its key."""
    return {(e.tenant_id, e.user_id, e.session_id, e.message_id): e for e in events
            if isinstance(e, ChatMessage) and e.role.value in ("user", "assistant")
            and not is_trivial(e.content)}


@dataclass
class ArchiveReport:
    """The archive's changes on the memory-change topic against the expected turns.

    missing: an expected turn no ``archive`` change carries; duplicate: a turn carried by
    more than one distinct change id (a re-publication of one change id is counted by
    :func:`change_stats`); unexpected: an archive change of a message not produced, or
    trivial, or not a user/assistant turn; mismatched: an archive change whose payload is
    not the message (memory id, role, content, status)."""

    turns_expected: int = 0
    turns_archived: int = 0  # distinct expected turns with an archive change
    archive_changes: int = 0  # distinct archive change ids
    missing: list[TurnKey] = field(default_factory=list)
    duplicate: list[tuple[TurnKey, int]] = field(default_factory=list)  # key, change ids
    unexpected: list[TurnKey] = field(default_factory=list)
    mismatched: list[tuple[TurnKey, str]] = field(default_factory=list)  # key, change id

    def counts(self) -> dict[str, int]:
        return {"turns_expected": self.turns_expected, "turns_archived": self.turns_archived,
                "archive_changes": self.archive_changes, "missing": len(self.missing),
                "duplicate": sum(n - 1 for _, n in self.duplicate),
                "unexpected": len(self.unexpected), "mismatched": len(self.mismatched)}


def turn_key(payload: Mapping[str, Any]) -> TurnKey:
    return (str(payload.get("tenant_id")), str(payload.get("user_id")),
            str(payload.get("session_id")), str(payload.get("message_id")))


def turn_of(change: MemoryChange) -> dict[str, Any]:
    """An archive change's turn record (its ``after`` names the turn without its text)."""
    return change.records[0] if change.records else change.after


def check_archive(expected: Mapping[TurnKey, ChatMessage],
                  changes: Iterable[MemoryChange]) -> ArchiveReport:
    """Every expected turn archived by exactly one change id, and nothing else archived."""
    ids: dict[TurnKey, set[str]] = defaultdict(set)
    report = ArchiveReport(turns_expected=len(expected))
    seen: set[str] = set()
    for c in changes:
        if c.op != ARCHIVE_OP or c.change_id in seen:
            continue
        seen.add(c.change_id)
        turn = turn_of(c)
        key = turn_key(turn)
        ids[key].add(c.change_id)
        want = expected.get(key)
        if want is None:
            continue
        if (c.memory_id != turn_id(*key) or turn.get("status") != TURN_STATUS
                or turn.get("role") != want.role.value or turn.get("content") != want.content
                or (c.tenant_id, c.user_id) != key[:2]):
            report.mismatched.append((key, c.change_id))
    report.archive_changes = len(seen)
    report.turns_archived = sum(k in ids for k in expected)
    report.missing = sorted(k for k in expected if k not in ids)
    report.duplicate = sorted((k, len(v)) for k, v in ids.items() if len(v) > 1)
    report.unexpected = sorted(k for k in ids if k not in expected)
    return report


def check_stored_turns(expected: Iterable[TurnKey],
                       stored: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """A store's turn records (payloads of status ``turn``) against the expected turns:
    per user the same set (a turn's point id is its key's: a store cannot hold one twice,
    so the topic's duplicates show in :func:`check_archive` only)."""
    want = set(expected)
    have: Counter[TurnKey] = Counter(turn_key(p) for p in stored
                                     if p.get("status") == TURN_STATUS)
    users_want = Counter(k[:2] for k in want)
    users_have = Counter(k[:2] for k in have)
    return {"turn_records": sum(have.values()), "missing": len(want - set(have)),
            "unexpected": len(set(have) - want),
            "duplicate": sum(n - 1 for n in have.values()),
            "users_count_off": sum(users_want[u] != users_have[u]
                                   for u in set(users_want) | set(users_have))}


ARCHIVE_CHECKS = ("missing", "duplicate", "unexpected", "mismatched")
STORED_CHECKS = ("missing", "unexpected", "duplicate", "users_count_off")


def archive_consistent(row: Mapping[str, Any]) -> bool:
    """Every non-trivial turn archived exactly once on the topic, and the same turns in the
    replayed store and the workers' own stores; rows from before the check count as
    consistent (a view not scanned: ``None``)."""
    topic = row.get("archive") or {}
    stores = [row.get("archive_replay"), row.get("archive_worker_store")]
    return (all(topic.get(k, 0) == 0 for k in ARCHIVE_CHECKS)
            and all(v.get(k, 0) == 0 for v in stores if v for k in STORED_CHECKS))


EVENT_CHECKS = ("events_missing", "events_unexpected", "event_partitions_out_of_order")


def events_consistent(figures: Mapping[str, Any]) -> bool:
    """The public events hold the changelog's changes, in its order (:func:`event_stats`);
    rows written before the check existed count as consistent."""
    return all(figures.get(k, 0) == 0 for k in EVENT_CHECKS)


def event_stats(changes: Sequence[Any], events: Sequence[Any]) -> dict[str, int]:
    """The public memory events against the changelog, both read committed, per partition:
    a change without its event, an event without its change, and a partition whose two
    sequences of change ids differ (each change's event is in its transaction; a
    ``restate`` change has none: topics.publishing.is_public)."""
    def ids(records: Sequence[Any]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = defaultdict(list)
        for r in records:
            value = json.loads(r.value)
            if value.get("op") not in PRIVATE_OPS:
                out[r.partition].append(value["change_id"])
        return out

    c, e = ids(changes), ids(events)
    every_c = {x for v in c.values() for x in v}
    every_e = {x for v in e.values() for x in v}
    return {"events_missing": len(every_c - every_e), "events_unexpected": len(every_e - every_c),
            "event_partitions_out_of_order": sum(c.get(n) != e.get(n) for n in set(c) | set(e))}


def decision_stats(values: Iterable[bytes]) -> dict[str, int]:
    """Jobs decided more than once, read tolerantly from raw decision records.

    ``decisions_beyond_first_per_job_id``: records per job id beyond the first (a re-sent or
    re-consumed job is decided again). ``distinct_decisions_beyond_first_per_user_seq``:
    different done/trivial decisions (status, change ids, ops, memories, texts) per user and
    job ``seq`` (per job id where records carry no seq), beyond the first.
    """
    per_job: Counter[str] = Counter()
    distinct: dict[tuple[str, ...], set[str]] = defaultdict(set)
    statuses: Counter[str] = Counter()
    for value in values:
        d = json.loads(value)
        per_job[d["job_id"]] += 1
        statuses[str(d.get("status"))] += 1
        if d.get("status") not in ("done", "trivial"):
            continue
        seq = d.get("seq") or 0
        key = (d["tenant_id"], d["user_id"], f"seq:{seq}" if seq else f"job:{d['job_id']}")
        distinct[key].add(json.dumps([d.get("status"), [
            (c.get("change_id"), c.get("op"), c.get("memory_id"),
             (c.get("after") or {}).get("content")) for c in d.get("changes", [])]],
            ensure_ascii=False))
    return {"decision_records": sum(per_job.values()), "jobs_decided": len(per_job),
            "decisions_beyond_first_per_job_id": sum(n - 1 for n in per_job.values()),
            "jobs_decided_more_than_once": sum(n > 1 for n in per_job.values()),
            "distinct_decisions_beyond_first_per_user_seq":
                sum(len(s) - 1 for s in distinct.values()),
            **{f"decisions_{k}": n for k, n in sorted(statuses.items())}}


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def restart_stats(workers: Sequence[WorkerProcess], outputs: Sequence[float],
                  end: float) -> dict[str, Any]:
    """Per restart (every run of a worker after its first): seconds to its Ready log line
    and to the first record produced on an output topic (jobs, decisions, results,
    changes; aborted transactions included) after it was spawned (with several workers,
    by any of them: the cluster's first output). Runs that ended before Ready (killed
    during start-up, or exited while the broker was away) and ready runs with no output
    before they ended are counted apart."""
    stamps = sorted(outputs)
    to_output: list[float] = []
    to_ready: list[float] = []
    restarts = silent = 0
    for worker in workers:
        runs = worker.incarnations
        restarts += len(runs) - 1
        to_ready += [r.ready_at - r.spawned_at for r in runs[1:] if r.ready_at is not None]
        for i, run in enumerate(runs[1:], start=1):
            until = runs[i + 1].spawned_at if i + 1 < len(runs) else end
            at = bisect.bisect_left(stamps, run.spawned_at)
            if at < len(stamps) and stamps[at] < until:
                to_output.append(stamps[at] - run.spawned_at)
            elif run.ready_at is not None:
                silent += 1
    return {"restarts": restarts, "never_ready": restarts - len(to_ready),
            "ready_no_output": silent, "with_output": len(to_output),
            "to_first_output_p50_s": pct(to_output, 0.5),
            "to_first_output_max_s": round(max(to_output), 2) if to_output else None,
            "to_ready_p50_s": pct(to_ready, 0.5),
            "to_ready_max_s": round(max(to_ready), 2) if to_ready else None}


def uncovered(results: Iterable[bytes], expected: Mapping[tuple[str, str], int],
              ) -> list[tuple[str, str, int, int]]:
    """Sessions not fully covered by done / trivial job results (union of their ranges):
    (user, session, messages covered from the start, messages)."""
    ranges: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for value in results:
        d = json.loads(value)
        if d.get("status") in ("done", "trivial"):
            ranges[(d["user_id"], d["session_id"])].append((d["from_seq"], d["to_seq"]))
    out = []
    for key, n in expected.items():
        reach = 0
        for lo, hi in sorted(ranges.get(key, [])):
            if lo <= reach:
                reach = max(reach, hi)
        if reach < n:
            out.append((*key, reach, n))
    return sorted(out)


# --------------------------------------------------------------------------- running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_settings(bootstrap: str, work: Path, **overrides: Any) -> Settings:
    """A worker on its own uuid topics, data dir, web port, API key and cluster secret."""
    name = f"chaos-{uuid.uuid4().hex[:8]}"
    base: dict[str, Any] = {
        "bootstrap_servers": bootstrap, "topic_prefix": name, "app_id": name, "partitions": 4,
        "data_dir": work / name, "web_enabled": True, "web_port": free_port(),
        "admin_key": SecretStr(secrets.token_hex(16)), "extract_enabled": True,
        # the workers of a cluster prove who they are in their groups (several: required)
        "cluster_secret": SecretStr(secrets.token_hex(32)),
        "tick_interval_s": 1.0, "session_timeout_s": 10.0, "heartbeat_interval_s": 1.0,
        "job_timeout_s": 60.0,
    }
    return Settings(**{**base, **overrides})


def api_open(settings: Settings, path: str, key: str, timeout: float) -> Any:
    """``urlopen`` of one of the worker's routes, over HTTPS verified with the run's CA when
    the workers serve TLS (``--tls``)."""
    scheme = "https" if settings.web_tls else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{settings.web_port}{path}",
                                 headers={"X-API-Key": key})
    context = client_ssl(settings.web_tls_ca) if settings.web_tls else None
    return urllib.request.urlopen(req, timeout=timeout, context=context)


def tls_settings(work: Path) -> dict[str, Any]:
    """The settings of workers serving HTTPS with a throw-away CA (``--tls``)."""
    files = write_dev_tls(work / "tls")
    return {"web_tls_cert": files.cert, "web_tls_key": files.key, "web_tls_ca": files.ca}


def cluster_settings(settings: Settings, workers: int, processes: int = 1) -> list[Settings]:
    """One worker: ``settings`` (with ``processes`` > 1: a supervisor of that many children
    on the partitioned store, its front port with free ports above it). Several: each on
    the partitioned store (a shard per partition, standbys on the others) with its own data
    dir, API port and instance id."""
    if workers == 1 and processes > 1:
        return [settings.model_copy(update={
            "processes": processes, "store_partitioned": True,
            "web_port": free_port_block(processes)})]
    if workers == 1:
        return [settings]
    return [settings.model_copy(update={
        "data_dir": settings.data_dir / f"w{i}", "web_port": free_port(),
        "group_instance_id": f"w{i}", "store_partitioned": True}) for i in range(workers)]


def children_of(node: Settings) -> list[Settings]:
    """The settings a supervisor's children answer on (their own ports)."""
    n = node.processes if isinstance(node.processes, int) else 1
    return [node.model_copy(update={"web_port": node.web_port + 1 + i, "processes": 1})
            for i in range(n)]


async def cluster_serving(nodes: Sequence[Settings], timeout: float = 300.0) -> float:
    """Seconds until every worker's ``/v1/cluster`` names them all and serves every
    partition it owns."""
    t0 = time.monotonic()

    def serving(node: Settings) -> bool:
        assert node.admin_key is not None
        try:
            with api_open(node, "/v1/cluster", node.admin_key.get_secret_value(),
                          10) as resp:
                status = json.loads(resp.read())
        except OSError:
            return False
        return len(status["workers"]) == len(nodes) and serves_what_it_owns(status)

    while time.monotonic() - t0 < timeout:
        if all([await asyncio.to_thread(serving, n) for n in nodes]):
            return round(time.monotonic() - t0, 1)
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the {len(nodes)} workers did not all serve within {timeout:.0f}s")


def _wire(e: Event, topics: Topics, stamp: bool = True) -> tuple[str, bytes, bytes]:
    """Topic, value and key of an event, stamped with the time it is sent (``stamp``;
    otherwise its own ``ts``, the time it happened)."""
    stamped = e.model_copy(update={"ts": datetime.now(UTC)}) if stamp else e
    topic = topics.messages if isinstance(e, ChatMessage) else topics.session_events
    return topic.name, stamped.dumps(), e.key().encode()


def shuffle_producers(events: Sequence[Event], rng: random.Random, rate: float,
                      window: int = 3) -> list[Event]:
    """Several producers per user, delivering out of event-time order: every event keeps
    the time it happened (its place in the scenario at ``rate``), and each user's chat
    messages are delivered shuffled within runs of ``window`` of that user's messages
    (session ends stay where they are). The truth is unchanged: the newest by event time."""
    start = datetime.now(UTC).timestamp()
    stamped = [e.model_copy(update={"ts": datetime.fromtimestamp(start + i / rate, UTC)})
               for i, e in enumerate(events)]
    places: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(stamped):
        if isinstance(e, ChatMessage):
            places[e.user_id].append(i)
    out = list(stamped)
    for slots in places.values():
        mine = [stamped[i] for i in slots]
        for at in range(0, len(mine), window):
            chunk = mine[at:at + window]
            rng.shuffle(chunk)
            mine[at:at + window] = chunk
        for i, e in zip(slots, mine, strict=True):
            out[i] = e
    return out


def _failed(fut: asyncio.Future[Any]) -> bool:
    return fut.cancelled() or fut.exception() is not None


PRODUCERS = ("aiokafka", "librdkafka", "random")
LATE_S = 5.0  # an acknowledgement this late waited out a broker's loss (or a retry)


class Sender(Protocol):
    """One producer of the harness: ``send`` returns a future of the record's delivery
    report (its ``partition``); ``stop`` flushes and closes."""

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]: ...
    async def stop(self) -> None: ...


class _Aiokafka:
    def __init__(self, producer: Any) -> None:
        self.producer = producer

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = await self.producer.send(topic, value, key=key)
        return fut

    async def stop(self) -> None:
        await self.producer.stop()


class RandomPartitioner:
    """aiokafka's ``partitioner``: a random partition for every record, whatever its key."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, key: bytes | None, all_partitions: list[int],
                 available: list[int]) -> int:
        return self.rng.choice(all_partitions)


@dataclass(frozen=True)
class Delivered:
    """librdkafka's delivery report of one record."""

    partition: int
    offset: int


class DeliveryFailed(Exception):
    """librdkafka gave up on a record (its message.timeout.ms passed)."""


class _Librdkafka:
    """confluent_kafka.Producer (librdkafka) with its default partitioner, consistent_random
    (CRC-32 of the key), idempotent, acks=all. Its delivery reports are served by a poll
    task on the loop."""

    def __init__(self, settings: Settings, producing: Producing) -> None:
        from confluent_kafka import Producer

        if settings.kafka_security_protocol != "PLAINTEXT":
            raise SystemExit("--producer librdkafka: PLAINTEXT brokers only")
        self.loop = asyncio.get_running_loop()
        self.producing = producing
        self.producer = Producer({
            "bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True,
            "acks": "all", "linger.ms": 5, "message.timeout.ms": 180_000,
            "logger": logging.getLogger("librdkafka"), "error_cb": self._error})
        self.poller = asyncio.create_task(self._poll())

    def _error(self, err: Any) -> None:  # a broker away: librdkafka retries by itself
        self.producing.client_errors += 1

    async def _poll(self) -> None:
        while True:
            self.producer.poll(0)
            await asyncio.sleep(0.01)

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.loop.create_future()

        def report(err: Any, msg: Any) -> None:  # on poll() or flush(): maybe another thread
            def settle() -> None:
                if fut.done():
                    return
                if err is not None:
                    fut.set_exception(DeliveryFailed(str(err)))
                else:
                    fut.set_result(Delivered(msg.partition(), msg.offset()))
            self.loop.call_soon_threadsafe(settle)

        while True:
            try:
                self.producer.produce(topic, value, key, on_delivery=report)
                return fut
            except BufferError:  # its local queue is full: let it deliver
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.poller.cancel()
        left = await asyncio.to_thread(self.producer.flush, 60)
        if left:  # undelivered: failed, so the harness sends them again
            self.producer.purge()
            self.producer.poll(0)
        await asyncio.sleep(0)  # the reports' settle() calls


class Producing:
    """The harness's producers of one kind (``--producer``) and what they had acknowledged.

    ``aiokafka``: memstream's own client (murmur2 of the key: every record on its key's
    partition); ``librdkafka``: confluent_kafka.Producer with its default partitioner
    (consistent_random: CRC-32 of the key), idempotent, acks=all; ``random``: aiokafka with
    a random partition for every record. Each delivery report names the record's
    partition: one off murmur2(key) % partitions is misplaced, and the ingest stage must
    re-route it (once) through the repartition topic. Every acknowledged message id is
    kept: after the run each must be on the messages topic and covered."""

    def __init__(self, settings: Settings, kind: str = "aiokafka", seed: int = 0) -> None:
        if kind not in PRODUCERS:
            raise ValueError(f"producer {kind!r}: one of {', '.join(PRODUCERS)}")
        self.kind, self.partitions = kind, settings.partitions
        self.rng = random.Random(seed)
        self.acked_ids: dict[str, tuple[str, str]] = {}  # message id -> user, session
        self.acked_records = 0
        self.misplaced: Counter[str] = Counter()  # acknowledged records off their key's, by topic
        self.failures = 0  # a send failed: a fresh producer, from the first unacknowledged
        self.resent = 0  # events sent again after a failure (same message id)
        self.client_errors = 0  # librdkafka's error callbacks (brokers away; it retries)
        self.slowest_ack_s = 0.0  # send -> delivery report: a broker's loss shows here
        self.acked_late = 0  # acknowledged more than LATE_S after the send

    async def sender(self, settings: Settings) -> Sender:
        if self.kind == "librdkafka":
            return _Librdkafka(settings, self)
        extra = {"partitioner": RandomPartitioner(self.rng)} if self.kind == "random" else {}
        return _Aiokafka(await start_producer(settings, request_timeout_ms=180_000, **extra))

    def delivered(self, event: Event, topic: str, key: bytes, sent_at: float,
                  fut: asyncio.Future[Any]) -> None:
        """A record's delivery report (a done callback of its future)."""
        if _failed(fut):
            return
        self.acked_records += 1
        took = time.monotonic() - sent_at
        self.slowest_ack_s = max(self.slowest_ack_s, took)
        self.acked_late += took > LATE_S
        if isinstance(event, ChatMessage):
            self.acked_ids[event.message_id] = (event.user_id, event.session_id)
        if fut.result().partition != partition_of_key(key, self.partitions):
            self.misplaced[topic] += 1

    def figures(self) -> dict[str, Any]:
        return {"producer": self.kind, "acked_records": self.acked_records,
                "acked_messages": len(self.acked_ids),
                "misplaced_acked": sum(self.misplaced.values()),
                "misplaced_acked_by_topic": dict(sorted(self.misplaced.items())),
                "producer_resent": self.resent, "producer_client_errors": self.client_errors,
                "ack_slowest_s": round(self.slowest_ack_s, 1),
                f"acked_after_{LATE_S:.0f}s": self.acked_late}


async def produce(settings: Settings, events: Sequence[Event], rate: float,
                  stamp: bool = True, producing: Producing | None = None) -> int:
    """Send ``events`` at ``rate`` per second, in order, with ``producing``'s kind of
    producer (aiokafka by default); returns how many times sending failed. After a failure
    everything from the first unacknowledged event is sent again (a fresh idempotent
    producer, the same message ids: the ingest stage drops the repeats), and one user's
    order is never broken; ``producing`` counts the events sent again."""
    producing = producing if producing is not None else Producing(settings)
    start, paced, failures, i, high = time.monotonic(), 0, 0, 0, 0
    topics = registry(settings)
    while True:
        inflight: list[tuple[int, asyncio.Future[Any]]] = []
        first_failed: int | None = None
        try:
            sender = await producing.sender(settings)
        except Exception:
            failures += 1
            producing.failures += 1
            await asyncio.sleep(1.0)
            continue
        try:
            while i < len(events):
                delay = start + paced / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                topic, value, key = _wire(events[i], topics, stamp)
                fut = await sender.send(topic, value, key)
                fut.add_done_callback(partial(producing.delivered, events[i], topic, key,
                                              time.monotonic()))
                inflight.append((i, fut))
                producing.resent += i < high
                i, paced = i + 1, paced + 1
                high = max(high, i)
                while inflight and inflight[0][1].done():
                    if _failed(inflight[0][1]):
                        raise RuntimeError(f"event {inflight[0][0]} not sent")
                    inflight.pop(0)
            for _, fut in inflight:
                await fut
            return failures
        except Exception:
            unsent = [idx for idx, fut in inflight if not fut.done() or _failed(fut)]
            first_failed = min(unsent, default=i)
        finally:
            await sender.stop()
        failures += 1
        producing.failures += 1
        i = first_failed


class Chaos:
    """Kills and restarts the workers; revives any that exits on its own. With several
    workers (``--workers``) a crash while running hits each in turn (a random order each
    round), one during start-up or recovery the one just restarted."""

    def __init__(self, workers: Sequence[WorkerProcess], rng: random.Random) -> None:
        self.workers, self.rng = list(workers), rng
        self.kills: Counter[str] = Counter()  # "<planned moment>/<state at the kill>"
        self.by_worker: Counter[int] = Counter()
        self.self_exits = 0
        self.stall_restarts = 0
        self.last = 0  # the worker crashed last
        self.turns: list[int] = []
        self.misplaced_before_kills: list[int | None] = []  # its counter, scraped
        self.killed_at: list[tuple[float, int, str]] = []  # wall time, worker, moment
        self.child_kills: Counter[int] = Counter()  # --processes: kills per child

    async def _revive(self, worker: WorkerProcess) -> None:
        self.self_exits += 1
        await asyncio.sleep(1.0)
        worker.spawn()

    async def _revive_exited(self) -> None:
        for worker in self.workers:
            if worker.poll() == "exited":
                await self._revive(worker)

    @staticmethod
    def _ready(worker: WorkerProcess) -> bool:
        return worker.all_ready()  # a supervisor's: every child in its current run

    async def hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await self._revive_exited()
            await asyncio.sleep(0.1)

    async def until_ready(self, timeout: float = 300.0) -> bool:
        """Every worker ready."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            await self._revive_exited()
            if all(self._ready(w) for w in self.workers):
                return True
            await asyncio.sleep(0.1)
        return False

    async def crash(self, moment: str) -> None:
        """SIGKILL now and spawn at once (the next kill may hit the start-up); the worker's
        ``misplaced_records`` counter is scraped first (a kill resets it)."""
        if moment == "running":  # every worker in turn, in a random order each round
            if not self.turns:
                self.turns = self.rng.sample(range(len(self.workers)), len(self.workers))
            self.last = self.turns.pop()
        worker = self.workers[self.last]
        self.misplaced_before_kills.append(
            await asyncio.to_thread(misplaced_counter, worker.settings))
        self.kills[f"{moment}/{worker.poll()}"] += 1
        self.killed_at.append((round(time.time(), 1), self.last, moment))
        self.by_worker[self.last] += 1
        if worker.processes() > 1:  # one child, at random: its supervisor restarts it
            child = self.rng.randrange(worker.processes())
            self.child_kills[child] += 1
            await asyncio.to_thread(worker.kill_child, child)
            return
        worker.kill()
        worker.spawn()

    def restart_all(self) -> None:
        for worker in self.workers:
            worker.restart(kill=False, wait=False)

    async def run(self, kills: int, spread: float, produced: asyncio.Event) -> None:
        """``kills`` crashes: first while running, then at random while running, during
        start-up (before Ready) or during recovery (just after Ready); then keep the
        workers alive until everything is produced."""
        moments = ["running", "startup", "recovery"][: max(0, kills - 1)]
        moments += self.rng.choices(["running", "startup", "recovery"], [2, 1, 1],
                                    k=max(0, kills - 1 - len(moments)))
        self.rng.shuffle(moments)
        for moment in ["running", *moments][:kills]:
            if moment == "startup":
                await self.hold(self.rng.uniform(0.3, 4.0))
            elif moment == "recovery":
                await self.until_ready()
                await self.hold(self.rng.uniform(0.0, 2.0))
            else:
                await self.until_ready()
                await self.hold(self.rng.uniform(0.3, 1.7) * spread)
            await self.crash(moment)
        await self.until_ready()
        while not produced.is_set():
            await self.hold(0.5)


def misplaced_counter(settings: Settings) -> int | None:
    """The worker's ``memstream_misplaced_records_total`` (None: not answering)."""
    assert settings.admin_key is not None
    try:
        with api_open(settings, "/metrics", settings.admin_key.get_secret_value(), 3) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("memstream_misplaced_records_total "):
            return int(float(line.split()[-1]))
    return None


class LeaderChaos:
    """SIGKILLs, ``kills`` times, the cluster node that leads the busiest partition at that
    moment (of the messages and memory-change topics, the most records written in the
    last ``window`` seconds), restarts it after ``down_s`` on its config and data, and
    waits until every partition's ISR is full again before the next kill."""

    def __init__(self, cluster: local_broker.Cluster, settings: Settings,
                 down_s: float = 5.0, window: float = 2.0) -> None:
        t = registry(settings)
        self.cluster, self.settings = cluster, settings
        self.tps = [TopicPartition(spec.name, p) for spec in (t.messages, t.memory_changes)
                    for p in range(spec.partitions)]
        self.down_s, self.window = down_s, window
        self.kills: list[dict[str, Any]] = []

    async def _ends(self, consumer: Any) -> dict[TopicPartition, int]:
        for _ in range(30):  # a node just killed: the metadata moves on
            try:
                return dict(await consumer.end_offsets(self.tps))
            except Exception:
                await asyncio.sleep(1.0)
        return {}

    async def busiest(self) -> tuple[TopicPartition, int]:
        """The partition with the most records written in the last ``window`` seconds (the
        most in all, among equals), and that many."""
        consumer = kafka.consumer(self.settings, enable_auto_commit=False, group_id=None)
        await consumer.start()
        try:
            before = await self._ends(consumer)
            await asyncio.sleep(self.window)
            after = await self._ends(consumer)
        finally:
            await consumer.stop()
        tp = max(self.tps, key=lambda tp: (after.get(tp, 0) - before.get(tp, 0),
                                           after.get(tp, 0)))
        return tp, after.get(tp, 0) - before.get(tp, 0)

    async def run(self, kills: int, spread: float) -> None:
        """Kill ``k`` is due ``spread × (k + 0.5)`` seconds from now, and never before the
        ISR is full again after the previous one."""
        t0 = time.monotonic()
        for k in range(kills):
            await asyncio.sleep(max(0.0, t0 + spread * (k + 0.5) - time.monotonic()))
            tp, written = await self.busiest()
            leaders: dict[tuple[str, int], int] = {}
            for _ in range(30):
                with contextlib.suppress(Exception):
                    leaders = await self.cluster.leaders()
                if leaders.get((tp.topic, tp.partition), -1) > 0:
                    break
                await asyncio.sleep(1.0)
            node = leaders.get((tp.topic, tp.partition), -1)
            if node < 0:
                continue
            kill = {"at_s": round(time.monotonic() - t0, 1), "at": round(time.time(), 1),
                    "node": node,
                    "topic": tp.topic.rsplit(".", 1)[-1], "partition": tp.partition,
                    "written_in_window": written,
                    "led_partitions": sum(n == node for n in leaders.values()),
                    "led_internal": sum(n == node for (t, _), n in leaders.items()
                                        if t.startswith("__"))}
            t_kill = time.monotonic()
            await asyncio.to_thread(self.cluster.kill, node)
            await asyncio.sleep(self.down_s)
            await asyncio.to_thread(self.cluster.restart, node, 300.0)
            kill["started_s"] = round(time.monotonic() - t_kill, 1)
            try:
                await self.cluster.wait_in_sync(300.0)
                kill["in_sync_s"] = round(time.monotonic() - t_kill, 1)
            except Exception:
                kill["in_sync_s"] = None
            self.kills.append(kill)

    def figures(self) -> dict[str, Any]:
        synced = [k["in_sync_s"] for k in self.kills if k["in_sync_s"] is not None]
        return {"leader_kills_done": len(self.kills), "leader_kills": self.kills,
                "leader_kill_to_in_sync_max_s": max(synced) if synced else None,
                "leader_kills_never_in_sync": sum(k["in_sync_s"] is None for k in self.kills)}


TAKE_LINE = re.compile(r"\] apply loop: partitions \[[^]]*\] \(new \[[^]]*\], "
                       r"being taken \[([\d, ]*)\]\)")
TAKEN_LINE = re.compile(r"\] apply partition (\d+) taken in ")


def taking_shards(text: str) -> bool:
    """Does this worker's log (its current run) show an apply take in progress: partitions
    being taken (their shards restored) since its last assignment, not all taken yet?"""
    found = list(TAKE_LINE.finditer(text))
    if not found:
        return False
    last = found[-1]
    being = {int(n) for n in last.group(1).split(",") if n.strip()}
    return bool(being - {int(n) for n in TAKEN_LINE.findall(text, last.end())})


async def bounce_broker(broker: Settings, at: float, down_s: float = 5.0,
                        workers: Sequence[WorkerProcess] = (), wait_s: float = 120.0,
                        ) -> tuple[float, bool | None]:
    """Stop the local broker ``at`` seconds from now and start it again; seconds it was out,
    and (``workers`` given) whether it went down while one of them was taking partitions:
    from ``at`` on, it waits up to ``wait_s`` for such a moment (a worker's restart)."""
    await asyncio.sleep(at)
    in_take: bool | None = None
    if workers:
        deadline = time.monotonic() + wait_s
        while not (in_take := any(taking_shards(w.log_text()) for w in workers)):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
    t0 = time.monotonic()
    await asyncio.to_thread(local_broker.stop, broker)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(local_broker.start, broker, 180.0)
    return time.monotonic() - t0, in_take


async def read_topics(settings: Settings, topics: Sequence[tuple[str, int]], *,
                      committed: bool = True, quiet: float = 3.0) -> list[Any]:
    """Every record of ``(topic, partitions)``, in offset order per partition; with
    ``committed=False`` records of aborted transactions too."""
    consumer = kafka.consumer(
        settings, enable_auto_commit=False, group_id=None,
        isolation_level="read_committed" if committed else "read_uncommitted")
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        records: list[Any] = []
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            if all([await consumer.position(tp) >= end[tp] for tp in tps]):
                break
            batch = await consumer.getmany(timeout_ms=500)
            for part in batch.values():
                records += part
            if batch:
                last = time.monotonic()
        return records
    finally:
        await consumer.stop()


async def settle(settings: Settings, chaos: Chaos, events: Sequence[Event], timeout: float,
                 stall_s: float = 120.0, max_stalls: int = 2,
                 producing: Producing | None = None,
                 ) -> tuple[list[tuple[str, str, int, int]], int]:
    """End every session (again), then wait until every session's messages are covered by
    done / trivial results. Without progress for ``stall_s`` the worker is restarted
    (gracefully); after ``max_stalls`` such restarts in a row it gives up. Returns the
    sessions left uncovered and how many sessions there are."""
    expected = Counter((e.user_id, e.session_id) for e in events if isinstance(e, ChatMessage))
    await chaos.until_ready()
    ends = [SessionEvent(tenant_id=TENANT, user_id=u, session_id=s, ts=datetime.now(UTC))
            for u, s in expected]
    await produce(settings, ends, rate=2000.0, producing=producing)
    spec = registry(settings).job_results
    consumer = kafka.consumer(settings, spec.name, auto_offset_reset="earliest",
                              enable_auto_commit=False, group_id=None,
                              isolation_level="read_committed")
    await consumer.start()
    values: list[bytes] = []
    left = uncovered(values, expected)
    progress, stalls = time.monotonic(), 0
    deadline = time.monotonic() + timeout
    try:
        while left and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            values += [r.value for part in batch.values() for r in part]
            now_left = uncovered(values, expected)
            if len(now_left) < len(left):
                left, progress, stalls = now_left, time.monotonic(), 0
            elif time.monotonic() - progress > stall_s:
                if stalls == max_stalls:
                    break
                stalls += 1
                chaos.stall_restarts += 1
                chaos.restart_all()
                progress = time.monotonic()
            await chaos.hold(0.5)
    finally:
        await consumer.stop()
    return left, len(expected)


def http_live(settings: Settings, users: Iterable[str]) -> dict[str, list[str]]:
    """Each user's live memory texts from the worker's ``GET /v1/memories`` view."""
    assert settings.admin_key is not None
    key = settings.admin_key.get_secret_value()
    out: dict[str, list[str]] = {}
    for user in users:
        path = f"/v1/tenants/{TENANT}/users/{user}/memories?limit=500"
        for attempt in range(30):  # 503: a partition still moving between workers
            try:
                with api_open(settings, path, key, 30) as resp:
                    out[user] = [m["content"] for m in json.loads(resp.read())["memories"]
                                 if m.get("slot") != "reflection:profile"]  # not a fact
                break
            except OSError:
                if attempt == 29:
                    raise
                time.sleep(2.0)
    return out


def explain(changes: Sequence[MemoryChange], missing: Sequence[tuple[str, str]],
            ) -> list[str]:
    """For a text the replay lost: every change of that user touching it, in log order."""
    out = []
    for user, text in missing:
        for c in changes:
            if c.user_id == user and text in (str((c.before or {}).get("content")),
                                              str(c.after.get("content"))):
                out.append(f"{user} {c.op} {c.lineage.kind} {c.memory_id[:8]} v{c.version} "
                           f"{c.after.get('status')} {c.change_id[:8]} {c.reason[:60]}")
    return out


def replay(changes: Sequence[MemoryChange], turns: list[dict[str, Any]] | None = None,
           ) -> tuple[dict[str, list[str]], list[str]]:
    """Each user's live memory texts after replaying the change log, in topic order, into
    an empty in-memory Qdrant (one collection per user keeps the local mode fast), and the
    changes that could not be applied (e.g. closing a version the log never created).
    ``turns``: filled with the payloads of the archived turns the replayed stores hold."""
    import warnings

    from qdrant_client import QdrantClient

    from memstream.memory.applying import apply_change
    from memstream.memory.store import Scope
    from memstream.memory.store.server import ServerStore

    warnings.filterwarnings("ignore", message="Payload indexes have no effect")
    client = QdrantClient(":memory:")
    dim = next((len(c.vector) for c in changes if c.vector), 512)
    stores: dict[tuple[str, str], ServerStore] = {}
    failed: list[str] = []
    for c in changes:
        key = (c.tenant_id, c.user_id)
        if key not in stores:
            stores[key] = ServerStore(f"replay-{len(stores)}", dim, client=client)
        try:
            apply_change(stores[key], c)
        except Exception as exc:  # a broken log is a finding, not a crash of the benchmark
            failed.append(f"{c.user_id} {c.op} {c.memory_id[:8]} v{c.version}: "
                          f"{type(exc).__name__}")
    out = {user: [m.content for m in store.list(Scope(tenant, user))
                  if m.extra.get("kind") != "reflection"]  # the windowed jobs' own
           for (tenant, user), store in stores.items()}
    if turns is not None:
        turns += [p for store in stores.values() for _, p, _ in store.scan()
                  if p.get("status") == TURN_STATUS]
    client.close()
    return out, failed


def worker_store_turns(nodes: Sequence[Settings], dim: int) -> list[dict[str, Any]]:
    """The archived turns in the workers' own stores, read from disk once they are stopped:
    a worker's store (its current one), or every shard of the partitioned store (owned and
    standby copies alike: one record per turn in all)."""
    from memstream.memory.store.edge import EdgeStore
    from memstream.memory.store.partitioned import SHARDS_DIR
    from memstream.memory.store.switch import current_store_path

    paths: list[Path] = []
    members = [n.model_copy(update={"data_dir": n.data_dir / f"p{i}"})
               for n in nodes if isinstance(n.processes, int) and n.processes > 1
               for i in range(n.processes)]
    for node in [n for n in nodes if n.processes in (1, "1")] + members:
        if node.store_partitioned:
            root = node.data_dir / SHARDS_DIR
            paths += sorted(d for d in root.iterdir() if d.is_dir() and (
                d.name.isdigit() or d.name == "global")) if root.is_dir() else []
        else:
            paths.append(current_store_path(node))
    found: dict[TurnKey, dict[str, Any]] = {}
    for path in paths:
        store = EdgeStore(path, dim)
        try:
            for _, payload, _ in store.scan(TENANT):
                if payload.get("status") == TURN_STATUS:
                    found.setdefault(turn_key(payload), payload)
        finally:
            store.close()
    return list(found.values())


@dataclass
class Outcome:
    """Everything one chaos run measured: figures, and the check of each view."""

    figures: dict[str, Any]
    http: Report
    replayed: Report
    archive: ArchiveReport = field(default_factory=ArchiveReport)


async def acked_and_placed(settings: Settings, producing: Producing,
                           left: Sequence[tuple[str, str, int, int]]) -> dict[str, Any]:
    """What the producers had acknowledged against the topics, read committed: message ids
    acknowledged but not on the messages topic (lost), acknowledged in a session left
    uncovered; records of the producers' topics off their key's partition against the
    records on the repartition topic (each misplaced record re-routed exactly once)."""
    t = registry(settings)
    placed = await read_topics(settings, [(spec.name, spec.partitions)
                                          for spec in t.placed_by_producers()])
    rerouted = await read_topics(settings, [(t.repartition.name, t.repartition.partitions)])
    on_topic = {json.loads(r.value)["message_id"] for r in placed if r.topic == t.messages.name}
    lost = sorted(set(producing.acked_ids) - on_topic)
    open_sessions = {(user, session) for user, session, *_ in left}
    acked_open = [m for m, where in producing.acked_ids.items() if where in open_sessions]
    n = t.messages.partitions  # co-partitioned: session events alike
    off = [r for r in placed if r.key is not None and r.partition != partition_of_key(r.key, n)]
    return {**producing.figures(), "acked_lost": len(lost), "acked_lost_examples": lost[:5],
            "acked_uncovered": len(acked_open), "message_records": sum(
                r.topic == t.messages.name for r in placed),
            "misplaced_on_topics": len(off),
            "repartition_records": len(rerouted)}


async def run_chaos(settings: Settings, events: Sequence[Event], truth: Mapping[str, Truth],
                    *, kills: int, work: Path, rate: float = 100.0, seed: int = 7,
                    broker: Settings | None = None, settle_timeout: float = 900.0,
                    keep_topics: bool = False, shuffle: bool = False,
                    workers: int = 1, processes: int = 1,
                    cluster: local_broker.Cluster | None = None,
                    kill_leader: int = 0, leader_down_s: float = 5.0,
                    producer: str = "aiokafka", broker_in_take: bool = False) -> Outcome:
    """Produce ``events`` at ``rate`` with ``producer``'s kind of client while the
    ``workers`` are killed ``kills`` times in all (and the broker of ``broker`` is restarted
    once, mid-way (``broker_in_take``: at the first moment from then on that a worker is
    taking partitions); or the leader of the busiest partition of ``cluster`` is SIGKILLed
    ``kill_leader`` times), settle, and check both views (the HTTP one through the first
    worker, which forwards to the owners) and every acknowledged message."""
    t0 = time.time()
    topics = registry(settings)
    if shuffle:
        events = shuffle_producers(events, random.Random(seed + 1), rate)
    layout = await prepare(settings)
    nodes = cluster_settings(settings, workers, processes)
    procs = [WorkerProcess(n, work / f"{n.app_id}-{i}.log") for i, n in enumerate(nodes)]
    chaos = Chaos(procs, random.Random(seed))
    producing = Producing(settings, producer, seed)
    leaders = LeaderChaos(cluster, settings, leader_down_s) if cluster and kill_leader else None
    figures: dict[str, Any] = {"replication_factor": layout.replication.factor,
                               "min_insync_replicas": layout.replication.min_insync,
                               "brokers": layout.replication.brokers}
    try:
        for proc in procs:
            proc.spawn()
        for proc in procs:
            if not await proc.wait_ready_async(300):
                raise RuntimeError(f"worker not ready: {proc.log_text()[-2000:]}")
        figures["first_ready_s"] = round(
            time.time() - min(p.incarnations[0].spawned_at for p in procs), 1)
        if workers > 1:  # every worker serving its partitions before the first crash
            figures["cluster_serving_s"] = await cluster_serving(nodes)
        if processes > 1:  # every child serving its partitions before the first crash
            figures["cluster_serving_s"] = await cluster_serving(children_of(nodes[0]))
        produce_s = len(events) / rate
        produced = asyncio.Event()

        async def producing_all() -> int:
            try:
                return await produce(settings, events, rate, stamp=not shuffle,
                                     producing=producing)
            finally:
                produced.set()

        tasks: list[Any] = [producing_all(), chaos.run(kills, produce_s / max(kills, 1),
                                                       produced)]
        if broker is not None:
            tasks.append(bounce_broker(broker, at=produce_s / 2,
                                       workers=procs if broker_in_take else ()))
        if leaders is not None:
            tasks.append(leaders.run(kill_leader, produce_s / kill_leader))
        done = await asyncio.gather(*tasks)
        figures["producer_failures"] = done[0]
        if broker is not None:
            figures["broker_out_s"] = round(done[2][0], 1)
            figures["broker_down_in_take"] = done[2][1]
        t_chaos = time.time()
        left, sessions = await settle(settings, chaos, events, settle_timeout,
                                      producing=producing)
        t_settled = time.time()
        await chaos.until_ready()
        if cluster is not None:
            figures["cluster_in_sync_at_end"] = not await cluster.out_of_sync()
        figures["misplaced_counter"] = {
            "before_kills": chaos.misplaced_before_kills,
            "at_end": [await asyncio.to_thread(misplaced_counter, n) for n in nodes]}
        http = await asyncio.to_thread(http_live, nodes[0], sorted(truth))
        b = settings
        change_records = await read_topics(
            b, [(topics.memory_changes.name, topics.memory_changes.partitions)])
        changes = [MemoryChange.model_validate_json(r.value) for r in change_records]
        public = await read_topics(
            b, [(topics.memory_events.name, topics.memory_events.partitions)])
        decisions = await read_topics(b, [(topics.decisions.name, topics.decisions.partitions)])
        job_rows = [json.loads(r.value) for r in await read_topics(
            b, [(topics.jobs.name, topics.jobs.partitions)])]
        jobs = Counter(j["job_id"] for j in job_rows)
        outputs = await read_topics(b, [(t.name, t.partitions) for t in (
            topics.jobs, topics.decisions, topics.job_results, topics.memory_changes)],
            committed=False)
        figures.update(await acked_and_placed(b, producing, left))
        if leaders is not None:
            figures.update(leaders.figures())
        end = time.time()
        figures.update({
            "chaos_s": round(t_chaos - t0, 1), "settle_s": round(t_settled - t_chaos, 1),
            "runtime_s": round(end - t0, 1), "sessions": sessions,
            "sessions_covered": sessions - len(left),
            "uncovered_examples": [list(x) for x in left[:5]],
            "kills_done": sum(chaos.kills.values()),
            "child_kills": dict(sorted(chaos.child_kills.items())),
            "child_restarts": sum(p.log_text().count(CHILD_RESTARTED) for p in procs),
            "kills_by_moment": dict(sorted(chaos.kills.items())),
            "kills_by_worker": [chaos.by_worker[i] for i in range(workers)],
            "worker_kills_at": chaos.killed_at,
            "worker_self_exits": chaos.self_exits, "stall_restarts": chaos.stall_restarts,
            "job_records": sum(jobs.values()), "job_ids": len(jobs),
            "job_records_beyond_first": sum(n - 1 for n in jobs.values()),
            "job_records_resent_by_timeout": sum(j.get("attempt", 1) > 1 for j in job_rows),
            **change_stats(changes), **event_stats(change_records, public),
            **decision_stats(r.value for r in decisions),
            "restart": restart_stats(procs, [r.timestamp / 1000 for r in outputs], end),
        })
        replayed_turns: list[dict[str, Any]] = []
        replayed, failed = await asyncio.to_thread(replay, changes, replayed_turns)
        figures["replay_failed_changes"] = len(failed)
        figures["replay_failed_examples"] = failed[:5]
        wanted = expected_turns(events)
        archived = check_archive(wanted, changes)
        figures["archive_replay"] = check_stored_turns(wanted, replayed_turns)
        for proc in procs:  # their stores read from disk: no writer left
            proc.stop()
        dim = next((len(c.vector) for c in changes if c.vector), 0)
        figures["archive_worker_store"] = check_stored_turns(
            wanted, await asyncio.to_thread(worker_store_turns, nodes, dim)) if dim else None
        figures["archive_examples"] = {
            "missing": [list(k) for k in archived.missing[:5]],
            "duplicate": [[*k, n] for k, n in archived.duplicate[:5]],
            "unexpected": [list(k) for k in archived.unexpected[:5]],
            "mismatched": [[*k, c] for k, c in archived.mismatched[:5]]}
        outcome = Outcome(figures, check(truth, http, "http"), check(truth, replayed, "replay"),
                          archived)
        figures["replay_missing_changes"] = explain(changes, outcome.replayed.missing[:3])
        return outcome
    finally:
        for proc in procs:
            proc.stop()
        if not keep_topics:
            await delete_topics(settings, all_topic_names(settings))


def summary(outcome: Outcome, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {**meta, **outcome.figures, "http": outcome.http.counts(),
            "replay": outcome.replayed.counts(), "archive": outcome.archive.counts()}


def stored(v: Mapping[str, int] | None) -> str:
    """A store's turn check (:func:`check_stored_turns`) as one table cell."""
    if not v:
        return "not read"
    return (f"{v['turn_records']} records; missing / unexpected {v['missing']} / "
            f"{v['unexpected']}, users with another count {v['users_count_off']}")


def print_report(outcome: Outcome, meta: Mapping[str, Any]) -> None:
    f = outcome.figures
    r = f["restart"]
    a = outcome.archive.counts()
    rows = [
        ("users / messages / sessions", f"{meta['users']} / {meta['messages']} / "
                                        f"{f['sessions']} ({f['sessions_covered']} covered)"),
        ("rate", f"{meta['rate']:.0f} msg/s"),
        ("kills (moment/state at kill)", f"{f['kills_done']} {f['kills_by_moment']}"),
        ("workers / kills per worker", f"{meta['workers']} / {f['kills_by_worker']}"),
        ("broker restarted (out, s)", f.get("broker_out_s", "no")),
        ("broker down while a worker took partitions", f.get("broker_down_in_take", "-")),
        ("worker self-exits / stall restarts", f"{f['worker_self_exits']} / "
                                               f"{f['stall_restarts']}"),
        ("producer failures (re-sent)", f["producer_failures"]),
    ]
    if "brokers" in f:
        rows.append(("brokers / replication / min.insync.replicas",
                     f"{f['brokers']} / {f['replication_factor']} / {f['min_insync_replicas']}"))
    for k in f.get("leader_kills", []):
        rows.append(("leader kill (node: topic/partition)",
                     f"node {k['node']} at {k['at_s']} s: {k['topic']}/{k['partition']} "
                     f"({k['written_in_window']} written in the window; it led "
                     f"{k['led_partitions']} partitions, {k['led_internal']} internal); "
                     f"started {k['started_s']} s, ISR full {k['in_sync_s']} s after the kill"))
    if "acked_records" in f:
        rows += [
            ("producer / records / messages acknowledged",
             f"{f['producer']} / {f['acked_records']} / {f['acked_messages']}"),
            ("acknowledged: lost / in uncovered sessions",
             f"{f['acked_lost']} / {f['acked_uncovered']}   (message records on the topic "
             f"{f['message_records']})"),
            ("producer retries: failures / events re-sent",
             f"{f['producer_failures']} / {f['producer_resent']}"
             f"   (client errors {f['producer_client_errors']}; acknowledged after "
             f"{LATE_S:.0f} s {f.get(f'acked_after_{LATE_S:.0f}s')}, slowest "
             f"{f.get('ack_slowest_s')} s)"),
            ("misplaced: acked / on the topics / re-routed",
             f"{f['misplaced_acked']} / {f['misplaced_on_topics']} / "
             f"{f['repartition_records']}"),
            ("misplaced_records counters: before kills / at end",
             f"{f['misplaced_counter']['before_kills']} / {f['misplaced_counter']['at_end']}"),
        ]
    for rep in (outcome.http, outcome.replayed):
        c = rep.counts()
        rows.append((f"{rep.view}: missing/stale/duplicate/unexpected",
                     f"{c['missing']} / {c['stale']} / {c['duplicate']} / {c['unexpected']}"
                     f"   (live {c['live']}, expected {c['expected']})"))
    rows += [
        ("archive: turns expected / archived / changes", f"{a['turns_expected']} / "
         f"{a['turns_archived']} / {a['archive_changes']}"),
        ("archive: missing / duplicate / unexpected / mismatched",
         f"{a['missing']} / {a['duplicate']} / {a['unexpected']} / {a['mismatched']}"),
        ("archived turns in the replayed store", stored(f.get("archive_replay"))),
        ("archived turns in the workers' stores", stored(f.get("archive_worker_store"))),
        ("change records / ids / republished", f"{f['change_records']} / {f['change_ids']} / "
                                               f"{f['change_records_republished']}"),
        ("change log: changes that fail to replay", f["replay_failed_changes"]),
        ("public events: missing / unexpected / partitions out of order",
         f"{f['events_missing']} / {f['events_unexpected']} / "
         f"{f['event_partitions_out_of_order']}"),
        ("change ids with differing payloads", f"{f['change_ids_differing_payloads']} "
                                               f"(content: {f['change_ids_differing_content']})"),
        ("job records / ids / beyond first (timeout)",
         f"{f['job_records']} / {f['job_ids']} / {f['job_records_beyond_first']} "
         f"({f['job_records_resent_by_timeout']})"),
        ("decisions beyond first per job id", f"{f['decisions_beyond_first_per_job_id']} "
                                              f"({f['jobs_decided_more_than_once']} jobs)"),
        ("distinct decisions beyond first / user seq",
         f["distinct_decisions_beyond_first_per_user_seq"]),
        ("restart -> first output p50 / max, s", f"{r['to_first_output_p50_s']} / "
         f"{r['to_first_output_max_s']}  ({r['with_output']} of {r['restarts']} restarts; "
         f"{r['never_ready']} never ready, {r['ready_no_output']} ready but silent)"),
        ("restart -> Ready p50 / max, s", f"{r['to_ready_p50_s']} / {r['to_ready_max_s']}"),
        ("runtime (chaos + settle), s", f"{f['runtime_s']} ({f['chaos_s']} + {f['settle_s']})"),
    ]
    for name, value in rows:
        print(f"{name:44} {value}")
    for failure in f["replay_failed_examples"]:
        print(f"  replay failed: {failure}")
    for _user, session, reach, n in f["uncovered_examples"]:
        print(f"  uncovered: {session} ({reach} of {n} messages covered)")
    for rep in (outcome.http, outcome.replayed):
        for kind in ("missing", "stale", "duplicate", "unexpected"):
            for item in getattr(rep, kind)[:5]:
                print(f"  {rep.view} {kind}: {item}")
    for kind, items in f.get("archive_examples", {}).items():
        for item in items:
            print(f"  archive {kind}: {item}")
    print(json.dumps(summary(outcome, meta), ensure_ascii=False))


def placement_consistent(row: Mapping[str, Any]) -> bool:
    """Every record a producer placed off its key's partition re-routed exactly once (the
    repartition topic holds as many records as the producers' topics hold misplaced ones),
    and every acknowledged misplaced record among them; rows from before the check count
    as consistent."""
    if "repartition_records" not in row:
        return True
    return (row["repartition_records"] == row["misplaced_on_topics"]
            and row["misplaced_acked"] <= row["misplaced_on_topics"])


def clean(row: Mapping[str, Any]) -> bool:
    """A run with nothing lost (acknowledged messages and archived turns included), stale,
    duplicated, uncovered, mis-routed or inconsistent."""
    views = (row["http"], row["replay"])
    return (row["sessions_covered"] == row["sessions"] and row["stall_restarts"] == 0
            and row["replay_failed_changes"] == 0
            and row["change_ids_differing_payloads"] == 0
            and events_consistent(row) and placement_consistent(row)
            and row.get("acked_lost", 0) == 0 and row.get("acked_uncovered", 0) == 0
            and row.get("leader_kills_never_in_sync", 0) == 0
            and archive_consistent(row)
            and all((v["missing"], v["stale"], v["duplicate"], v["unexpected"]) == (0, 0, 0, 0)
                    for v in views))


def pair(row: Mapping[str, Any], a: str, b: str) -> str:
    return f"{row.get(a, '-')}/{row.get(b, '-')}"


def print_runs(rows: Sequence[Mapping[str, Any]]) -> None:
    """One line per run (``--seeds``), then one JSON line for all of them."""
    head = (f"{'seed':>4} {'clean':>5} {'covered':>9} {'http m/s/d':>10} {'replay m/s/d':>12} "
            f"{'2 payloads':>10} {'bad replay':>10} {'re-sent':>7} {'stalls':>6} "
            f"{'exits':>5} {'out p50/max s':>13} {'settle s':>8} {'acked lost':>10} "
            f"{'misplaced/rerouted':>18} {'prod retries':>12} {'leader kills':>12} "
            f"{'turns arch/exp':>14} {'turns m/d/u':>11} {'store m/u':>9}")
    print(head)
    for row in rows:
        h, r, st = row["http"], row["replay"], row["restart"]
        ar, ws = row.get("archive") or {}, row.get("archive_worker_store") or {}
        turns = "/".join(str(ar.get(k, "-")) for k in ("missing", "duplicate", "unexpected"))
        print(f"{row['seed']:>4} {'yes' if clean(row) else 'NO':>5} "
              f"{row['sessions_covered']:>4}/{row['sessions']:<4} "
              f"{h['missing']:>4}/{h['stale']}/{h['duplicate']} "
              f"{r['missing']:>6}/{r['stale']}/{r['duplicate']} "
              f"{row['change_ids_differing_payloads']:>10} {row['replay_failed_changes']:>10} "
              f"{row['job_records_resent_by_timeout']:>7} {row['stall_restarts']:>6} "
              f"{row['worker_self_exits']:>5} "
              f"{st['to_first_output_p50_s']}/{st['to_first_output_max_s']!s:<7} "
              f"{row['settle_s']:>8} {row.get('acked_lost', '-'):>10} "
              f"{pair(row, 'misplaced_on_topics', 'repartition_records'):>18} "
              f"{pair(row, 'producer_failures', 'producer_resent'):>12} "
              f"{row.get('leader_kills_done', '-'):>12} "
              f"{pair(ar, 'turns_archived', 'turns_expected'):>14} "
              f"{turns:>11} "
              f"{pair(ws, 'missing', 'unexpected'):>9}")
    print(json.dumps({"runs": len(rows), "clean": sum(clean(r) for r in rows),
                      "rows": list(rows)}, ensure_ascii=False, default=str))


def seeds_of(text: str) -> list[int]:
    """``1-10`` or ``1,4,7``."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out


SMOKE = {"users": 4, "kills": 1, "rate": 50.0, "job_timeout": 15.0, "settle_timeout": 120.0}


def _own_broker(args: argparse.Namespace,
               ) -> tuple[Settings | None, local_broker.Cluster | None, bool]:
    """Start the run's own broker (``--brokers 1``) or cluster; whether this run started it."""
    if args.bootstrap is not None:
        return None, None, False
    port = args.port or (29092 if args.brokers == 1 else 29192)
    reuse = "; pass --reuse-broker if it is yours"
    if args.brokers == 1:
        if port in (9092, 19092):
            raise SystemExit("use a port of its own: the benchmark stops and starts its broker")
        broker = Settings(kafka_port=port, kafka_controller_port=port + 1)
        started = local_broker.read_pid(local_broker.paths_for(broker)) is None
        if not started and not args.reuse_broker:
            raise SystemExit(f"a broker already runs on {port}: it may be someone else's "
                             f"(this run stops it){reuse}")
        local_broker.start(broker, 180.0)
        return broker, None, started
    cluster = local_broker.Cluster(Settings(kafka_port=port), args.brokers)
    ports = {p for n in cluster.nodes for p in (n.port, n.controller_port)}
    if ports & {9092, 9093, 19092, 19093}:
        raise SystemExit(f"use a port of its own: a cluster on {port} would use "
                         f"{sorted(ports)}, the shared brokers' ports among them")
    started = not cluster.running()
    if not started and not args.reuse_broker:
        raise SystemExit(f"a cluster already runs on {port}: it may be someone else's "
                         f"(this run kills its nodes){reuse}")
    cluster.start(300.0)
    return None, cluster, started


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--users", type=int, default=None, help="default 40 (smoke 4)")
    ap.add_argument("--kills", type=int, default=None, help="default 6 (smoke 1)")
    ap.add_argument("--rate", type=float, default=None,
                    help="messages per second (default 100; smoke 50)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=1,
                    help="workers on the partitioned store; kills hit one at random")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--processes", type=int, default=1,
                    help="the worker as a supervisor of N member processes (one worker "
                    "only); a kill SIGKILLs one child, which the supervisor restarts")
    ap.add_argument("--shuffle-producers", action="store_true",
                    help="each user's messages delivered out of event-time order")
    ap.add_argument("--producer", choices=PRODUCERS, default="aiokafka",
                    help="aiokafka (murmur2: every record on its key's partition), "
                         "librdkafka (confluent_kafka, CRC-32 of the key) or random (a "
                         "random partition per record): misplaced records are re-routed")
    ap.add_argument("--brokers", type=int, default=1,
                    help="its own single broker (1), or a KRaft cluster of N nodes (3: "
                         "topics replicated 3, min.insync.replicas 2; no whole-broker "
                         "restart: --kill-leader SIGKILLs nodes instead)")
    ap.add_argument("--kill-leader", type=int, default=0, metavar="N",
                    help="SIGKILL the node leading the busiest partition N times (--brokers "
                         "2 or more), each restarted after --leader-down s, the ISR full "
                         "again before the next")
    ap.add_argument("--leader-down", type=float, default=5.0,
                    help="seconds a killed node stays down (default 5)")
    ap.add_argument("--seeds", default=None,
                    help="one run per seed (e.g. 1-10): a table of the runs, one JSON line")
    ap.add_argument("--no-broker-restart", action="store_true")
    ap.add_argument("--broker-in-take", action="store_true",
                    help="stop the broker while a worker is taking partitions (restoring "
                         "their shards after a kill), not at a fixed moment")
    ap.add_argument("--port", type=int, default=None,
                    help="the benchmark's own broker (default 29092) or cluster (default "
                         "29192: node i on 29192 + 10(i-1), its controller one above)")
    ap.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                    help="use this running broker: never started, stopped or restarted "
                         "(implies --no-broker-restart; --port is ignored)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny, to check it runs: 4 users, 1 kill, 50 msg/s, job timeout "
                         "15 s (explicit sizes win)")
    ap.add_argument("--job-timeout", type=float, default=None,
                    help="re-send a job after (s; default 60, smoke 15)")
    ap.add_argument("--settle-timeout", type=float, default=None,
                    help="default 900 (smoke 120)")
    ap.add_argument("--keep-broker", action="store_true", help="leave the broker running")
    ap.add_argument("--tls", action="store_true",
                    help="workers serve their API over HTTPS (a throw-away CA) and forward "
                    "to each other over it")
    ap.add_argument("--reuse-broker", action="store_true",
                    help="use (and restart) a broker already running on --port")
    args = ap.parse_args()
    sizes = {"users": 40, "kills": 6, "rate": 100.0, "job_timeout": 60.0,
             "settle_timeout": 900.0, **(SMOKE if args.smoke else {})}
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.brokers > 1 and args.bootstrap is not None:
        raise SystemExit("--brokers N starts its own cluster: leave out --bootstrap")
    if args.kill_leader and args.brokers < 2:
        raise SystemExit("--kill-leader needs a cluster: --brokers 3")
    if args.processes > 1 and args.workers > 1:
        raise SystemExit("--processes N runs one worker of N processes: leave out --workers")
    # Brokers are taken away on purpose: their clients' reconnect errors are expected.
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiokafka", "librdkafka"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    broker, cluster, started = _own_broker(args)
    if cluster is not None:
        bootstrap = cluster.bootstrap
    else:
        bootstrap = args.bootstrap or f"127.0.0.1:{broker.kafka_port if broker else 0}"
    restart_broker = broker is not None and not args.no_broker_restart
    rows = []
    try:
        for seed in seeds_of(args.seeds) if args.seeds else [args.seed]:
            work = Path(tempfile.mkdtemp(prefix=f"memstream-chaos-{seed}-"))
            events, truth = scenario(args.users, seed)
            settings = bench_settings(bootstrap, work,
                                      job_timeout_s=args.job_timeout,
                                      partitions=args.partitions,
                                      **(tls_settings(work) if args.tls else {}))
            meta = {"users": args.users,
                    "messages": sum(isinstance(e, ChatMessage) for e in events),
                    "kills": args.kills, "rate": args.rate, "workers": args.workers,
                    "processes": args.processes,
                    "partitions": args.partitions,
                    "seed": seed, "broker_restart": restart_broker,
                    "shuffle_producers": args.shuffle_producers,
                    "producer": args.producer, "brokers_asked": args.brokers,
                    "kill_leader": args.kill_leader, "leader_down_s": args.leader_down,
                    "tls": args.tls, "broker_in_take": args.broker_in_take,
                    "job_timeout_s": args.job_timeout, "work": str(work),
                    "smoke": args.smoke}
            outcome = asyncio.run(run_chaos(
                settings, events, truth, kills=args.kills, work=work, rate=args.rate,
                seed=seed, broker=broker if restart_broker else None,
                settle_timeout=args.settle_timeout, shuffle=args.shuffle_producers,
                workers=args.workers, processes=args.processes, cluster=cluster,
                kill_leader=args.kill_leader,
                leader_down_s=args.leader_down, producer=args.producer,
                broker_in_take=args.broker_in_take))
            print_report(outcome, meta)
            rows.append(summary(outcome, meta))
            if args.seeds:
                print_runs(rows)  # so far: a long loop can be read while it runs
    finally:
        if started and not args.keep_broker:
            if broker is not None:
                local_broker.stop(broker)
            if cluster is not None:
                cluster.stop()


if __name__ == "__main__":
    main()
