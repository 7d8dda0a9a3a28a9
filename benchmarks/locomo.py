"""LOCOMO through the real pipeline: evidence recall per category, trigger policy and view
(memories, archived turns, both fused, width-capped, ablations), and J with an answering
endpoint. Prints a table and one JSON line.

    .venv/bin/python benchmarks/locomo.py --data PATH/locomo10.json
    .venv/bin/python benchmarks/locomo.py --data PATH/locomo10.json \\
        --conversations 2 --limit 20 --policies shipped \\
        --base-url http://127.0.0.1:8080/v1 --model smollm2 --record answers.jsonl
    .venv/bin/python benchmarks/locomo.py --smoke --bootstrap 127.0.0.1:19092

The data (CC BY-NC 4.0) is never part of the project: give its path. The broker is the
benchmark's own (port 39092, started and stopped here) unless ``--bootstrap`` names one.
Without ``--base-url`` the worker runs the rules model and no answer is judged: evidence
recall, calls, tokens and latency are the figures (docs/benchmarks.md, "LOCOMO").

``--smoke`` checks that it still runs, in seconds plus a worker's start-up: without
``--data`` a tiny synthetic conversation in LOCOMO format (2 sessions, 10 turns, 2
questions) written to a temp file, one policy, short timeouts; without ``--base-url`` or
``--recorded`` the answers are written and judged by a local stub server
(:mod:`memstream.dev.openai_stub`) that answers from the retrieved memories: no key, no
network, and its J says only that the path works.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.locomo import CATEGORIES, load
from memstream.dev.locomo_judge import Calls, Judge
from memstream.dev.locomo_run import POLICIES, Result, run_policy
from memstream.dev.openai_stub import OpenAITestServer, Reply, chat

ORDER = [*CATEGORIES.values(), "overall"]
# --smoke: defaults for a run of seconds (one worker; give up soon if jobs do not come)
SMOKE = {"policies": "shipped", "timeout": 120.0, "stall": 30.0}


def smoke_conversation() -> list[dict[str, Any]]:
    """A tiny conversation in LOCOMO's format (made up here, nothing of the real data):
    2 sessions, 10 turns, 2 questions with their evidence turns."""
    def turns(session: int, lines: list[tuple[str, str]]) -> list[dict[str, str]]:
        return [{"speaker": who, "dia_id": f"D{session}:{n}", "text": text}
                for n, (who, text) in enumerate(lines, 1)]

    return [{"sample_id": "smoke-1", "conversation": {
        "speaker_a": "Ana", "speaker_b": "Ben",
        "session_1_date_time": "9:15 am on 3 March, 2024",
        "session_1": turns(1, [("Ana", "Hi Ben! Long time no see."),
                               ("Ben", "Hey Ana! I moved last month, I live in Porto now."),
                               ("Ana", "Nice! I live in Lisbon, still near the river."),
                               ("Ben", "I work at Acme as a developer these days."),
                               ("Ana", "Cool. Talk soon.")]),
        "session_2_date_time": "6:40 pm on 21 April, 2024",
        "session_2": turns(2, [("Ben", "Ana, guess what happened."),
                               ("Ana", "Tell me!"),
                               ("Ben", "I am allergic to penicillin, found out at the doctor."),
                               ("Ana", "Oh no. We have 2 kids, both fine with it."),
                               ("Ben", "Good to hear. Bye!")])},
        "qa": [{"question": "Where does Ben live?", "answer": "Porto", "evidence": ["D1:2"],
                "category": 4},
               {"question": "What is Ben allergic to?", "answer": "penicillin",
                "evidence": ["D2:3"], "category": 3}]}]


def stub_reply(body: dict[str, Any]) -> Reply:
    """The smoke's answering and judging endpoint: the answer is the first retrieved
    memory; the verdict CORRECT when the answer holds the gold answer's words."""
    user = body["messages"][-1]["content"]
    gold = re.search(r"^Gold answer: (.*)$", user, re.M)
    if gold is None:  # answering: the first memory listed, if any
        first = re.search(r"^- (.+)$", user, re.M)
        return chat(first.group(1) if first else "not mentioned", 50, 5)
    given = re.search(r"^Answer to grade: (.*)$", user, re.M)
    correct = given is not None and gold.group(1).lower() in given.group(1).lower()
    return chat(json.dumps({"reasoning": "smoke stub",
                            "label": "CORRECT" if correct else "WRONG"}), 80, 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(results: list[Result]) -> str:
    """Two markdown tables: recall (and J) per category and view, then cost and latency."""
    lines = ["", "Evidence recall@5 / @10 per category (J when judged: of the memories), "
             "and the mean lineage width (turns) of the retrieved items, per view: the "
             "memories alone, archived turns alone, both fused (dense and sparse turns, "
             "recency), width-capped (a memory counts only with a lineage of <= 2 turns or "
             "as the evidence's stating turn), and the fusion's ablations:", "",
             "| policy | view | " + " | ".join(ORDER) + " | lineage turns |",
             "|---" * (len(ORDER) + 3) + "|"]
    for r in results:
        for name, view in r.views.items():
            cells = []
            for c in ORDER:
                row = view.tally.row(c)
                if not row["questions"]:
                    cells.append("-")
                    continue
                text = f"{row['recall@5']:.3f} / {row['recall@10']:.3f}"
                if row["J"] is not None:
                    text += f", J {row['J']:.2f}"
                cells.append(text)
            lines.append(f"| {r.policy} | {name} | " + " | ".join(cells)
                         + f" | {view.width} |")
    heads = ["policy", "messages covered", "jobs / 100 msgs", "jobs failed", "LLM calls / 100",
             "prompt tokens / 100", "completion tokens / 100", "memories / conv",
             "search p50 ms", "search p95 ms", "context tokens", "conversation tokens",
             "lineage turns (memories)", "s"]
    keys = ["messages_covered", "jobs_per_100_messages", "jobs_failed",
            "llm_calls_per_100_messages", "prompt_tokens_per_100_messages",
            "completion_tokens_per_100_messages", "memories_per_conversation",
            "search_ms_p50", "search_ms_p95", "context_tokens_mean",
            "conversation_tokens_mean", "lineage_turns_mean", "seconds"]
    lines += ["", "| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for r in results:
        s = r.summary()
        lines.append(f"| {r.policy} | " + " | ".join(str(s[k]) for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None,
                    help="locomo10.json (LOCOMO format); required unless --smoke")
    ap.add_argument("--conversations", type=int, default=None, help="the first N (all)")
    ap.add_argument("--limit", type=int, default=None, help="questions per conversation")
    ap.add_argument("--sessions", type=int, default=None, help="each conversation cut to "
                    "its first N sessions (the questions whose evidence they hold)")
    ap.add_argument("--policies", default="per-turn,shipped",
                    help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("-k", type=int, default=10, help="memories retrieved per question")
    ap.add_argument("--bootstrap", default=None, help="a running broker (else our own)")
    ap.add_argument("--port", type=int, default=39092, help="the benchmark's own broker")
    ap.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint: the "
                    "worker extracts with it, and answers are written and judged")
    ap.add_argument("--model", default="gpt-4o-mini", help="extraction and answering model")
    ap.add_argument("--judge-model", default=None, help="judging model (--model)")
    ap.add_argument("--record", type=Path, default=None,
                    help="record every LLM answer: the answers and verdicts to FILE, the "
                    "worker's extraction answers to FILE's .extraction.jsonl sibling")
    ap.add_argument("--recorded", type=Path, default=None,
                    help="replay a --record run offline, answer for answer (no endpoint)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per policy, for the jobs")
    ap.add_argument("--stall", type=float, default=120.0, help="stop waiting for jobs when "
                    "no message was covered for this long (a model that keeps failing)")
    ap.add_argument("--pace", type=float, default=0.0,
                    help="seconds between produced events (0: as fast as the producer goes; "
                    "users are interleaved either way)")
    args = smoke.parse(ap, SMOKE, argv, what="check it runs (the synthetic conversation "
                       "unless --data, the stub judge unless --base-url/--recorded)")
    if args.data is None and not args.smoke:
        ap.error("--data is required (the LOCOMO file is never part of the project)")

    if args.data is not None:
        conversations = load(args.data, args.conversations, args.sessions)
        data_name = args.data.name
    else:  # --smoke: a synthetic conversation, through the same loader
        with tempfile.TemporaryDirectory(prefix="memstream-locomo-smoke-") as tmp:
            path = Path(tmp) / "locomo_smoke.json"
            path.write_text(json.dumps(smoke_conversation()), "utf-8")
            conversations = load(path, args.conversations, args.sessions)
        data_name = "synthetic (--smoke)"
    policies = [POLICIES[p.strip()] for p in args.policies.split(",")]
    judge = None
    stub: contextlib.ExitStack | OpenAITestServer = contextlib.ExitStack()
    if args.base_url or args.recorded:
        mode: Literal["live", "record", "recorded"] = (
            "recorded" if args.recorded else "record" if args.record else "live")
        calls = Calls(args.base_url, os.environ.get("OPENAI_API_KEY", "none"), mode,
                      args.recorded or args.record)
        judge = Judge(calls, args.model, args.judge_model or args.model)
    elif args.smoke:  # the answering and judging path, offline: a local stub endpoint
        stub = OpenAITestServer(responder=stub_reply)
        judge = Judge(Calls(stub.url, "none", "live"), "stub", "stub")
    base = {"bootstrap_servers": args.bootstrap or f"127.0.0.1:{args.port}",
            "web_port": free_port()}
    if args.base_url:
        base.update(llm="openai", llm_base_url=args.base_url, llm_model=args.model,
                    llm_api_key=os.environ.get("OPENAI_API_KEY", "none"))
    if args.record or args.recorded:  # the worker's extraction calls: <file>.extraction
        recording = args.recorded or args.record
        base.update(llm_record=recording.with_suffix(".extraction.jsonl"),
                    llm_record_mode="replay" if args.recorded else "record")
        if args.recorded:  # offline: the model named, no endpoint
            base.update(llm="openai", llm_model=args.model)
    broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
    started = False
    if args.bootstrap is None and local_broker.read_pid(local_broker.paths_for(broker)) is None:
        local_broker.start(broker, 180.0)
        started = True
    questions = sum(len(c.qa[:args.limit]) for c in conversations)
    print(f"LOCOMO: {len(conversations)} conversations, {questions} questions per policy, "
          f"policies {', '.join(p.name for p in policies)}; model "
          f"{args.model if args.base_url or args.recorded else 'rules (offline)'}"
          f"{' replayed from ' + str(args.recorded) if args.recorded else ''}", flush=True)
    results: list[Result] = []
    try:
        with stub, tempfile.TemporaryDirectory(prefix="memstream-locomo-") as tmp:
            for policy in policies:
                seen = {"messages": 0, "questions": 0}
                t0 = time.monotonic()

                def progress(what: str, n: int, seen: dict[str, int] = seen,
                             t0: float = t0, name: str = policy.name) -> None:
                    seen[what] += n
                    print(f"\r  {name}: {seen['messages']} messages covered, "
                          f"{seen['questions']}/{questions} questions "
                          f"({time.monotonic() - t0:.0f} s)", end="", file=sys.stderr,
                          flush=True)

                settings = Settings(**base)  # type: ignore[arg-type]
                results.append(asyncio.run(run_policy(
                    policy, conversations, settings, Path(tmp), k=args.k, limit=args.limit,
                    judge=judge, timeout=args.timeout, pace_s=args.pace, stall_s=args.stall,
                    progress=progress)))
                print(file=sys.stderr)
    finally:
        if started:
            local_broker.stop(broker)
    print(table(results))
    out = {"data": data_name, "conversations": len(conversations),
           "questions": questions, "k": args.k,
           "model": args.model if args.base_url or args.recorded else "rules",
           "smoke": args.smoke, "results": [r.summary() for r in results]}
    if judge is not None:
        out["judge"] = {"calls": judge.calls.calls, "prompt_tokens": judge.calls.prompt_tokens,
                        "completion_tokens": judge.calls.completion_tokens}
        if isinstance(stub, OpenAITestServer):
            out["judge"]["endpoint"] = "stub (memstream.dev.openai_stub)"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
