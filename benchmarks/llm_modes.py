"""One combined LLM call per job vs extract + one decide per fact (not a test).

    .venv/bin/python -m benchmarks.llm_modes [--smoke]

Runs the bundled sample conversations through the pure coalescing machine (jobs exactly as
the ingest stage would emit them, each completed at once), then decides every job with the
OpenAI-compatible model in both modes against a local OpenAI-compatible server whose
answers come from the rules model (an oracle: the same facts in both modes, so the
comparison is about cost). Counts LLM calls and request characters (~4 per token in
English, ~1-2 in Chinese) per 100 messages, and checks both modes end with the same
memories. Prints a table and one JSON line. The run is small already (seconds, no network
but the local server): ``--smoke`` runs it as it is and says so in the JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from openai import OpenAI

from memstream.core.settings import Settings
from memstream.dev.demo import load_samples
from memstream.dev.openai_stub import OpenAITestServer, Reply, chat_json
from memstream.memory import coalescing as machine
from memstream.memory import rules
from memstream.memory.applying import apply_change, change_for
from memstream.memory.embedding import UseEmbedder
from memstream.memory.extraction import Extractor
from memstream.memory.llm.openai_model import OpenAIModel
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.topics.schemas import ChatMessage, ExtractionJob, JobResult, JobStatus, SessionEvent


def jobs_for_samples() -> tuple[list[ExtractionJob], int]:
    states: dict[str, machine.UserState] = {}
    jobs: list[ExtractionJob] = []
    policy = machine.Policy()
    messages = 0
    for n, event in enumerate(load_samples()):
        key = event.key()
        state = states.get(key) or machine.UserState(event.tenant_id, event.user_id)  # type: ignore[attr-defined]
        if isinstance(event, ChatMessage):
            messages += 1
            step = machine.on_message(state, event, float(n), policy)
        else:
            assert isinstance(event, SessionEvent)
            step = machine.on_session_end(state, event.session_id, float(n), policy)
        while step.jobs:  # complete each job at once: the next one may follow
            job = step.jobs[0]
            jobs.append(job)
            done = JobResult.for_job(job, JobStatus.DONE, job.created_at)
            step = machine.on_result(step.state, done, float(n), policy)
        states[key] = step.state
    return jobs, messages


def _user_lines(prompt: str) -> list[str]:
    part = prompt.split("New messages:", 1)[-1]
    out = []
    for line in part.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row["role"] == "user":
                out.append(row["text"])
    return out


def _fact(c: rules.Candidate) -> dict[str, Any]:
    return {"text": c.text, "type": c.type.value, "importance": c.importance,
            "expires_in_days": c.expires_in_days, "slot": c.slot, "retraction": not c.new_fact}


def oracle(body: dict[str, Any]) -> Reply:
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    listed = re.findall(r"^(\d+)\. (.+?)(?:  \[about the same thing\])?$", user, re.M)
    if system.startswith("You extract"):
        facts = [c for t in _user_lines(user) for c in rules.extract_text(t)]
        return chat_json({"facts": [_fact(c) for c in facts]})
    if system.startswith("You decide"):
        text = user.rsplit(": ", 1)[-1]
        same = next((int(i) for i, c in listed if c == text), None)
        return chat_json({"op": "NOOP", "target": same} if same else {"op": "ADD"})
    facts = [c for t in _user_lines(user) for c in rules.extract_text(t)]
    changes = []
    for c in facts:
        same = next((int(i) for i, text in listed if text == c.text), None)
        changes.append({"op": "NOOP", "target": same} if same else {"op": "ADD", "fact": _fact(c)})
    return chat_json({"changes": changes})


def run_mode(mode: str, jobs: list[ExtractionJob], server: OpenAITestServer,
             work: Path) -> dict[str, Any]:
    settings = Settings(llm="openai", llm_mode=mode, llm_model="oracle")
    model = OpenAIModel(settings, client=OpenAI(base_url=server.url, api_key="k",
                                                 max_retries=0))
    store = EdgeStore(work / mode, UseEmbedder.dim)
    ex = Extractor(model, UseEmbedder(), store)
    start = len(server.requests)
    calls = 0
    for i, job in enumerate(jobs):
        out = ex.decide(job, float(i))
        calls += out.usage.calls
        for op, vec in out.ops:
            apply_change(store, change_for(op, vec, job, out, model, float(i)))
    sent = server.requests[start:]
    chars = sum(len(m["content"]) for _, body in sent for m in body["messages"])
    users = sorted({(j.tenant_id, j.user_id) for j in jobs})
    memories = {f"{t}/{u}": sorted(m.content for m in store.list(Scope(t, u))) for t, u in users}
    store.close()
    return {"calls": calls, "request_chars": chars, "memories": memories}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="check it runs (the same run: the default is seconds already)")
    args = ap.parse_args(argv)
    jobs, messages = jobs_for_samples()
    with (tempfile.TemporaryDirectory(prefix="memstream-llm-modes-") as tmp,
          OpenAITestServer(responder=oracle) as server):
        results = {mode: run_mode(mode, jobs, server, Path(tmp))
                   for mode in ("two_step", "combined")}
    same = results["two_step"]["memories"] == results["combined"]["memories"]
    print(f"{'mode':10} {'LLM calls':>10} {'calls/100 msg':>14} {'request chars':>14} "
          f"{'chars/100 msg':>14}   ({messages} messages, {len(jobs)} jobs)")
    for mode, r in results.items():
        print(f"{mode:10} {r['calls']:>10} {100 * r['calls'] / messages:>14.1f} "
              f"{r['request_chars']:>14} {100 * r['request_chars'] / messages:>14.0f}")
    two, one = results["two_step"], results["combined"]
    print(f"combined / two_step: calls {one['calls'] / two['calls']:.2f}, request chars "
          f"{one['request_chars'] / two['request_chars']:.2f}; same memories: {same}")
    print(json.dumps({"messages": messages, "jobs": len(jobs), "same_memories": same,
                      "smoke": args.smoke,
                      **{m: {k: v for k, v in r.items() if k != "memories"}
                         for m, r in results.items()}}))


if __name__ == "__main__":
    main()
