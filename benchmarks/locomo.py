"""LOCOMO through the real pipeline: evidence recall per category and trigger policy, and J
with an answering endpoint. Prints a table and one JSON line.

    .venv/bin/python benchmarks/locomo.py --data ../shared/data/locomo10.json
    .venv/bin/python benchmarks/locomo.py --data ../shared/data/locomo10.json \\
        --conversations 2 --limit 20 --policies shipped \\
        --base-url http://127.0.0.1:8080/v1 --model smollm2 --record answers.jsonl

The data (CC BY-NC 4.0) is never part of the project: give its path. The broker is the
benchmark's own (port 39092, started and stopped here) unless ``--bootstrap`` names one.
Without ``--base-url`` the worker runs the rules model and no answer is judged: evidence
recall, calls, tokens and latency are the figures (docs/benchmarks.md, "LOCOMO").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.locomo import CATEGORIES, load
from memstream.dev.locomo_judge import Calls, Judge
from memstream.dev.locomo_run import POLICIES, Result, run_policy

ORDER = [*CATEGORIES.values(), "overall"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(results: list[Result]) -> str:
    """Two markdown tables: recall (and J) per category, then cost and latency."""
    lines = ["", "Evidence recall@5 / @10 (J when judged), per category:", "",
             "| policy | " + " | ".join(ORDER) + " |", "|---" * (len(ORDER) + 1) + "|"]
    for r in results:
        cells = []
        for c in ORDER:
            row = r.tally.row(c)
            if not row["questions"]:
                cells.append("-")
                continue
            text = f"{row['recall@5']:.3f} / {row['recall@10']:.3f}"
            if row["J"] is not None:
                text += f", J {row['J']:.2f}"
            cells.append(text)
        lines.append(f"| {r.policy} | " + " | ".join(cells) + " |")
    heads = ["policy", "messages covered", "jobs / 100 msgs", "jobs failed", "LLM calls / 100",
             "prompt tokens / 100", "completion tokens / 100", "memories / conv",
             "search p50 ms", "search p95 ms", "context tokens", "conversation tokens",
             "lineage turns", "s"]
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
    ap.add_argument("--data", type=Path, required=True, help="locomo10.json (LOCOMO format)")
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
    args = ap.parse_args(argv)

    conversations = load(args.data, args.conversations, args.sessions)
    policies = [POLICIES[p.strip()] for p in args.policies.split(",")]
    judge = None
    if args.base_url or args.recorded:
        mode = "recorded" if args.recorded else "record" if args.record else "live"
        calls = Calls(args.base_url, os.environ.get("OPENAI_API_KEY", "none"), mode,
                      args.recorded or args.record)
        judge = Judge(calls, args.model, args.judge_model or args.model)
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
        with tempfile.TemporaryDirectory(prefix="memstream-locomo-") as tmp:
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
    out = {"data": args.data.name, "conversations": len(conversations),
           "questions": questions, "k": args.k,
           "model": args.model if args.base_url or args.recorded else "rules",
           "results": [r.summary() for r in results]}
    if judge is not None:
        out["judge"] = {"calls": judge.calls.calls, "prompt_tokens": judge.calls.prompt_tokens,
                        "completion_tokens": judge.calls.completion_tokens}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
