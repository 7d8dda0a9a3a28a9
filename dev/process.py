"""Run a memstream worker as a child process (demo, integration tests, benchmarks).

One :class:`WorkerProcess` can be started, crashed (SIGKILL) and restarted many times on the
same settings and data directory; every run is kept as an :class:`Incarnation` (when it was
spawned, became ready, ended, and whether we killed it), which is what the chaos benchmark
measures restarts with. ``spawn`` / ``poll`` / ``wait_ready_async`` never block, so an asyncio
producer keeps its pace while the worker restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from memstream.core.errors import MemstreamError
from memstream.core.settings import Settings
from memstream.ops.processes import cpu_count, resolve

READY_MARKER = "[^Worker]: Ready"  # Faust's: every part started (the loops still join)
API_MARKER = "HTTP API on "  # memstream.web.serve: the API took its port over
CHILD_RESTARTED = " restarted (pid "  # the supervisor's line (memstream.ops.supervisor)


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A port p with p .. p+n free now (``--processes n``: the front port and the
    children's own ports above it)."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port + n > 65535:
            continue
        try:
            for p in range(port, port + n + 1):
                with socket.socket() as s:
                    s.bind((host, p))
        except OSError:
            continue
        return port


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``MEMSTREAM_*`` environment that reproduces ``settings`` in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump(exclude_none=True).items():
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, list | tuple | dict):  # complex fields are JSON in the environment
            value = json.dumps(value)
        env[f"MEMSTREAM_{name.upper()}"] = str(value)
    return env


@dataclass
class Incarnation:
    """One run of the worker process (times are wall-clock seconds, ``time.time()``)."""

    pid: int
    spawned_at: float
    log_offset: int  # where this run's output starts in the log file
    ready_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    killed: bool = False  # ended by our SIGKILL (a simulated crash)


class WorkerProcess:
    """``memstream worker`` in a subprocess, with its log in a file (appended across runs)."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnations: list[Incarnation] = []

    @property
    def current(self) -> Incarnation | None:
        return self.incarnations[-1] if self.incarnations else None

    def spawn(self) -> WorkerProcess:
        """Start the worker and return at once (see :meth:`poll`, :meth:`wait_ready`)."""
        if self.alive():
            raise MemstreamError("the worker is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memstream.cli", "worker"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        self.incarnations.append(Incarnation(self.proc.pid, time.time(), offset))
        return self

    def log_text(self) -> str:
        """What the current run has logged so far."""
        run = self.current
        if run is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(run.log_offset)
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll(self) -> str:
        """``"starting"``, ``"ready"`` or ``"exited"`` (also records ready / exit times)."""
        run = self.current
        if run is None or self.proc is None:
            return "exited"
        code = self.proc.poll()
        if code is not None:
            if run.ended_at is None:
                run.ended_at, run.exit_code = time.time(), code
            return "exited"
        if run.ready_at is None and self._ready_lines(self.log_text()) >= 1:
            run.ready_at = time.time()
        return "ready" if run.ready_at is not None else "starting"

    def processes(self) -> int:
        """The member processes it runs (``memstream worker --processes``; 1: itself)."""
        return resolve(self.settings.processes, cpu_count())  # as the supervisor counts

    def children(self) -> dict[int, int]:
        """Child index -> pid of a supervisor's children now (empty: none, or not yet)."""
        try:
            found = json.loads((self.settings.data_dir / "processes.json").read_text())
        except (OSError, ValueError):
            return {}
        return {int(i): int(pid) for i, pid in found.get("children", {}).items()}

    def all_ready(self) -> bool:
        """Every member ready: the worker itself, or each of a supervisor's children in
        its current run (as many Ready lines as child starts, restarts included)."""
        if self.poll() != "ready":
            return False
        n = self.processes()
        if n == 1:
            return True
        text = self.log_text()
        return self._ready_lines(text) >= n + text.count(CHILD_RESTARTED)

    def _ready_lines(self, text: str) -> int:
        """Member starts that are ready: Faust's Ready line, and with ``web_enabled`` the
        API serving (Faust's line comes before the API takes over from the startup probes,
        which answer nothing but /v1/live and /v1/health)."""
        ready = text.count(READY_MARKER)
        return min(ready, text.count(API_MARKER)) if self.settings.web_enabled else ready

    def kill_child(self, index: int) -> int | None:
        """SIGKILL one child of a supervisor (a crash its supervisor restarts); its pid."""
        pid = self.children().get(index)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    def wait_ready(self, timeout: float = 90.0) -> WorkerProcess:
        """Block until the current run is ready; raises if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.poll()
            if state == "ready":
                return self
            if state == "exited":
                raise MemstreamError(f"worker exited ({self.proc and self.proc.returncode}):\n"
                                     f"{self.log_text()[-3000:]}")
            time.sleep(0.2)
        self.stop()
        raise MemstreamError(f"worker not ready after {timeout:.0f}s; see {self.log_path}")

    async def wait_ready_async(self, timeout: float = 90.0) -> bool:
        """Like :meth:`wait_ready` without blocking the loop; False if it exited or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.poll()
            if state != "starting":
                return state == "ready"
            await asyncio.sleep(0.1)
        return False

    def start(self, timeout: float = 90.0) -> WorkerProcess:
        return self.spawn().wait_ready(timeout)

    def stop(self, timeout: float = 30.0, kill: bool = False) -> int | None:
        """SIGTERM (graceful) or SIGKILL (crash) the worker; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            self.poll()
            return None if self.proc is None else self.proc.returncode
        run = self.current
        if kill:
            if run is not None:
                run.killed = True
            with contextlib.suppress(ProcessLookupError):  # its own session: the whole group
                os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout)
        self.poll()
        return code

    def kill(self) -> int | None:
        """Crash the worker (SIGKILL): no shutdown hook, no commit, no flush."""
        return self.stop(kill=True)

    def restart(self, *, kill: bool = True, wait: bool = True,
                timeout: float = 90.0) -> WorkerProcess:
        """Stop (SIGKILL by default) and spawn again on the same settings and data dir."""
        self.stop(kill=kill)
        self.spawn()
        return self.wait_ready(timeout) if wait else self

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
