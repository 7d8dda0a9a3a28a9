"""How many memstream modules a message passes through, end to end (a measurement, not a
test).

    .venv/bin/python scripts/message_path.py [--code DIR] [--bootstrap HOST:PORT]

Starts a worker (from this checkout, or from DIR's code with ``--code``) whose every
Python call is seen by a profile hook, then records two windows: an idle one (the
worker's timers, followers and polls) and one in which a session of three facts and its
end go through ingest, extract and apply until its job result is committed. Prints the
memstream modules called in the message window, those not called in the idle one (the
message's own path), and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev.process import READY_MARKER, settings_env
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, SessionEvent

# Runs in the worker: a profile hook that notes the module of every call while
# ``$TRACE_DIR/on`` exists, and writes what it noted to ``$TRACE_DIR/<name>.json`` when
# ``$TRACE_DIR/dump-<name>`` appears.
TRACER = r"""
import json, os, runpy, sys, threading, time
d = os.environ["TRACE_DIR"]; seen = set(); on = [False]
def hook(frame, event, arg):
    if on[0] and event == "call":
        name = frame.f_globals.get("__name__", "")
        if name.startswith("memstream."):
            seen.add(name)
def watch():
    while True:
        time.sleep(0.05)
        on[0] = os.path.exists(os.path.join(d, "on"))
        for f in os.listdir(d):
            if f.startswith("dump-"):
                os.remove(os.path.join(d, f))
                with open(os.path.join(d, f[5:] + ".json"), "w") as out:
                    json.dump(sorted(seen), out)
                seen.clear()
threading.Thread(target=watch, daemon=True).start()
sys.setprofile(hook); threading.setprofile(hook)
sys.argv = ["memstream", "worker"]
runpy.run_module("memstream.cli", run_name="__main__", alter_sys=True)
"""
FACTS = ["I live in Oslo", "I work at Acme as a nurse", "My daughter is called Mia"]


async def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        await asyncio.sleep(0.05)


async def window(trace: Path, name: str, during) -> list[str]:
    (trace / "on").touch()
    await during()
    (trace / "on").unlink()
    (trace / f"dump-{name}").touch()
    await wait_for(trace / f"{name}.json")
    return list(json.loads((trace / f"{name}.json").read_text()))


async def send_session(settings: Settings) -> None:
    topics = registry(settings)
    producer = await start_producer(settings)
    now = datetime.now(UTC)
    try:
        for i, text in enumerate(FACTS):
            m = ChatMessage(tenant_id="acme", user_id="u1", session_id="s1",
                            message_id=f"m{i}", role="user", content=text, ts=now)
            await producer.send(topics.messages.name, m.dumps(), key=m.key().encode())
        end = SessionEvent(tenant_id="acme", user_id="u1", session_id="s1", ts=now)
        await producer.send(topics.session_events.name, end.dumps(), key=end.key().encode())
        await producer.flush()
    finally:
        await producer.stop()


async def result_committed(settings: Settings, timeout: float = 120.0) -> None:
    consumer = kafka.consumer(settings, registry(settings).job_results.name,
                              auto_offset_reset="earliest", enable_auto_commit=False,
                              group_id=None, isolation_level="read_committed")
    await consumer.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                if any(json.loads(r.value).get("status") == "done" for r in records):
                    return
        raise TimeoutError("no job result")
    finally:
        await consumer.stop()


async def measure(settings: Settings, code: str | None, work: Path) -> dict:
    await create_topics(settings)
    trace = work / "trace"
    trace.mkdir(parents=True)
    env = {**os.environ, **settings_env(settings), "TRACE_DIR": str(trace),
           "PYTHONUNBUFFERED": "1"}
    if code:  # (PYTHONSAFEPATH: the working directory's package would come first)
        env.update(PYTHONPATH=code, PYTHONSAFEPATH="1")
    log = (work / "worker.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", TRACER], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while READY_MARKER not in (work / "worker.log").read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start; see " + str(work / "worker.log"))
            await asyncio.sleep(0.2)
        await asyncio.sleep(10)  # its partitions taken, its first timer rounds done
        idle = await window(trace, "idle", lambda: asyncio.sleep(10))

        async def one_message() -> None:
            await send_session(settings)
            await result_committed(settings)

        path = await window(trace, "message", one_message)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        await delete_topics(settings, all_topic_names(settings))
    own = sorted(set(path) - set(idle))
    return {"code": code or "this", "modules_in_message_window": len(path),
            "modules_idle": len(idle), "modules_only_with_the_message": len(own),
            "message_window": path, "only_with_the_message": own}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", default=None, help="the worker's code from this checkout")
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    args = ap.parse_args()
    name = f"path-{uuid.uuid4().hex[:6]}"
    work = Path(tempfile.mkdtemp(prefix="memstream-path-"))
    settings = Settings(bootstrap_servers=args.bootstrap, topic_prefix=name, app_id=name,
                        data_dir=work / "data", web_enabled=False, partitions=1)
    found = asyncio.run(measure(settings, args.code, work))
    print(f"{found['code']}: {found['modules_in_message_window']} modules called while the "
          f"message went through, {found['modules_only_with_the_message']} of them not "
          f"called when idle ({found['modules_idle']})")
    for module in found["only_with_the_message"]:
        print("  " + module)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
