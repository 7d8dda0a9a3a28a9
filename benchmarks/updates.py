"""Knowledge updates through the real pipeline (SPEC §9d): after a user's fact changed, does
the ``context`` answer's prompt block put the current value first, never present an old
one as current, and carry no filler? Prints a table and one JSON line.

    .venv/bin/python benchmarks/updates.py
    .venv/bin/python benchmarks/updates.py --stories held_out.json --verbose
    .venv/bin/python benchmarks/updates.py --users-only en-res-porto,zh-res-hangzhou \\
        --keep-data /tmp/updates-run
    .venv/bin/python benchmarks/updates.py --base-url http://127.0.0.1:8080/v1 \\
        --model smollm2 --record extraction.jsonl
    .venv/bin/python benchmarks/updates.py --recorded extraction.jsonl --model smollm2
    .venv/bin/python benchmarks/updates.py --smoke --bootstrap 127.0.0.1:19092

Each story is one user: a fact stated among chit-chat, filler sessions about other things,
the change (often without naming the old value), one more filler session, then the
question, e.g. "Where does the user live?", asked once through ``context`` (k 5, a budget
of 1,500 characters). Kinds: ``update`` (A -> B), ``chain`` (A -> B -> C) and ``control``
(nothing changes: the value must still come back). The stories are
``benchmarks/data/updates_stories.json`` (their format: dev/updates_stories.py;
``--stories`` runs another set the same way); the figures (dev/updates_score.py)
are string checks, so no judge is needed:

- current in block %: the block mentions a current form of the value;
- current first %: ... and no unmarked stale line (a control: no distractor, someone
  else's value) comes before it;
- stale first: update and chain stories where an unmarked line with a superseded value
  comes before the current one (or the current one is missing);
- control recall %: the controls' value is in the block; distractor first: controls where
  a line with someone else's value comes before it;
- stale unmarked / marked / filler lines, repeated lines (a line or a message of one
  shown again), filler items (by lineage), the mean block length and the memory / turn
  items of the answers.

The broker is the benchmark's own (port 49092, started and stopped here) unless
``--bootstrap`` names one. Without ``--base-url`` the worker runs the offline rules model
(what it recognises: memory/rules.py); the stories are not written for any extractor, and
many of their changes are said in ways no pattern knows: retrieval must order the turns
themselves (docs/archive.md, "What the agent is handed"). ``--base-url/--model`` make the
worker extract with that endpoint (key:
``OPENAI_API_KEY``), ``--record FILE`` records its answers, ``--recorded FILE`` replays
them offline (job boundaries depend on timing: a prompt the recording lacks fails its job).
``--smoke``: five stories (an English and a Chinese move, a control, a chain, a tool
change), filler cut to two turns, short timeouts.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from benchmarks import smoke
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.updates_run import run
from memstream.dev.updates_score import summary, table
from memstream.dev.updates_stories import StoryError, load, shorten

STORIES = Path(__file__).resolve().parent / "data" / "updates_stories.json"
SMOKE_IDS = ("en-res-porto", "zh-res-hangzhou", "en-res-control-sister", "en-tool-notes",
             "en-tool-editor")
# --smoke: defaults for a run of seconds (one worker; give up soon if jobs do not come)
SMOKE = {"timeout": 90.0, "stall": 30.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--stories", type=Path, default=STORIES, help="a story file (JSON)")
    ap.add_argument("--users-only", default=None, metavar="ID,ID",
                    help="only these stories (their ids are the user ids)")
    ap.add_argument("--bootstrap", default=None, help="a running broker (else our own)")
    ap.add_argument("--port", type=int, default=49092, help="the benchmark's own broker")
    ap.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint the worker "
                    "extracts with (else the offline rules model)")
    ap.add_argument("--model", default="gpt-4o-mini", help="extraction model")
    ap.add_argument("--record", type=Path, default=None,
                    help="record the worker's extraction answers to FILE (JSONL)")
    ap.add_argument("--recorded", type=Path, default=None,
                    help="replay a --record run's extraction answers offline (no endpoint)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="for the jobs, in s")
    ap.add_argument("--stall", type=float, default=120.0, help="stop waiting for jobs when "
                    "no message was covered for this long (a model that keeps failing)")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds between produced "
                    "events (0: as fast as the producer goes; users interleaved either way)")
    ap.add_argument("--keep-data", type=Path, default=None, metavar="DIR",
                    help="keep the worker's data directory, its log and every answer "
                    "(answers.jsonl) in DIR (new or empty) for offline analysis")
    ap.add_argument("--verbose", action="store_true",
                    help="print each failing story's prompt block")
    args = smoke.parse(ap, SMOKE, argv, what="five stories, filler cut to two turns")
    if args.keep_data is not None and args.keep_data.exists() and any(
            args.keep_data.iterdir()):
        ap.error(f"--keep-data {args.keep_data}: not empty")
    if args.record and args.recorded:
        ap.error("--record and --recorded exclude each other")

    ids = [i.strip() for i in args.users_only.split(",") if i.strip()] \
        if args.users_only else None
    try:
        if args.smoke and ids is None:
            every = load(args.stories)
            known = {s.id for s in every}
            ids = [i for i in SMOKE_IDS if i in known] or [s.id for s in every[:5]]
        stories = load(args.stories, ids)
    except StoryError as exc:
        ap.error(str(exc))
    if args.smoke:
        stories = [shorten(s) for s in stories]

    base: dict[str, Any] = {"bootstrap_servers": args.bootstrap or f"127.0.0.1:{args.port}",
                            "web_port": free_port()}
    if args.base_url:
        base.update(llm="openai", llm_base_url=args.base_url, llm_model=args.model,
                    llm_api_key=os.environ.get("OPENAI_API_KEY", "none"))
    if args.record or args.recorded:
        base.update(llm_record=args.recorded or args.record,
                    llm_record_mode="replay" if args.recorded else "record")
        if args.recorded:  # offline: the model named, no endpoint
            base.update(llm="openai", llm_model=args.model)
    model = args.model if args.base_url or args.recorded else "rules"
    broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
    started = False
    if args.bootstrap is None and local_broker.read_pid(local_broker.paths_for(broker)) is None:
        local_broker.start(broker, 180.0)
        started = True
    messages = sum(len(x.turns) for s in stories for x in s.sessions)
    print(f"updates: {len(stories)} stories ({messages} messages) from {args.stories.name}; "
          f"model {model}{' replayed from ' + str(args.recorded) if args.recorded else ''}",
          flush=True)
    seen = {"messages": 0, "stories": 0}
    t0 = time.monotonic()

    def progress(what: str, n: int) -> None:
        seen[what] += n
        print(f"\r  {seen['messages']}/{messages} messages covered, "
              f"{seen['stories']}/{len(stories)} asked ({time.monotonic() - t0:.0f} s)",
              end="", file=sys.stderr, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="memstream-updates-") as tmp:
            result = asyncio.run(run(
                stories, Settings(**base), Path(tmp), timeout=args.timeout,
                stall_s=args.stall, pace_s=args.pace, keep=args.keep_data,
                progress=progress))
            print(file=sys.stderr)
    finally:
        if started:
            local_broker.stop(broker)

    figures = summary(result.verdicts)
    if args.verbose:
        for answer in result.answers:
            if not answer["verdict"]["ok"]:
                v = answer["verdict"]
                print(f"\n### {answer['id']} ({v['kind']}): {answer['question']} -> "
                      f"current in block {v['current_in_block']}, stale first "
                      f"{v['stale_first']}\n{answer['prompt_block'] or '(empty block)'}")
    print()
    print(table(figures))
    o = figures["overall"]
    print(f"\n{o['stories']} stories: current in block {o['current_in_block_pct']}%, "
          f"current first {o['ok_pct']}%, stale first {o['stale_first']} of {o['updates']}, "
          f"control recall {o['control_recall_pct']}%; {result.covered}/{result.messages} "
          f"messages covered by {result.jobs} jobs ({result.failed} failed) in "
          f"{result.seconds:.0f} s")
    if args.keep_data is not None:
        print(f"kept: {args.keep_data} (worker/, worker.log, answers.jsonl)")
    out = {"stories": len(stories), "file": args.stories.name, "model": model,
           "smoke": args.smoke, **figures, "pipeline": result.pipeline(),
           "verdicts": [v.to_dict() for v in result.verdicts]}
    print(json.dumps(out, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
