"""What benchmarks/scale.py produces and measures with: an open-ended conversation stream
with a known truth, the coverage of its messages by job results, the workers' log lines,
and the figures (drain rate, partition moves, failed-read windows). Pure, no I/O but the
log files; the memories are checked with benchmarks/chaos.py's ``check`` and ``replay``.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.chaos import EN, TENANT, ZH, Truth, _Person, _session, pct
from memstream.topics.schemas import ChatMessage, Event, MemoryChange

# --------------------------------------------------------------------------- the stream


class Stream:
    """Conversations of ``users`` users (chaos.py's people and sessions: facts whose final
    value is known), made on demand: :meth:`take` hands out the next events, a random user
    at a time (each user's order kept); :meth:`finish` the rest of every session begun.
    The truth of a user is their facts after the last session begun, so once ``finish``'s
    events are sent it is exact whatever was taken before."""

    def __init__(self, users: int, seed: int, zh_share: float = 0.3) -> None:
        rng = random.Random(seed)
        self.people: dict[str, _Person] = {}
        for i in range(users):
            lang = ZH if rng.random() < zh_share else EN
            user = f"{'zh' if lang is ZH else 'en'}-u{i:03d}"
            # each person their own generator: their sessions do not depend on the order
            # the users are picked in
            self.people[user] = _Person(lang, random.Random(rng.getrandbits(64)))
        self.users = list(self.people)
        self.pick = random.Random(rng.getrandbits(64))
        self.queue: dict[str, deque[Event]] = {u: deque() for u in self.users}
        self.begun: Counter[str] = Counter()  # sessions begun per user
        self.truths: dict[str, Truth] = {}
        self.expected: dict[tuple[str, str], int] = {}  # (user, session) -> chat messages

    def _next_session(self, user: str) -> None:
        person, s = self.people[user], self.begun[user]
        sid = f"{user}-s{s}"
        if s == 0:
            lines = person.intro()
        else:  # as chaos.scenario's later sessions
            lines = []
            want = person.rng.randint(1, 3)
            while len(lines) < want:
                line = person.statement()
                if line is not None:
                    lines.append(line)
            if person.rng.random() < 0.5:
                lines.insert(person.rng.randrange(len(lines) + 1), person.chat())
        events = _session(person, user, sid, lines)
        self.begun[user] += 1
        self.truths[user] = person.truth()
        self.expected[(user, sid)] = sum(isinstance(e, ChatMessage) for e in events)
        self.queue[user].extend(events)

    def take(self, n: int) -> list[Event]:
        out: list[Event] = []
        for _ in range(n):
            user = self.pick.choice(self.users)
            if not self.queue[user]:
                self._next_session(user)
            out.append(self.queue[user].popleft())
        return out

    def finish(self) -> list[Event]:
        """The rest of every session begun, interleaved (each user's order kept)."""
        order = [u for u in self.users for _ in self.queue[u]]
        self.pick.shuffle(order)
        return [self.queue[u].popleft() for u in order]

    def truth(self) -> dict[str, Truth]:
        return {u: self.truths.get(u, Truth(frozenset(), frozenset())) for u in self.users}


# --------------------------------------------------------------------------- coverage


class Coverage:
    """Messages covered by done / trivial job results, per session (the union of their
    ranges from the start, as chaos.uncovered counts), and when each was first covered."""

    def __init__(self) -> None:
        self.ranges: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        self.reach: dict[tuple[str, str], int] = defaultdict(int)
        self.covered = 0
        self.stamps: list[tuple[float, int]] = []  # (result's broker time, newly covered)
        self.statuses: Counter[str] = Counter()
        self.fenced: Counter[str] = Counter()  # fenced results per user
        self.last_gain = 0.0  # local time.time() of the last newly covered message

    def add(self, value: bytes | None, stamp: float, now: float) -> None:
        if value is None:
            return
        d = json.loads(value)
        self.statuses[str(d.get("status"))] += 1
        if d.get("status") == "fenced":
            self.fenced[str(d.get("user_id"))] += 1
        if d.get("status") not in ("done", "trivial"):
            return
        key = (d["user_id"], d["session_id"])
        self.ranges[key].append((int(d["from_seq"]), int(d["to_seq"])))
        reach = 0
        for lo, hi in sorted(self.ranges[key]):
            if lo <= reach:
                reach = max(reach, hi)
        gained = reach - self.reach[key]
        if gained > 0:
            self.reach[key] = reach
            self.covered += gained
            self.stamps.append((stamp, gained))
            self.last_gain = now

    def uncovered(self, expected: Mapping[tuple[str, str], int],
                  ) -> list[tuple[str, str, int, int]]:
        return sorted((u, s, self.reach.get((u, s), 0), n) for (u, s), n in expected.items()
                      if self.reach.get((u, s), 0) < n)


def version_conflicts(changes: Iterable[MemoryChange]) -> dict[str, Any]:
    """Versions of a memory that two different changes opened (an add or update whose
    ``(memory, version)`` another change id opened too): replayed, the memory ends with
    two live versions, or one overwrites the other."""
    opened: dict[tuple[str, str, str, int], dict[str, MemoryChange]] = defaultdict(dict)
    for c in changes:
        if c.op in ("add", "update"):
            opened[(c.tenant_id, c.user_id, c.memory_id, c.version)][c.change_id] = c
    twice = {k: v for k, v in opened.items() if len(v) > 1}
    return {"versions_opened_twice": len(twice),
            "users": sorted({k[1] for k in twice}),
            "examples": [
                f"{k[1]} {k[2][:8]} v{k[3]}: " + " | ".join(
                    f"{c.change_id[:8]} seq {c.lineage.seq} {(c.before or {}).get('content')} "
                    f"-> {c.after.get('content')}" for c in v.values())
                for k, v in list(twice.items())[:5]]}


def drain_rate(stamps: Sequence[tuple[float, int]], start: float, end: float,
               low: float = 0.1, high: float = 0.9) -> dict[str, Any]:
    """Messages/s while a backlog drained: the messages covered between ``low`` and
    ``high`` of the phase's coverage over the seconds between (the ramp-up and the tail,
    users whose last jobs wait on one slow partition, are left out)."""
    inside = sorted((t, n) for t, n in stamps if start <= t <= end)
    total = sum(n for _, n in inside)
    out: dict[str, Any] = {"covered": total, "seconds": round(end - start, 1)}
    if total < 20:
        return {**out, "msg_per_s": None}
    seen, t_low, t_high, c_low, c_high = 0, None, None, 0, 0
    for t, n in inside:
        seen += n
        if t_low is None and seen >= low * total:
            t_low, c_low = t, seen
        if t_high is None and seen >= high * total:
            t_high, c_high = t, seen
    assert t_low is not None and t_high is not None
    span = t_high - t_low
    rate = (c_high - c_low) / span if span > 0 else None
    return {**out, "msg_per_s": round(rate, 1) if rate else None,
            "window_s": round(span, 1), "drain_s": round(inside[-1][0] - start, 1)}


# --------------------------------------------------------------------------- worker logs

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[(\d+)\] \[(\w+)\] (.*)$")
TAKE = re.compile(r"^shard (\d+): (promoted|caught up|restored), (\d+) change\(s\) folded "
                  r"in ([\d.]+)s")
ASSIGNED = re.compile(r"^apply loop: partitions \[[\d, ]*\] \(new \[([\d, ]*)\]")
PROBLEMS = {  # what to look for in a worker's log, and how to name it
    "CRITICAL": re.compile(r"\[CRITICAL\]"),
    "ERROR": re.compile(r"\[ERROR\]"),
    "Traceback": re.compile(r"Traceback"),
    "letting it go": re.compile(r"letting it go"),
    "taking them again": re.compile(r"taking them again"),
    "transaction failed": re.compile(r"transaction failed"),
    "standby warnings": re.compile(r"standby shards: |global shard: "),
    "member dropped": re.compile(r"member_id was not recognized"),
    "forwarding failed": re.compile(r"forwarding to \S+ \(\S+\) failed"),
}


@dataclass
class LogLine:
    at: float
    pid: int
    level: str
    text: str


def log_lines(path: Path, offset: int = 0) -> list[LogLine]:
    """The timestamped lines of a worker's log from byte ``offset`` (continuations of a
    multi-line record are appended to it)."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(offset)
        raw = f.read().decode(errors="replace")
    out: list[LogLine] = []
    for line in raw.splitlines():
        m = LINE.match(line)
        if m:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(LogLine(at, int(m.group(2)), m.group(3), m.group(4)))
        elif out:
            out[-1].text += "\n" + line
    return out


@dataclass(frozen=True)
class Take:
    """A shard this worker began serving (streams.shards.ShardKeeper.take's log line)."""

    worker: str
    at: float
    partition: int
    kind: str  # promoted (a warm standby), caught up (its own checkpoint), restored
    changes: int
    seconds: float
    assigned_at: float | None = None  # the apply group gave it to this worker (log line)


def takes(worker: str, lines: Iterable[LogLine]) -> list[Take]:
    out = []
    assigned: dict[int, float] = {}
    for line in lines:
        a = ASSIGNED.match(line.text)
        if a:
            for n in a.group(1).replace(" ", "").split(","):
                if n:
                    assigned[int(n)] = line.at
            continue
        m = TAKE.match(line.text)
        if m:
            n = int(m.group(1))
            out.append(Take(worker, line.at, n, m.group(2), int(m.group(3)),
                            float(m.group(4)), assigned.get(n)))
    return out


def first_join(lines: Iterable[LogLine]) -> float | None:
    """When a starting worker first asked to join a group (a rebalance begins)."""
    for line in lines:
        if line.text.startswith("(Re-)joining group"):
            return line.at
    return None


def problems(lines: Iterable[LogLine], examples: int = 3,
             ) -> tuple[dict[str, int], dict[str, list[str]]]:
    counts: Counter[str] = Counter()
    seen: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        for name, pattern in PROBLEMS.items():
            if pattern.search(line.text) or pattern.search(f"[{line.level}]"):
                counts[name] += 1
                if len(seen[name]) < examples:
                    seen[name].append(line.text[:400])
    return {k: counts.get(k, 0) for k in PROBLEMS}, dict(seen)


# --------------------------------------------------------------------------- requests


@dataclass
class Req:
    """One read the reader sent: to which worker, for whom, and how it was answered."""

    start: float
    end: float
    asked: str
    user: str
    partition: int
    kind: str  # list / search
    status: int  # 0: no HTTP answer (connection refused, timeout)
    served_by: str | None = None
    standby: bool = False
    duplicated: bool = False  # a list answer holding a memory text twice
    conflicting: bool = False  # ... or two values of a one-value fact (two cities live)
    error: str = ""


def request_stats(reqs: Sequence[Req]) -> dict[str, Any]:
    ok = [r for r in reqs if r.status == 200]
    direct = [r for r in ok if not r.standby and r.served_by == r.asked]
    forwarded = [r for r in ok if not r.standby and r.served_by != r.asked]
    standby = [r for r in ok if r.standby]

    def lat(rs: Sequence[Req]) -> dict[str, Any]:
        ms = [1000 * (r.end - r.start) for r in rs]
        return {"n": len(rs), "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99)}

    failed = [r for r in reqs if r.status != 200]
    return {"total": len(reqs), "ok": len(ok),
            "failed": len(failed),
            "failed_by_status": dict(sorted(Counter(str(r.status) for r in failed).items())),
            "failed_examples": sorted({f"{r.status} {r.error}"[:160] for r in failed})[:5],
            "by_worker": dict(sorted(Counter(r.asked for r in reqs).items())),
            "direct": lat(direct), "forwarded": lat(forwarded), "standby": lat(standby),
            "answers_with_a_duplicate": sum(r.duplicated for r in ok),
            "answers_with_two_values": sum(r.conflicting for r in ok),
            "bad_answers_by_source": dict(Counter(
                "standby" if r.standby else ("forwarded" if r.served_by != r.asked else "direct")
                for r in ok if r.duplicated or r.conflicting)),
            "bad_answer_examples": [
                {"at": r.start, "asked": r.asked, "served_by": r.served_by, "user": r.user,
                 "partition": r.partition, "standby": r.standby, "duplicate": r.duplicated,
                 "two_values": r.conflicting}
                for r in ok if r.duplicated or r.conflicting][:10]}


# --------------------------------------------------------------------------- events


@dataclass
class Happening:
    """A change of the worker set: a join, a crash, a stop, a return; the map before and
    after it (from the stable states around it) and when the cluster was stable again."""

    # start (the first worker) / join / sigkill / sigterm / back / restart (SIGKILL, and
    # started again at once)
    kind: str
    worker: str
    at: float  # join, back: the new worker's first group join; the others: the signal
    before: dict[int, str] = field(default_factory=dict)
    after: dict[int, str] = field(default_factory=dict)
    stable_at: float | None = None
    warm_at: float | None = None
    until: float | None = None  # the next happening (the window this one is judged in)

    def moved(self) -> dict[int, tuple[str | None, str]]:
        """Partitions whose owner changed; after a return or a restart also those the
        worker owns again (its new process takes their shards anew)."""
        again = self.kind in ("back", "restart")
        return {p: (self.before.get(p), w) for p, w in sorted(self.after.items())
                if self.before.get(p) != w or (again and w == self.worker)}

    def label(self) -> str:
        return LABELS[self.kind] + self.worker


LABELS = {"start": "start ", "join": "+", "back": "back ", "sigkill": "SIGKILL ",
          "sigterm": "SIGTERM ", "restart": "SIGKILL+restart "}


def move_times(happenings: Sequence[Happening], all_takes: Sequence[Take],
               ) -> list[dict[str, Any]]:
    """Per partition each happening moved: seconds from the happening to the first take
    of the partition by its new owner (its log line), and how (promoted / caught up /
    restored), with the restore's own changes and seconds; and from the assignment that
    gave it to the new owner to that take."""
    out = []
    for h in happenings:
        for p, (old, new) in h.moved().items():
            found = [t for t in all_takes if t.worker == new and t.partition == p
                     and t.at >= h.at - 1.0 and (h.until is None or t.at <= h.until)]
            row: dict[str, Any] = {"happening": h.label(), "partition": p, "from": old,
                                   "to": new}
            if found:
                t = min(found, key=lambda x: x.at)
                row.update(kind=t.kind, seconds=round(max(0.0, t.at - h.at), 2),
                           changes=t.changes, restore_s=t.seconds)
                if t.assigned_at is not None and t.assigned_at >= h.at - 1.0:
                    row["from_assignment_s"] = round(max(0.0, t.at - t.assigned_at), 2)
            else:
                row.update(kind="not seen", seconds=None)
            out.append(row)
    return out


def move_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("all", "promoted", "caught up", "restored"):
        secs = [r["seconds"] for r in rows if r.get("seconds") is not None
                and (kind == "all" or r["kind"] == kind)]
        given = [r["from_assignment_s"] for r in rows if "from_assignment_s" in r
                 and (kind == "all" or r["kind"] == kind)]
        out[kind.replace(" ", "_")] = {
            "n": len(secs), "p50_s": pct(secs, 0.5),
            "max_s": round(max(secs), 2) if secs else None,
            # from the apply group's assignment on the new owner: what a detection (a
            # session timeout after a SIGKILL) adds is not counted
            "from_assignment_p50_s": pct(given, 0.5),
            "from_assignment_max_s": round(max(given), 2) if given else None}
    out["not_seen"] = sum(r["kind"] == "not seen" for r in rows)
    return out


def failure_windows(happenings: Sequence[Happening], reqs: Sequence[Req],
                    ) -> list[dict[str, Any]]:
    """Per happening, the reads of the users of the partitions it moved (a crash or stop:
    every partition the worker owned) answered from it until the next one: how many
    failed (no 200), the window they failed in (from the first failed request's start to
    the last's end; ``failed_s``: the union of the failed requests' spans, gaps under a
    second closed), by the worker asked, how many failed once the cluster was stable
    again, how many the standbys answered; and the failed reads of other users."""
    out = []
    for h in happenings:
        if h.kind in ("sigkill", "sigterm", "restart"):
            parts = {p for p, w in h.before.items() if w == h.worker}
        else:
            parts = set(h.moved())
        end = h.until if h.until is not None else float("inf")
        inside = [r for r in reqs if h.at <= r.end < end]
        mine = [r for r in inside if r.partition in parts]
        failed = sorted((r for r in mine if r.status != 200), key=lambda r: r.start)
        others = [r for r in inside if r.partition not in parts and r.status != 200]
        spans: list[list[float]] = []
        for r in failed:
            if spans and r.start <= spans[-1][1] + 1.0:
                spans[-1][1] = max(spans[-1][1], r.end)
            else:
                spans.append([r.start, r.end])
        late = [r for r in failed if h.stable_at is not None and r.start > h.stable_at + 1.0]
        out.append({
            "happening": h.label(), "partitions": sorted(parts), "reads": len(mine),
            "failed": len(failed),
            "failed_window_s": round(max(r.end for r in failed) - min(r.start for r in failed),
                                     2) if failed else 0.0,
            "failed_s": round(sum(b - a for a, b in spans), 2),
            "failed_until_s": round(max(r.end for r in failed) - h.at, 2) if failed else 0.0,
            "failed_by_asked": dict(sorted(Counter(r.asked for r in failed).items())),
            "failed_after_stable": len(late),
            "standby_answers": sum(r.standby for r in mine if r.status == 200),
            "failed_other_users": len(others),
            "stable_after_s": round(h.stable_at - h.at, 1) if h.stable_at else None,
            "standbys_warm_after_s": round(h.warm_at - h.at, 1) if h.warm_at else None,
        })
    return out


def wrong_answers(answers: Mapping[str, Mapping[str, Sequence[str]]],
                  owner_of: Mapping[str, str]) -> dict[str, Any]:
    """After settle, every live worker's answer for every user against the owner's own:
    (user, worker) pairs that differ, or that the owner did not answer."""
    wrong, unanswered, pairs = [], 0, 0
    for user, owner in sorted(owner_of.items()):
        mine = answers.get(owner, {}).get(user)
        for worker, theirs in sorted(answers.items()):
            if worker == owner:
                continue
            pairs += 1
            got = theirs.get(user)
            if mine is None or got is None:
                unanswered += 1
            elif sorted(got) != sorted(mine):
                wrong.append((user, worker, owner))
    return {"pairs": pairs, "wrong": len(wrong), "unanswered": unanswered,
            "examples": [list(x) for x in wrong[:5]]}


def duplicated(contents: Iterable[str]) -> bool:
    seen = Counter(contents)
    return any(n > 1 for n in seen.values())


# The facts a person of chaos.py has one value of at a time (EN and ZH memory texts).
ONE_VALUE = (re.compile(r"^Lives in "), re.compile(r"^住在"), re.compile(r"^Has \d+ children$"),
             re.compile(r"^有\d+个孩子$"), re.compile(r"^Works at "), re.compile(r"^在.+工作$"))


def conflicting(contents: Iterable[str]) -> bool:
    """Two live memories for one one-value fact: two cities, two child counts, two
    employers (a stale version still live beside the new one)."""
    texts = set(contents)
    return any(sum(1 for t in texts if p.match(t)) > 1 for p in ONE_VALUE)


__all__ = ["LABELS", "TENANT", "Coverage", "Happening", "LogLine", "Req", "Stream", "Take",
           "conflicting", "drain_rate", "duplicated", "failure_windows", "first_join", "log_lines",
           "move_summary", "move_times", "problems", "request_stats", "takes",
           "version_conflicts", "wrong_answers"]
