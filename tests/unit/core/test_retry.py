"""The one retry policy: classification of real exceptions, backoff, deadline-bounded loops."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiokafka.errors as kafka
import grpc
import grpc.aio
import httpx
import httpx2
import openai
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memstream.core.errors import BrokerError, ConfigError, InvalidRecord
from memstream.core.retry import (
    RetriesExhausted,
    RetryPolicy,
    current_deadline,
    deadline_scope,
    is_transient,
    next_delay,
    remaining,
    retry_async,
    retry_sync,
    set_within,
)
from memstream.memory.decisions import InvalidDecision
from memstream.memory.embedding import EmbeddingError
from memstream.memory.extraction import Usage
from memstream.memory.llm.openai_model import InvalidReply, LLMError
from memstream.memory.store import StoreError

pytestmark = pytest.mark.unit

REQUEST = httpx2.Request("POST", "http://llm.test/v1/chat/completions")


def api_status(status: int) -> openai.APIStatusError:
    response = httpx2.Response(status, request=REQUEST, json={"error": {"message": "x"}})
    return openai.APIStatusError(f"status {status}", response=response, body=None)


def qdrant_status(status: int) -> UnexpectedResponse:
    return UnexpectedResponse(status, "", b"{}", httpx.Headers())


def rpc(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x")


def caused(exc: BaseException, cause: BaseException | None) -> BaseException:
    exc.__cause__ = cause
    return exc


def validation_error() -> pydantic.ValidationError:
    try:
        pydantic.TypeAdapter(int).validate_python("not a number")
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


CLASSIFIED = {
    # openai (over httpx2)
    "openai-429": (api_status(429), True),
    "openai-500": (api_status(500), True),
    "openai-503": (api_status(503), True),
    "openai-408": (api_status(408), True),
    "openai-409": (api_status(409), True),
    "openai-400": (api_status(400), False),
    "openai-401": (openai.AuthenticationError("bad key", response=httpx2.Response(
        401, request=REQUEST), body=None), False),
    "openai-404": (api_status(404), False),
    "openai-422": (api_status(422), False),
    "openai-timeout": (openai.APITimeoutError(request=REQUEST), True),
    "openai-connection": (openai.APIConnectionError(request=REQUEST), True),
    "openai-other": (openai.OpenAIError("no api key"), False),
    # qdrant-client (over httpx)
    "qdrant-503": (qdrant_status(503), True),
    "qdrant-429": (qdrant_status(429), True),
    "qdrant-400": (qdrant_status(400), False),
    "qdrant-404": (qdrant_status(404), False),
    "qdrant-409-exists": (qdrant_status(409), False),
    "qdrant-no-status": (qdrant_status(None), False),  # type: ignore[arg-type]
    "qdrant-transport": (ResponseHandlingException(httpx.ConnectError("refused")), True),
    "qdrant-unparsable": (ResponseHandlingException(validation_error()), False),
    "qdrant-exhausted": (ResourceExhaustedResponse("slow down", 2), True),
    # aiokafka: its own `retriable`, plus timeouts and connection errors
    "kafka-timeout": (kafka.KafkaTimeoutError(), True),
    "kafka-connection": (kafka.KafkaConnectionError("down"), True),
    "kafka-not-leader": (kafka.NotLeaderForPartitionError(), True),
    "kafka-request-timed-out": (kafka.RequestTimedOutError(), True),
    "kafka-authorization": (kafka.TopicAuthorizationFailedError(), False),
    "kafka-fenced": (kafka.ProducerFenced(), False),
    "kafka-too-large": (kafka.MessageSizeTooLargeError(), False),
    # aiokafka's bare KafkaError(repr(err)) from err (the producer's coordinator lookup)
    "kafka-bare-from-connection": (caused(kafka.KafkaError("closed"),
                                          kafka.KafkaConnectionError("closed")), True),
    "kafka-bare-from-authorization": (caused(kafka.KafkaError("denied"),
                                             kafka.TopicAuthorizationFailedError()), False),
    "kafka-bare-no-cause": (kafka.KafkaError("?"), False),
    # httpx and httpx2
    "httpx-connect": (httpx.ConnectError("refused"), True),
    "httpx-read-timeout": (httpx.ReadTimeout("slow"), True),
    "httpx-remote-protocol": (httpx.RemoteProtocolError("peer closed"), True),
    "httpx-bad-scheme": (httpx.UnsupportedProtocol("ftp://"), False),
    "httpx-local-protocol": (httpx.LocalProtocolError("bad header"), False),
    "httpx2-connect": (httpx2.ConnectError("refused"), True),
    "httpx2-pool-timeout": (httpx2.PoolTimeout("busy"), True),
    # grpc (qdrant-client's grpc transport)
    "grpc-unavailable": (rpc(grpc.StatusCode.UNAVAILABLE), True),
    "grpc-deadline": (rpc(grpc.StatusCode.DEADLINE_EXCEEDED), True),
    "grpc-invalid-argument": (rpc(grpc.StatusCode.INVALID_ARGUMENT), False),
    "grpc-unauthenticated": (rpc(grpc.StatusCode.UNAUTHENTICATED), False),
    # builtins
    "connection-refused": (ConnectionRefusedError(111, "refused"), True),
    "connection-reset": (ConnectionResetError(), True),
    "timeout": (TimeoutError(), True),
    "value": (ValueError("bad"), False),
    "type": (TypeError("bad"), False),
    "key": (KeyError("k"), False),
    "runtime": (RuntimeError("bug"), False),
    "file-not-found": (FileNotFoundError("x"), False),
    # ours
    "invalid-reply": (InvalidReply("not json", Usage(1)), True),
    "invalid-decision": (InvalidDecision("target 7"), True),
    "invalid-record": (InvalidRecord("schema", "bad"), False),
    "config": (ConfigError("nope"), False),
    "retries-exhausted": (RetriesExhausted(3, ConnectionError(), "limit"), False),
    "store-no-cause": (StoreError("refused"), False),
    "store-from-transport": (caused(StoreError("write failed"), httpx.ReadTimeout("x")), True),
    "store-from-qdrant-503": (caused(StoreError("write failed"), qdrant_status(503)), True),
    "store-from-qdrant-400": (caused(StoreError("write failed"), qdrant_status(400)), False),
    "store-from-value": (caused(StoreError("bad point"), ValueError("x")), False),
    "store-from-store-from-timeout": (
        caused(StoreError("outer"), caused(StoreError("inner"), TimeoutError())), True),
    "embedding-from-openai-500": (caused(EmbeddingError("failed"), api_status(500)), True),
    "llm-from-401": (caused(LLMError("extract"), api_status(401)), False),
    "llm-gave-up": (caused(LLMError("extract"), RetriesExhausted(4, api_status(500), "x")),
                    False),
    "broker-from-connection": (caused(BrokerError("down"), ConnectionRefusedError()), True),
    # a foreign wrapper is not seen through: unknown means permanent
    "runtime-from-timeout": (caused(RuntimeError("wrapped"), TimeoutError()), False),
}


@pytest.mark.parametrize(("exc", "transient"), list(CLASSIFIED.values()), ids=list(CLASSIFIED))
def test_classification(exc, transient):
    assert is_transient(exc) is transient


def test_a_cause_cycle_ends():
    a, b = StoreError("a"), StoreError("b")
    a.__cause__, b.__cause__ = b, a
    assert is_transient(a) is False


def test_importing_the_module_imports_no_client_library():
    code = ("import sys, memstream.core.retry as r; "
            "print(sorted(m for m in ('openai', 'qdrant_client', 'aiokafka', 'httpx', 'httpx2',"
            " 'grpc', 'memstream.memory.llm.openai_model') if m in sys.modules)); "
            "print(r.is_transient(ConnectionError()), r.is_transient(ValueError()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split("\n")
    assert out[:2] == ["[]", "True False"]


# --- backoff ----------------------------------------------------------------------------
@pytest.mark.parametrize(("policy", "attempt", "rng", "expected"), [
    (RetryPolicy(1.0, 60.0), 1, 0.5, 1.0),
    (RetryPolicy(1.0, 60.0), 2, 0.5, 2.0),
    (RetryPolicy(1.0, 60.0), 4, 0.5, 8.0),
    (RetryPolicy(1.0, 60.0), 10, 0.5, 60.0),  # capped
    (RetryPolicy(1.0, 60.0), 10_000, 0.5, 60.0),  # no overflow
    (RetryPolicy(1.0, 60.0, jitter=0.1), 3, 0.0, 3.6),  # 4 * 0.9
    (RetryPolicy(1.0, 60.0, jitter=0.1), 3, 1.0, 4.4),  # 4 * 1.1
    (RetryPolicy(1.0, 60.0, jitter=0.1), 6, 1.0, 35.2),
    (RetryPolicy(1.0, 60.0, jitter=0.1), 7, 1.0, 60.0),  # jitter never exceeds the cap
    (RetryPolicy(0.5, 5.0, multiplier=3.0), 3, 0.5, 4.5),
    (RetryPolicy(0.0, 0.0), 5, 0.9, 0.0),
])
def test_next_delay(policy, attempt, rng, expected):
    assert next_delay(policy, attempt, lambda: rng) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [dict(first_delay_s=2.0, max_delay_s=1.0),
                                 dict(first_delay_s=-1.0, max_delay_s=1.0),
                                 dict(first_delay_s=1.0, max_delay_s=2.0, multiplier=0.5),
                                 dict(first_delay_s=1.0, max_delay_s=2.0, jitter=1.0)])
def test_an_unusable_policy_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        RetryPolicy(**bad)


# --- the loops, on a fake clock ---------------------------------------------------------
class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self.sleeps: list[tuple[float, float]] = []  # (start, end)

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append((self.t, self.t + seconds))
        self.t += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Flaky:
    """Fails with ``errors`` in turn (then succeeds with ``result``); each call lasts
    ``duration`` on the clock."""

    def __init__(self, clock: FakeClock, errors: list[Exception] | None = None,
                 forever: Exception | None = None, duration: float = 0.0,
                 result: object = "ok") -> None:
        self.clock, self.errors, self.forever = clock, list(errors or []), forever
        self.duration, self.result = duration, result
        self.starts: list[float] = []

    def __call__(self) -> object:
        self.starts.append(self.clock.t)
        self.clock.t += self.duration
        if self.errors:
            raise self.errors.pop(0)
        if self.forever is not None:
            raise self.forever
        return self.result

    async def call_async(self) -> object:
        return self()


NO_JITTER = {"rng": lambda: 0.5}


def run(mode, fn, clock, **kw):
    """retry_sync or retry_async with the fake clock."""
    if mode == "sync":
        return retry_sync(fn, clock=clock, sleep=clock.sleep, **kw)
    return asyncio.run(retry_async(fn.call_async, clock=clock, sleep=clock.async_sleep, **kw))


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
def test_transient_then_success(mode):
    clock = FakeClock()
    fn = Flaky(clock, [ConnectionError("a"), api_status(503)], result=42)
    seen = []
    got = run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0), deadline=clock.t + 100,
              on_retry=lambda n, e, d: seen.append((n, type(e).__name__, d)), **NO_JITTER)
    assert got == 42 and len(fn.starts) == 3
    assert seen == [(1, "ConnectionError", 1.0), (2, "APIStatusError", 2.0)]
    assert [end - start for start, end in clock.sleeps] == [1.0, 2.0]


@pytest.mark.parametrize("mode", MODES)
def test_a_permanent_error_is_raised_at_once(mode):
    clock = FakeClock()
    fn = Flaky(clock, forever=api_status(401))
    with pytest.raises(openai.APIStatusError):
        run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0), deadline=clock.t + 100)
    assert len(fn.starts) == 1 and clock.sleeps == []


@pytest.mark.parametrize("mode", MODES)
def test_the_attempt_limit_gives_up_with_the_last_error(mode):
    clock = FakeClock()
    last = TimeoutError("third")
    fn = Flaky(clock, [TimeoutError("first"), TimeoutError("second"), last])
    with pytest.raises(RetriesExhausted) as info:
        run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0), deadline=None, max_attempts=3)
    assert info.value.attempts == 3 == len(fn.starts) and info.value.__cause__ is last
    assert info.value.last is last and "after 3 attempts" in str(info.value)
    assert len(clock.sleeps) == 2  # no pointless sleep after the last attempt


@pytest.mark.parametrize("mode", MODES)
def test_no_deadline_keeps_trying(mode):
    clock = FakeClock()
    fn = Flaky(clock, [ConnectionError()] * 50)
    assert run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0), deadline=None) == "ok"
    assert len(fn.starts) == 51 and max(e - s for s, e in clock.sleeps) <= 60.0 * 1.1


@pytest.mark.parametrize("mode", MODES)
def test_gives_up_before_the_deadline_instead_of_sleeping_past_it(mode):
    clock = FakeClock(0.0)
    fn = Flaky(clock, forever=ConnectionError("down"), duration=0.5)
    with pytest.raises(RetriesExhausted) as info:
        run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0, min_attempt_s=0.5), deadline=10.0,
            **NO_JITTER)
    # attempts at 0, 1.5, 4, 8.5: the next would need 8 s of sleep with 1 s left
    assert fn.starts == [0.0, 1.5, 4.0, 8.5] and info.value.attempts == 4
    assert clock.t == 9.0 and all(end <= 10.0 for _, end in clock.sleeps)
    assert isinstance(info.value.__cause__, ConnectionError)


@pytest.mark.parametrize("mode", MODES)
def test_a_passed_deadline_starts_nothing(mode):
    clock = FakeClock(50.0)
    fn = Flaky(clock)
    with pytest.raises(RetriesExhausted) as info:
        run(mode, fn, clock, policy=RetryPolicy(1.0, 60.0), deadline=50.0)
    assert fn.starts == [] and info.value.attempts == 0


def test_a_sleep_that_overran_ends_the_retries():
    """A real sleep may last longer than asked: the next attempt is checked again."""
    clock = FakeClock(0.0)
    fn = Flaky(clock, forever=ConnectionError("down"))

    def oversleep(seconds: float) -> None:
        clock.t += seconds + 20.0

    with pytest.raises(RetriesExhausted, match="no time left") as info:
        retry_sync(fn, policy=RetryPolicy(1.0, 60.0), deadline=10.0, clock=clock,
                   sleep=oversleep)
    assert len(fn.starts) == 1 and isinstance(info.value.__cause__, ConnectionError)


def test_retries_do_not_nest():
    """An inner layer that gave up is final for the outer one: one outer attempt."""
    clock = FakeClock(0.0)
    inner = Flaky(clock, forever=api_status(500))

    def job() -> object:
        try:
            return retry_sync(inner, policy=RetryPolicy(1.0, 60.0), deadline=None,
                              clock=clock, sleep=clock.sleep, max_attempts=3)
        except RetriesExhausted as exc:
            raise LLMError("extract: no valid answer") from exc

    calls = []

    def counted() -> object:
        calls.append(clock.t)
        return job()

    with pytest.raises(LLMError):
        retry_sync(counted, policy=RetryPolicy(1.0, 60.0), deadline=1000.0, clock=clock,
                   sleep=clock.sleep)
    assert len(calls) == 1 and len(inner.starts) == 3


@settings(max_examples=200, deadline=None)
@given(first=st.floats(0.0, 5.0), extra=st.floats(0.0, 50.0), mult=st.floats(1.0, 4.0),
       jitter=st.floats(0.0, 0.9), rng=st.floats(0.0, 0.999), budget=st.floats(0.0, 200.0),
       duration=st.floats(0.0, 3.0), slack=st.floats(0.0, 2.0))
def test_never_starts_or_sleeps_past_the_deadline(first, extra, mult, jitter, rng, budget,
                                                  duration, slack):
    clock = FakeClock(100.0)
    deadline = clock.t + budget
    policy = RetryPolicy(first, first + extra, mult, jitter, min_attempt_s=duration + slack)
    fn = Flaky(clock, forever=TimeoutError("slow"), duration=duration)
    with pytest.raises(RetriesExhausted) as info:
        retry_sync(fn, policy=policy, deadline=deadline, clock=clock, sleep=clock.sleep,
                   rng=lambda: rng, max_attempts=1000)
    assert info.value.attempts == len(fn.starts)
    assert all(deadline - start >= policy.min_attempt_s for start in fn.starts)
    assert all(end < deadline for _, end in clock.sleeps)
    assert clock.t <= deadline  # attempts no longer than min_attempt_s end in time


# --- the deadline of the work in progress -----------------------------------------------
def test_deadline_scope_nests_and_resets():
    assert current_deadline() is None
    with deadline_scope(100.0) as outer:
        assert outer == current_deadline() == 100.0
        with deadline_scope(200.0):
            assert current_deadline() == 100.0  # an inner scope cannot extend the outer
        with deadline_scope(50.0):
            assert current_deadline() == 50.0
        with deadline_scope(None):
            assert current_deadline() == 100.0
        assert current_deadline() == 100.0
    assert current_deadline() is None


async def test_the_deadline_reaches_worker_threads():
    with deadline_scope(123.0):
        seen = await asyncio.to_thread(current_deadline)
    assert seen == 123.0 and current_deadline() is None


def test_remaining():
    assert remaining(None, lambda: 5.0) is None
    assert remaining(10.0, lambda: 4.0) == 6.0
    assert remaining(10.0, lambda: 12.0) == 0.0


async def test_set_within_is_true_once_the_event_is_set_and_false_when_the_time_runs_out():
    import asyncio

    event = asyncio.Event()
    assert await set_within(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await set_within(event, 5.0) is True
    assert await set_within(event, 0.0) is True  # already set: no wait
