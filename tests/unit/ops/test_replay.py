"""Replay's pure part (memory/reextraction.py): messages -> jobs, the budget; and the run loop
(memstream/replay.run_jobs) with scripted models on an Edge store, without Kafka."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from memstream.memory import reextraction as r
from memstream.memory.decisions import Candidate, Decision
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, Insight, Usage
from memstream.memory.ingest_state import Policy
from memstream.memory.model import Memory, OpKind
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.ops.replay import Report, _Metered, run_jobs
from memstream.topics.schemas import ChatMessage, JobMessage, SessionEvent, TriggerReason

pytestmark = pytest.mark.unit
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
POLICY = Policy()  # the live defaults: 4 new messages, idle 1800 s


def m(text: str, minute: float, *, user: str = "u1", session: str = "s1",
      role: str = "user", mid: str | None = None, tenant: str = "t1") -> ChatMessage:
    return ChatMessage(tenant_id=tenant, user_id=user, session_id=session,
                       message_id=mid or f"{user}-{session}-{minute}-{role}", role=role,
                       content=text, ts=T0 + timedelta(minutes=minute))


def end(minute: float, *, user: str = "u1", session: str = "s1") -> SessionEvent:
    return SessionEvent(tenant_id="t1", user_id=user, session_id=session,
                        ts=T0 + timedelta(minutes=minute))


def exchange(n: int, start: float = 0, **kw: object) -> list[ChatMessage]:
    """n user/assistant pairs, one minute apart."""
    out = []
    for i in range(n):
        out.append(m(f"I live in city {start + i}", start + 2 * i, **kw))  # type: ignore[arg-type]
        out.append(m("Noted.", start + 2 * i + 1, role="assistant", **kw))  # type: ignore[arg-type]
    return out


def planned(messages: Sequence[ChatMessage], ends: Sequence[SessionEvent] = (),
            flush: bool = True) -> r.Plan:
    return r.plan(r.by_user(messages, ends), POLICY, flush)


# --- messages -> jobs ------------------------------------------------------------------------

def test_watermark_forms_jobs_of_four_new_messages_and_the_rest_is_flushed_idle():
    p = planned(exchange(5))  # 10 messages: 4 + 4, then 2 left at the end of the range
    assert [(j.from_seq, j.to_seq, j.reason) for j in p.jobs] == [
        (0, 4, TriggerReason.THRESHOLD), (4, 8, TriggerReason.THRESHOLD),
        (8, 10, TriggerReason.IDLE)]
    assert [j.seq for j in p.jobs] == [1, 2, 3]
    # time is the messages': a job is created when its last message was written; the idle
    # flush idle_timeout_s after the session's last message
    assert p.jobs[0].created_at == T0 + timedelta(minutes=3)
    assert p.jobs[2].created_at == T0 + timedelta(minutes=9, seconds=POLICY.idle_timeout_s)
    assert planned(exchange(5), flush=False).by_reason() == {"threshold": 2}


def test_explicit_session_end_and_trivial():
    msgs = [m("Remember this: I am allergic to peanuts", 0), m("Noted.", 1, role="assistant"),
            m("We moved to Munich", 2), m("ok", 3, session="s2"), m("thanks", 4, session="s2")]
    p = planned(msgs, [end(5), end(6, session="s2")])
    assert [(j.session_id, j.reason, j.to_seq) for j in p.jobs] == [
        ("s1", TriggerReason.EXPLICIT, 1), ("s1", TriggerReason.SESSION_END, 3)]
    assert p.trivial == 1  # s2 is only acknowledgements: resolved without a call
    assert (p.messages, p.session_ends) == (5, 2)


def test_idle_between_messages_flushes_at_the_messages_time():
    gap = POLICY.idle_timeout_s / 60 + 10  # minutes
    p = planned([m("I live in Berlin", 0), m("I work at Acme", gap)])
    assert [(j.reason, j.from_seq, j.to_seq) for j in p.jobs] == [
        (TriggerReason.IDLE, 0, 1), (TriggerReason.IDLE, 1, 2)]
    assert p.jobs[0].created_at == T0 + timedelta(seconds=POLICY.idle_timeout_s)


def test_a_retried_message_counts_once_and_plans_are_identical_run_to_run():
    msgs = [*exchange(2), m("I live in city 0", 0, mid="u1-s1-0-user")]
    one, two = planned(msgs), planned(msgs)
    assert one.duplicates == 1
    assert [j.model_dump() for j in one.jobs] == [j.model_dump() for j in two.jobs]


def test_users_are_planned_apart_and_run_in_time_order():
    msgs = [*exchange(2, user="a"), *exchange(2, start=0.5, user="b")]
    p = planned(msgs)
    assert [(j.user_id, j.seq) for j in p.jobs] == [("a", 1), ("b", 1)]
    assert p.users == 2


def test_session_end_is_merged_in_by_time():
    msgs = [m("I live in Berlin", 0), m("I work at Acme", 10)]
    events = r.by_user(msgs, [end(5)])[("t1", "u1")]
    assert [type(e).__name__ for e in events] == ["ChatMessage", "SessionEvent", "ChatMessage"]


def test_filters():
    f = r.Filters(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=3),
                  tenant="t1", user="u1")
    assert [f.keeps(x) for x in (m("a", 0), m("a", 1), m("a", 2.9), m("a", 3))] == \
        [False, True, True, False]
    assert not f.keeps(m("a", 2, user="u2")) and not f.keeps(m("a", 2, tenant="t2"))
    assert r.Filters().keeps(m("a", 99))


# --- the budget ------------------------------------------------------------------------------

def test_dry_run_counts_combined_two_step_and_rules():
    msgs = [*exchange(4), m("ok", 20), m("I have 2 children", 21),  # 8 + 2 in s1
            m("ok", 22, session="s2"), m("好的", 23, session="s2")]  # trivial only
    p = planned(msgs)
    assert p.trivial == 1
    facts = [r.user_facts(j) for j in p.jobs]
    assert facts == [2, 2, 1]  # "ok" carries no fact
    combined, per_job = r.estimate(p.jobs, "combined", top_k=5)
    calls = 3
    assert (combined.calls, combined.calls_max, combined.exact) == (calls, calls, True)
    assert combined.prompt_tokens > 0 and combined.completion_tokens > 0
    two, _ = r.estimate(p.jobs, "two_step", top_k=5)
    assert (two.calls, two.exact) == (calls + 5, False)
    assert two.calls_max == calls * (1 + r.FACT_CAP)
    assert two.prompt_tokens > combined.prompt_tokens  # a system prompt per decide
    rules, _ = r.estimate(p.jobs, "rules", top_k=5)
    assert (rules.calls, rules.calls_max, rules.prompt_tokens) == (0, 0, 0)
    assert "exact" in combined.line() and "at most" in two.line()
    assert [c.calls for c in per_job] == [1, 1, 1]


def test_token_estimate_follows_the_text():
    short = planned([m("I live in Rome", 0)]).jobs
    long = planned([m("I live in Rome " + "and I like long walks " * 40, 0)]).jobs
    cjk = planned([m("我住在深圳" * 40, 0)]).jobs
    s, l_, c = (r.estimate(j, "combined", 5)[0].prompt_tokens for j in (short, long, cjk))
    assert l_ > s + 150  # ~880 more characters: ~220 more tokens
    assert c >= s + 190  # one token per CJK character


def test_max_calls_stop_point():
    assert r.jobs_within([1, 1, 1, 1], 2) == 2
    assert r.jobs_within([1, 0, 1, 1], 2) == 3  # a free (trivial) job still runs
    assert r.jobs_within([4, 4, 1], 5) == 1  # stops at the first that does not fit
    assert r.jobs_within([1, 1], None) == 2
    assert r.jobs_within([0, 0, 1], 0) == 2
    b = r.Budget(3)
    b.spend(2)
    assert b.fits(1) and not b.fits(2)
    with pytest.raises(r.OverBudget, match="2 of 3"):
        b.check(2, "job 3")


# --- the run loop with scripted models (no Kafka, no HTTP) -------------------------------------

class Combined:
    """One call per job: every user message becomes an ADD."""

    name, prompt_version, combined = "scripted", "combined-test", True

    def __init__(self) -> None:
        self.calls = 0

    def extract_and_decide(self, messages: Sequence[JobMessage], context: Sequence[JobMessage],
                           shown: list[tuple[int, Memory, float]], threshold: float,
                           ) -> tuple[list[tuple[Candidate, Decision]], Usage]:
        self.calls += 1
        return [(Candidate(x.content), Decision(OpKind.ADD)) for x in messages
                if x.role == "user"], Usage(1, 50, 10)

    def extract(self, messages, context):  # pragma: no cover - the combined path is used
        raise AssertionError

    def decide(self, candidate, shown, threshold):  # pragma: no cover
        raise AssertionError

    def reflect(self, memories: list[tuple[int, Memory]]) -> tuple[list[Insight], Usage]:
        return [], Usage()


class TwoStep:
    """Extract: every user message a candidate; decide: ADD. One call each."""

    name, prompt_version = "scripted", "two-step-test"

    def __init__(self) -> None:
        self.calls = 0

    def extract(self, messages, context):
        self.calls += 1
        return [Candidate(x.content) for x in messages if x.role == "user"], Usage(1, 50, 10)

    def decide(self, candidate, shown, threshold):
        self.calls += 1
        return Decision(OpKind.ADD), Usage(1, 30, 5)

    def reflect(self, memories):
        return [], Usage()


def _run(tmp_path, model, mode: r.Mode, max_calls: int | None, jobs):
    store = EdgeStore(tmp_path / "store", HashingEmbedder().dim)
    budget = r.Budget(max_calls)
    decider = _Metered(model, budget) if mode == "two_step" else model
    report = Report(r.Plan(jobs=jobs), r.estimate(jobs, mode, 5)[0], mode, model.name)
    run_jobs(jobs, Extractor(decider, HashingEmbedder(), store), model, store, budget, mode,
             report, lambda s: None)
    contents = sorted(x.content for x in store.list(Scope("t1", "u1")))
    cursor = store.cursor(Scope("t1", "u1"))
    store.close()
    return report, contents, cursor


def test_combined_run_stops_before_the_first_job_that_does_not_fit(tmp_path):
    jobs = planned(exchange(6)).jobs  # 3 jobs, 2 user facts each
    model = Combined()
    report, contents, cursor = _run(tmp_path, model, "combined", 2, jobs)
    assert (report.done, report.calls, model.calls) == (2, 2, 2)
    assert report.stopped is not None and report.stopped_at == jobs[2]
    assert len(contents) == 4 and cursor is not None and cursor.seq == 2
    assert report.ops == {"add": 4, "archive": 4}  # the turns kept, as the pipeline keeps them


def test_two_step_stops_after_the_extract_before_any_decide(tmp_path):
    jobs = planned(exchange(6)).jobs  # each job: 1 extract + 2 decides = 3 calls
    model = TwoStep()
    report, contents, cursor = _run(tmp_path, model, "two_step", 5, jobs)
    # job 1: 3 calls; job 2: its extract fits (4), its 2 decides do not (6 > 5): stopped,
    # the extract counted, nothing of job 2 applied
    assert (report.done, report.calls, model.calls) == (1, 4, 4)
    assert report.stopped_at == jobs[1] and "decide" in (report.stopped or "")
    assert len(contents) == 2 and cursor is not None and cursor.seq == 1


def test_a_resumed_run_skips_what_the_store_holds(tmp_path):
    jobs = planned(exchange(6)).jobs
    _run(tmp_path, Combined(), "combined", 1, jobs)
    model = Combined()
    report, contents, _ = _run(tmp_path, model, "combined", None, jobs)
    assert (report.resumed, report.done, model.calls) == (1, 2, 2)
    assert len(contents) == 6


class _Killed(Exception):
    pass


class _KilledAfterOneWrite:
    """The target store of a run killed between two writes of a job's decision."""

    def __init__(self, store: EdgeStore) -> None:
        self.store, self.writes = store, 0

    def write(self, *args, **kwargs):
        if self.writes == 1:
            raise _Killed
        self.writes += 1
        return self.store.write(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_run_killed_mid_apply_is_resumed(tmp_path):
    """The killed run's decision is never handed over again (no topic), so the resumed
    run's decision of that job, which read what it left, builds on it instead of waiting
    for it (the worker's fence for a half-applied decision's versions)."""
    jobs = planned(exchange(6)).jobs  # 3 jobs, 2 user facts each
    store = EdgeStore(tmp_path / "store", HashingEmbedder().dim)
    report = Report(r.Plan(jobs=jobs), r.estimate(jobs, "combined", 5)[0], "combined", "x")
    killed = _KilledAfterOneWrite(store)
    with pytest.raises(_Killed):
        run_jobs(jobs, Extractor(Combined(), HashingEmbedder(), killed), Combined(), killed,
                 r.Budget(None), "combined", report, lambda s: None)
    assert len(store.list(Scope("t1", "u1"))) == 1 and store.cursor(Scope("t1", "u1")) is None
    store.close()
    report, contents, cursor = _run(tmp_path, Combined(), "combined", None, jobs)
    assert (report.done, len(contents), cursor.seq if cursor else 0) == (3, 6, 3)


def test_forget_me_markers_are_read_when_they_verify_and_never_deleted():
    from pydantic import SecretStr

    from memstream.core.settings import Settings
    from memstream.ops.replay import _forgotten
    from memstream.sealing import key_records as rec
    from memstream.sealing.key_view import kek_record

    settings = Settings(master_key=SecretStr("master-key-of-the-replay-test"))
    ring = rec.Keyring.of(settings)
    kek_id, kek, (kek_key, kek_value) = kek_record(ring, "t1")

    def signed(user: str, at: float, master: bool = True) -> bytes:
        return rec.dumps(rec.signed_marker(kek, kek_id, "t1", user, at=at, request_id="r",
                                           actor="a", keys=[],
                                           master=ring.marker_key() if master else None))

    recs = [(kek_key.encode(), kek_value),
            (b"t1/u1/!forgotten", signed("u1", 100.0)),
            (b"t1/u1/k-1", b'{"wrapped": "..."}'), (b"~roll", None),
            (b"t1/u2/!forgotten", signed("u2", 5.0)),
            (b"t1/u2/!forgotten", None),  # a marker is never deleted (a tombstone: forged)
            (b"t1/u3/!forgotten", b'{"at": 1e12}'),  # forged: unsigned
            (b"t1/u4/!forgotten", b"not json"),  # malformed: set aside, not a crash
            (b"t1/u5/!forgotten", signed("u5", 7.0, master=False))]  # a reader's: forged
    assert _forgotten(settings, recs, "user-keys") == {("t1", "u1"): 100.0, ("t1", "u2"): 5.0}
    assert _forgotten(Settings(), recs, "user-keys") == {}  # no master key: no markers


def test_the_target_is_never_the_live_store(tmp_path):
    from memstream.core.errors import ConfigError
    from memstream.core.settings import Settings
    from memstream.ops.replay import Options, open_target

    s = Settings(data_dir=tmp_path / "live")
    for bad in (tmp_path / "live" / "qdrant", tmp_path / "live", tmp_path / "live/qdrant/x"):
        with pytest.raises(ConfigError, match="live store"):
            open_target(s, Options(into=bad), 8)
    used = tmp_path / "used"
    (used / "shard").mkdir(parents=True)
    with pytest.raises(ConfigError, match="--resume"):
        open_target(s, Options(into=used), 8)
    with pytest.raises(ConfigError, match="STORE=server"):
        open_target(s, Options(collection="replay-1"), 8)
    server = Settings(store="server", qdrant_url="http://127.0.0.1:9", qdrant_collection="live")
    with pytest.raises(ConfigError, match="live collection"):
        open_target(server, Options(collection="live"), 8)
    with pytest.raises(ConfigError, match="exactly one"):
        open_target(s, Options(into=used, collection="x"), 8)
    open_target(s, Options(into=tmp_path / "new"), 8).close()


def test_the_target_is_never_the_store_the_worker_was_switched_to(tmp_path):
    from memstream.core.errors import ConfigError
    from memstream.core.settings import Settings
    from memstream.memory.store.switch import set_current_store_path
    from memstream.ops.replay import Options, open_target

    s = Settings(data_dir=tmp_path / "live")
    s.data_dir.mkdir()
    set_current_store_path(s, tmp_path / "rebuilt-1")
    with pytest.raises(ConfigError, match="live store"):
        open_target(s, Options(into=tmp_path / "rebuilt-1"), 8)


async def test_a_failed_topic_read_stops_the_other_reads_before_the_error_is_raised(monkeypatch):
    """The three reads of replay's load run together; when one fails (no broker, a refused
    login), the others are cancelled and their consumers stopped before the error leaves
    load, never left running into the loop's shutdown (a consumer collected unclosed
    printed its warning after the command's one-line error)."""
    import asyncio

    from aiokafka.errors import KafkaConnectionError

    from memstream.core.settings import Settings
    from memstream.memory import reextraction as pure
    from memstream.ops import replay

    stopped: list[str] = []

    async def read(settings, topic):
        if topic.endswith("messages"):
            await asyncio.sleep(0)
            raise KafkaConnectionError("Unable to bootstrap")
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.append(topic)  # the consumer's stop
        return []

    monkeypatch.setattr(replay, "_read", read)
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):  # as one error
        await replay.load(Settings(), pure.Filters())
    assert sorted(t.rsplit(".", 1)[-1] for t in stopped) == ["session-events", "user-keys"]
