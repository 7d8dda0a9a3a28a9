"""LOCOMO (Maharana et al., ACL 2024) as memstream sees it: conversations turned into the
events a chat service would produce, and the scores of what retrieval brings back.

Pure: no Kafka, no HTTP (the run is :mod:`memstream.dev.locomo_run`). The data file is
CC BY-NC 4.0 and never part of the project; tests use a LOCOMO-format fixture of their own.

- Each speaker of a conversation is a user of memstream (Mem0's evaluation does the same):
  the speaker's own turns are ``user`` messages of that user, the other speaker's turns
  ``assistant`` messages, so both speakers' facts are kept. Message ids are the turns' dialog
  ids (``D1:3``), timestamps the sessions' own dates (a turn every ``gap_s`` seconds), and
  every session ends with a session-end event.
- **Evidence recall@k** needs no LLM: a question counts when one of the top-k memories
  retrieved for it (both speakers asked, merged by score) has, in its lineage, one of the
  question's evidence turns. Lineage holds every message of the job that wrote the memory,
  so a coarser trigger (more messages per job) widens it: :func:`lineage_width` is reported
  beside the recall to show that.
- **Views**: the same recall over the memories alone, the user's archived turns alone
  (lineage: the turn and the one before it), and both fused (the search's ``items``). A
  *width-capped* recall counts a memory only when its lineage has at most
  :data:`CAP` turns or the evidence turn is the one that stated it (``Retrieved.stated``):
  a memory whose lineage spans a whole job does not flatter it. A turn always counts.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memstream.topics.schemas import ChatMessage, Event, Role, SessionEvent

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
              5: "adversarial"}
_WHEN = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
_UNSAFE = re.compile(r"[^A-Za-z0-9._:@+=-]+")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str


@dataclass(frozen=True)
class Session:
    number: int
    at: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class QA:
    question: str
    answer: str
    evidence: tuple[str, ...]
    category: int

    @property
    def kind(self) -> str:
        return CATEGORIES.get(self.category, f"category-{self.category}")


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    sessions: tuple[Session, ...]
    qa: tuple[QA, ...]

    def user_of(self, speaker: str) -> str:
        """The memstream user id of a speaker (an id the contract accepts)."""
        return _UNSAFE.sub("-", f"{self.sample_id}.{speaker}").strip("-")[:128]

    @property
    def users(self) -> tuple[str, str]:
        return self.user_of(self.speakers[0]), self.user_of(self.speakers[1])

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]


def parse_when(text: str) -> datetime:
    return datetime.strptime(text.strip(), _WHEN).replace(tzinfo=UTC)


def parse(raw: dict) -> Conversation:
    conv = raw["conversation"]
    sessions = []
    for key in sorted((k for k in conv if re.fullmatch(r"session_\d+", k)),
                      key=lambda k: int(k.split("_")[1])):
        number = int(key.split("_")[1])
        turns = tuple(Turn(t["dia_id"], t["speaker"], t.get("text", ""))
                      for t in conv[key] if t.get("text"))
        sessions.append(Session(number, parse_when(conv[f"{key}_date_time"]), turns))
    qa = tuple(QA(q["question"], str(q.get("answer", q.get("adversarial_answer", ""))),
                  tuple(q.get("evidence", ())), int(q["category"])) for q in raw["qa"])
    return Conversation(raw["sample_id"], (conv["speaker_a"], conv["speaker_b"]),
                        tuple(sessions), qa)


def load(path: Path, conversations: int | None = None,
         sessions: int | None = None) -> list[Conversation]:
    """The first ``conversations``, each cut to its first ``sessions`` (then only the
    questions whose evidence lies in what is kept)."""
    found = [parse(raw) for raw in json.loads(path.read_text("utf-8"))]
    found = found[:conversations] if conversations else found
    return [shorten(c, sessions) for c in found] if sessions else found


def shorten(conv: Conversation, sessions: int) -> Conversation:
    kept = conv.sessions[:sessions]
    turns = {t.dia_id for s in kept for t in s.turns}
    qa = tuple(q for q in conv.qa if q.evidence and set(q.evidence) <= turns)
    return Conversation(conv.sample_id, conv.speakers, kept, qa)


def events(conv: Conversation, tenant: str, gap_s: float = 30.0) -> list[Event]:
    """What a chat service would produce for both speakers, in time order per user."""
    out: list[Event] = []
    for speaker in conv.speakers:
        user = conv.user_of(speaker)
        for session in conv.sessions:
            sid = f"s{session.number}"
            at = session.at
            for n, turn in enumerate(session.turns):
                at = session.at + timedelta(seconds=gap_s * n)
                out.append(ChatMessage(
                    tenant_id=tenant, user_id=user, session_id=sid, message_id=turn.dia_id,
                    role=Role.USER if turn.speaker == speaker else Role.ASSISTANT,
                    content=turn.text, ts=at))
            out.append(SessionEvent(tenant_id=tenant, user_id=user, session_id=sid,
                                    ts=at + timedelta(seconds=gap_s)))
    return out


ENDED = ("done", "trivial", "failed")  # job results that end a range (failed: set aside)


def covered(results: Iterable[dict]) -> set[tuple[str, str, int]]:
    """The messages, (user, session, seq in the session), that ended job results cover."""
    return {(r["user_id"], r["session_id"], s) for r in results if r["status"] in ENDED
            for s in range(r["from_seq"], r["to_seq"])}


# --- scoring -------------------------------------------------------------------------------

CAP = 2  # width-capped recall: a lineage of at most this many turns always counts


@dataclass(frozen=True)
class Retrieved:
    """One memory (or archived turn) retrieved for a question: its score, the turns of its
    lineage, and the turns known to state it (its source turns; empty: unknown)."""

    memory_id: str
    score: float
    turns: frozenset[str]
    content: str = ""
    kind: str = "memory"  # or "turn"
    stated: frozenset[str] = frozenset()

    def counts(self, wanted: set[str], capped: bool = False) -> bool:
        """Whether it holds an evidence turn (``capped``: within a narrow lineage, or as
        the turn that stated it)."""
        if not self.turns & wanted:
            return False
        return not capped or len(self.turns) <= CAP or bool(self.stated & wanted)


def merge(*ranked: Sequence[Retrieved], k: int) -> list[Retrieved]:
    """Several users' results as one ranking (by score), the first ``k``. Turns of the same
    lineage count once (both speakers archive the same turns): the best scored is kept."""
    out: list[Retrieved] = []
    seen: set[frozenset[str]] = set()
    for r in sorted((r for rs in ranked for r in rs), key=lambda r: -r.score):
        if r.kind == "turn":
            if r.turns in seen:
                continue
            seen.add(r.turns)
        out.append(r)
    return out[:k]


def evidence_hit(retrieved: Sequence[Retrieved], evidence: Iterable[str], k: int,
                 capped: bool = False) -> bool:
    wanted = set(evidence)
    return any(r.counts(wanted, capped) for r in retrieved[:k])


def lineage_width(retrieved: Sequence[Retrieved]) -> float:
    """Mean number of turns in the lineage of the retrieved memories (0: none)."""
    return sum(len(r.turns) for r in retrieved) / len(retrieved) if retrieved else 0.0


def tokens(text: str) -> int:
    """A model-free token estimate: four characters a token (OpenAI's rule of thumb)."""
    return (len(text) + 3) // 4


def _words(text: str) -> list[str]:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return [w for w in text.split() if w not in ("a", "an", "the")]


def f1(prediction: str, gold: str) -> float:
    """Token F1 as SQuAD and LOCOMO compute it (lower case, no punctuation or articles)."""
    pred, want = _words(prediction), _words(gold)
    common = sum((Counter(pred) & Counter(want)).values())
    if not pred or not want or not common:
        return 0.0
    precision, recall = common / len(pred), common / len(want)
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str, gold: str) -> float:
    """BLEU-1: clipped unigram precision with the brevity penalty."""
    pred, want = _words(prediction), _words(gold)
    if not pred or not want:
        return 0.0
    clipped = sum((Counter(pred) & Counter(want)).values()) / len(pred)
    penalty = 1.0 if len(pred) > len(want) else pow(2.718281828459045,
                                                    1 - len(want) / len(pred))
    return clipped * penalty


@dataclass
class Tally:
    """Per-category counts of one run."""

    asked: Counter[str] = field(default_factory=Counter)
    hits5: Counter[str] = field(default_factory=Counter)
    hits10: Counter[str] = field(default_factory=Counter)
    judged: Counter[str] = field(default_factory=Counter)
    correct: Counter[str] = field(default_factory=Counter)
    f1: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # sums
    bleu1: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, qa: QA, retrieved: Sequence[Retrieved], capped: bool = False) -> None:
        for key in (qa.kind, "overall"):
            self.asked[key] += 1
            self.hits5[key] += evidence_hit(retrieved, qa.evidence, 5, capped)
            self.hits10[key] += evidence_hit(retrieved, qa.evidence, 10, capped)

    def judge(self, qa: QA, correct: bool, answer: str) -> None:
        for key in (qa.kind, "overall"):
            self.judged[key] += 1
            self.correct[key] += correct
            self.f1[key] += f1(answer, qa.answer)
            self.bleu1[key] += bleu1(answer, qa.answer)

    def row(self, key: str) -> dict[str, float | int | None]:
        n, j = self.asked[key], self.judged[key]
        return {"questions": n,
                "recall@5": round(self.hits5[key] / n, 3) if n else None,
                "recall@10": round(self.hits10[key] / n, 3) if n else None,
                "judged": j, "J": round(self.correct[key] / j, 3) if j else None,
                "F1": round(self.f1[key] / j, 3) if j else None,
                "BLEU-1": round(self.bleu1[key] / j, 3) if j else None}
