"""``memstream mcp`` on stdio: stdout is the protocol and nothing else. The process is
spawned as an agent spawns it (no worker reachable: every call is an isError result), and
every byte it writes to stdout must be a JSON-RPC message: a stray ``print`` (at import,
in the CLI, in a tool) or a log line on stdout fails here."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
KEY = "msk_abcd_not-a-real-secret-0123456789"


def requests() -> bytes:
    def msg(i: int | None, method: str, params: dict[str, object] | None = None) -> str:
        m: dict[str, object] = {"jsonrpc": "2.0", "method": method}
        if i is not None:
            m["id"] = i
        if params is not None:
            m["params"] = params
        return json.dumps(m)

    lines = [
        msg(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "0"}}),
        msg(None, "notifications/initialized"),
        msg(2, "tools/list"),
        msg(3, "resources/templates/list"),
        msg(4, "tools/call", {"name": "context", "arguments": {"user_id": "u1",
                                                               "query": "where"}}),
        msg(5, "tools/call", {"name": "search", "arguments": {"user_id": "u/1",
                                                              "query": "x"}}),
        msg(6, "resources/read", {"uri": "memstream://users/u1/profile"}),
    ]
    return ("\n".join(lines) + "\n").encode()


def test_stdout_carries_only_json_rpc_and_every_request_is_answered():
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
           "MEMSTREAM_URL": "http://127.0.0.1:9", "MEMSTREAM_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "memstream.cli", "mcp"], cwd=ROOT,
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict[object, dict[str, object]] = {}
    try:
        proc.stdin.write(requests())
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while len(answers) < 6 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                continue
            line = proc.stdout.readline()
            if not line:
                break
            message = json.loads(line)  # a stray line (a print, a log) fails here
            assert message["jsonrpc"] == "2.0", line
            answers[message.get("id")] = message
        proc.stdin.close()  # the agent leaves: the server ends
        proc.wait(timeout=30)
        rest, err = proc.stdout.read(), proc.stderr.read() if proc.stderr else b""
    finally:
        if proc.poll() is None:
            proc.kill()
    for line in rest.decode().splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0", line
    assert set(answers) == {1, 2, 3, 4, 5, 6}
    unreachable, invalid = answers[4]["result"], answers[5]["result"]
    assert isinstance(unreachable, dict) and unreachable["isError"]
    assert "could not be reached" in unreachable["content"][0]["text"]
    # bad arguments are answered as such, without asking a worker first
    assert isinstance(invalid, dict) and "user_id" in invalid["content"][0]["text"]
    assert "error" in answers[6]  # a resource that cannot be read: a JSON-RPC error
    assert KEY not in err.decode()
