"""Every benchmark, one after another, at its documented size; results kept by date. (not a test)

    .venv/bin/python benchmarks/run_all.py [--only ingest,rebuild] [--smoke]
        [--locomo-data PATH/locomo10.json] [--port 19592] [--out benchmarks/results]

Starts one broker of its own (``--port``) for the benchmarks that take ``--bootstrap``;
chaos.py and scale.py start and restart their own at full size. Each benchmark runs as its
own process; its last stdout line is its JSON. Writes ``<out>/<date>.json`` (every run's
command, seconds, exit code, the machine's load before and after, its JSON) and
``<out>/<date>.md`` (a table of the headline figures, with the core count and load). The
README's and docs/benchmarks.md's figures are copied from the latest table and name its
date. ``--smoke`` runs each at its smoke size (what tests/*/test_benchmarks_smoke.py do).
LOCOMO needs its data (``--locomo-data``; never committed); without it the full run skips
it, and the smoke run uses a synthetic conversation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def dig(data: Mapping[str, Any], path: str) -> Any:
    """``a.b.c`` of nested dicts, or None."""
    here: Any = data
    for part in path.split("."):
        if not isinstance(here, Mapping) or part not in here:
            return None
        here = here[part]
    return here


@dataclass(frozen=True)
class Bench:
    """A benchmark script: its full and smoke arguments, whether it takes ``--bootstrap``
    (a running broker), the JSON keys every run prints, and its headline figures."""

    name: str
    full: tuple[str, ...] = ()
    smoke: tuple[str, ...] = ("--smoke",)
    broker: bool = False  # takes --bootstrap (at smoke size always; at full size too)
    own_broker: bool = False  # at full size: starts (and may restart) its own broker
    keys: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()  # dotted paths into its JSON
    needs_data: bool = False
    timeout_s: float = 120.0  # at smoke size

    def script(self) -> Path:
        return ROOT / "benchmarks" / f"{self.name}.py"

    def command(self, *, smoke: bool, bootstrap: str | None,
                locomo_data: Path | None = None) -> list[str] | None:
        """The command line, or None when it cannot run (LOCOMO without data, full)."""
        args = list(self.smoke if smoke else self.full)
        if self.needs_data:
            if locomo_data is not None:
                args += ["--data", str(locomo_data)]
            elif not smoke:
                return None
        if bootstrap is not None and self.broker and (smoke or not self.own_broker):
            args += ["--bootstrap", bootstrap]
        return [sys.executable, str(self.script().relative_to(ROOT)), *args]  # cwd ROOT


BENCHMARKS: tuple[Bench, ...] = (
    Bench("ingest", full=("--messages", "30000", "--users", "300", "--rate", "500",
                          "--runs", "3"), broker=True,
          keys=("messages", "users", "rate", "codes.this.throughput_msg_per_s_median"),
          headline=("codes.this.throughput_msg_per_s_median", "codes.this.p50_ms_median",
                    "codes.this.p99_ms_median")),
    Bench("pipeline", broker=True,
          keys=("users", "messages", "codes.this.msg_per_s_median",
                "codes.this.changes_per_s_median"),
          headline=("codes.this.msg_per_s_median", "codes.this.changes_per_s_median",
                    "codes.this.jobs_per_s_median")),
    Bench("retrieval", broker=True,
          keys=("params", "edge", "local", "ratios", "target.p99_ms"),
          headline=("target.p99_ms", "target.met")),
    Bench("read_load", keys=("params", "codes.this"),
          headline=("codes.this.1.req_per_s", "codes.this.8.req_per_s",
                    "codes.this.8.p99_ms", "codes.this.32.req_per_s")),
    Bench("read_processes", broker=True,
          keys=("users", "clients", "ratio", "codes.1proc.req_per_s_median",
                "codes.2proc.req_per_s_median"),
          headline=("ratio", "codes.1proc.req_per_s_median", "codes.2proc.req_per_s_median")),
    Bench("forwarding", keys=("params", "rows.c1.direct", "rows.c1.forward_tls", "ratios",
                              "check.answers_differ"),
          headline=("ratios.c1.forward_http_over_direct_p50.median",
                    "ratios.c1.forward_tls_over_forward_http_p50.median")),
    Bench("rebuild", broker=True, keys=("changes", "equal", "fold", "from Kafka"),
          headline=("changes", "equal", "from Kafka.new_per_s", "from Kafka.ratio")),
    Bench("rebuild_shards", broker=True,
          keys=("changes", "partitions", "equal", "processes.1.changes_per_s"),
          headline=("changes", "equal", "processes.1.changes_per_s",
                    "processes.2.changes_per_s", "processes.2.ratio")),
    Bench("hostile", broker=True,
          keys=("hostile_sent", "dead_lettered", "wrong_kind", "agent_crashes", "valid_lost",
                "by_class"),
          headline=("hostile_sent", "dead_lettered", "agent_crashes", "valid_lost")),
    Bench("restart", broker=True, keys=("restart_to_processing.after.p50_s",),
          headline=("restart_to_processing.before.p50_s",
                    "restart_to_processing.after.p50_s")),
    Bench("chaos", full=("--users", "200", "--kills", "20"), broker=True, own_broker=True,
          keys=("sessions", "sessions_covered", "kills_done", "http.missing", "http.stale",
                "http.duplicate", "replay.missing", "replay.stale", "replay.duplicate",
                "change_ids_differing_payloads", "restart"),
          headline=("sessions_covered", "sessions", "http.missing", "http.stale",
                    "http.duplicate", "replay.missing", "change_ids_differing_payloads"),
          timeout_s=240.0),
    Bench("scale", broker=True, own_broker=True,
          keys=("sessions", "sessions_covered", "views", "wrong_answers", "moves.all",
                "requests", "throughput"),
          headline=("sessions_covered", "moves.promoted.from_assignment_p50_s",
                    "moves.restored.from_assignment_p50_s"),
          timeout_s=240.0),
    Bench("layouts", full=("--users", "150", "--runs", "3"), broker=True,
          keys=("users", "messages", "layouts.partitioned.msg_per_s",
                "layouts.single.msg_per_s", "layouts.partitioned.search_p99_ms",
                "layouts.single.restart_health_s", "ratios.msg_per_s",
                "ratios.search_p99_ms", "ratios.restart_health_s", "memories_as_expected"),
          headline=("ratios.msg_per_s", "ratios.search_p50_ms", "ratios.search_p99_ms",
                    "ratios.restart_health_s", "memories_as_expected"),
          timeout_s=240.0),
    Bench("machine", keys=("examples", "steps", "passed"),
          headline=("examples", "seconds", "passed"), timeout_s=300.0),
    Bench("jobs", keys=("params", "small.rounds.indexed_select_ms.p50", "large"),
          headline=("large.rounds.indexed_select_ms.p50", "large.decay.ms.p50")),
    Bench("llm_modes", keys=("messages", "jobs", "same_memories", "two_step", "combined"),
          headline=("two_step.calls", "combined.calls", "same_memories")),
    Bench("store", keys=("memories", "edge.writes_per_s", "client-local", "usem3"),
          headline=("edge.writes_per_s", "edge.search_p99_ms",
                    "client-local.search_p99_ms")),
    Bench("crypto", keys=("publish_plain_us", "publish_sealed_us", "read_sealed_us",
                          "bytes_plain", "bytes_sealed"),
          headline=("publish_sealed_us", "read_sealed_us", "bytes_sealed")),
    Bench("tracing", keys=("params", "off.ingest_us", "on.ingest_us", "off.extract_us",
                           "on.extract_us", "ratios"),
          headline=("ratios.ingest_us", "ratios.extract_us")),
    Bench("consumer", broker=True,
          keys=("events", "bytes.update.ratio_sealed", "produce_us.sealed.ratio",
                "read_per_s.changelog_raw", "read_per_s.changes_sealed", "all_opened"),
          headline=("bytes.update.event_sealed", "produce_us.sealed.ratio",
                    "read_per_s.changelog_raw", "read_per_s.changes_plain",
                    "read_per_s.changes_sealed")),
    Bench("transactions", broker=True,
          keys=("partitions", "per_partition.cpu_us_per_msg", "per_loop.cpu_us_per_msg",
                "ratio_loop_over_partition.cpu_us_per_msg"),
          headline=("ratio_loop_over_partition.cpu_us_per_msg",
                    "ratio_loop_over_partition.polls_per_s",
                    "per_partition.cpu_us_per_msg")),
    Bench("locomo", broker=True, needs_data=True,
          keys=("conversations", "questions", "results"), headline=("results",),
          timeout_s=240.0),
    Bench("updates", broker=True,
          keys=("stories", "overall.current_in_block_pct", "overall.ok_pct",
                "overall.stale_first", "overall.control_recall_pct",
                "pipeline.messages_covered", "by_kind.control", "verdicts"),
          headline=("overall.ok_pct", "overall.current_in_block_pct", "overall.stale_first",
                    "overall.control_recall_pct", "overall.filler_lines"),
          timeout_s=180.0),
)


def by_name(names: Sequence[str] | None) -> list[Bench]:
    if not names:
        return list(BENCHMARKS)
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; "
                         f"known: {', '.join(known)}")
    return [known[n] for n in names]


def last_json(stdout: str) -> dict[str, Any] | None:
    """The benchmark's JSON: its last non-empty stdout line, if that is a JSON object."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def run_one(bench: Bench, command: list[str], timeout_s: float | None) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(ROOT)})
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        err = f"timed out after {timeout_s} s"
    found = last_json(out)
    return {"name": bench.name, "command": " ".join(command[1:]), "exit": code,
            "seconds": round(time.monotonic() - t0, 1), "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "json": found,
            "headline": {p: dig(found, p) for p in bench.headline} if found else {},
            "stderr_tail": "" if code == 0 else err[-2000:]}


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def markdown(report: Mapping[str, Any]) -> str:
    m = report["machine"]
    rows = [f"# Benchmarks of {report['date']}", "",
            f"Commit {m['commit']}, {m['cpus']} cores, Python {m['python']}, load "
            f"{m['load_start']} at the start, {m['load_end']} at the end"
            f"{' (smoke sizes)' if report['smoke'] else ''}.", "",
            "| benchmark | command | s | load before / after | headline |",
            "|---|---|---|---|---|"]
    for r in report["runs"]:
        head = "; ".join(f"{k}: {v}" for k, v in r["headline"].items())
        if r["exit"] != 0:
            head = f"exit {r['exit']}"
        rows.append(f"| {r['name']} | `{r['command']}` | {r['seconds']} | "
                    f"{r['load_before']} / {r['load_after']} | {head} |")
    return "\n".join(rows) + "\n"


def merged(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """A second run on the same day (``--only``) adds to that day's file: its runs replace
    those of the same benchmarks, the others stay."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return report
    names = {r["name"] for r in report["runs"]}
    kept = [r for r in earlier.get("runs", []) if r.get("name") not in names]
    return {**report, "runs": kept + report["runs"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", default=None, help="comma-separated names")
    ap.add_argument("--smoke", action="store_true", help="every benchmark at its smoke size")
    ap.add_argument("--locomo-data", type=Path, default=None)
    ap.add_argument("--port", type=int, default=19592, help="the run's own broker")
    ap.add_argument("--bootstrap", default=None, help="a running broker instead of our own")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    benches = by_name(args.only.split(",") if args.only else None)
    from memstream.core.settings import Settings
    from memstream.dev import broker as local_broker

    broker = Settings(kafka_port=args.port, kafka_controller_port=args.port + 1)
    bootstrap, started = args.bootstrap, False
    if bootstrap is None and any(b.broker for b in benches):
        started = local_broker.read_pid(local_broker.paths_for(broker)) is None
        local_broker.start(broker, 180.0)
        bootstrap = f"127.0.0.1:{args.port}"
    report: dict[str, Any] = {
        "date": date.today().isoformat(), "smoke": args.smoke,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "commit": commit(), "load_start": round(os.getloadavg()[0], 2)},
        "runs": []}
    try:
        for bench in benches:
            command = bench.command(smoke=args.smoke, bootstrap=bootstrap,
                                    locomo_data=args.locomo_data)
            if command is None:
                print(f"{bench.name}: skipped (needs --locomo-data)", flush=True)
                continue
            print(f"{bench.name}: {' '.join(command[1:])}", flush=True)
            result = run_one(bench, command, bench.timeout_s if args.smoke else None)
            report["runs"].append(result)
            print(f"  exit {result['exit']} in {result['seconds']} s  {result['headline']}",
                  flush=True)
    finally:
        if started:
            local_broker.stop(broker)
    report["machine"]["load_end"] = round(os.getloadavg()[0], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = report["date"] + ("-smoke" if args.smoke else "")
    report = merged(args.out / f"{stem}.json", report)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(f"wrote {args.out / stem}.json and .md")
    print(json.dumps({"date": report["date"], "runs": len(report["runs"]),
                      "failed": [r["name"] for r in report["runs"] if r["exit"] != 0]}))


if __name__ == "__main__":
    main()
