"""The supervisor of ``memstream worker --processes N``: a thin shell over
:mod:`memstream.ops.processes`.

It starts the planned children (``python -m memstream.cli worker`` with each child's
environment on top of its own), forwards SIGTERM / SIGINT to them and waits for them,
restarts a child that ended by itself after a backoff (one log line per restart), stops every
child and exits 78 when one refuses its configuration, and writes the children's process ids
to ``<data_dir>/processes.json`` (operators and the chaos benchmark kill one from there).

Each child runs in its own session (a terminal's Ctrl-C reaches the supervisor only, which
hands it on once) and, on Linux, is killed with the supervisor if that dies
(``PR_SET_PDEATHSIG``): no orphan keeps a partition.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from memstream.core import record_keys
from memstream.core.settings import Settings
from memstream.ops.processes import Child, Refusal, after_exit, exit_code, failures_after, plan

PIDS_FILE = "processes.json"
POLL_S = 0.2


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _say(line: str) -> None:
    print(f"memstream supervisor: {line}", file=sys.stderr, flush=True)


def shared_secret(settings: Settings) -> str | None:
    """The secret the children share when no cluster secret is set: the one kept in the
    supervisor's data dir (made once, as a single worker makes its own)."""
    if settings.cluster_secret is not None:
        return None
    record_keys.provide(settings)
    return record_keys.secret_path(settings).read_text().strip()


def busy_port(host: str, ports: list[int]) -> int | None:
    """The first of ``ports`` something already listens on (``host``), None if all free."""
    for port in ports:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError:
                return port
    return None


def prepare(settings: Settings, n: int) -> list[Child]:
    """The children, or :class:`Refusal` (one line) before any starts."""
    children = plan(settings, n, shared_secret(settings))
    if settings.web_enabled:
        ports = [settings.web_port] + [c.port for c in children if c.port is not None]
        busy = busy_port(settings.web_host, ports)
        if busy is not None:
            raise Refusal(f"port {busy} is in use: the {n} processes need "
                          f"{settings.web_port} (front, MEMSTREAM_WEB_PORT) and "
                          f"{ports[1]}-{ports[-1]} (their own)")
    return children


class Supervisor:
    """Runs the children until a signal (or a configuration refusal) ends them."""

    def __init__(self, settings: Settings, children: list[Child], loglevel: str = "info",
                 say: Callable[[str], None] = _say) -> None:
        self.settings, self.children, self.loglevel, self.say = settings, children, loglevel, say
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started: dict[int, float] = {}
        self.failures: dict[int, int] = {}
        self.due: dict[int, float] = {}  # restart times of ended children
        self.signals: list[int] = []

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env}
        self.procs[child.index] = subprocess.Popen(
            [sys.executable, "-m", "memstream.cli", "worker", "--loglevel", self.loglevel],
            env=env, start_new_session=True, preexec_fn=_die_with_parent)
        self.started[child.index] = time.monotonic()
        self._write_pids()

    def _write_pids(self) -> None:
        path = Path(self.settings.data_dir) / PIDS_FILE
        body = {"supervisor": os.getpid(),
                "children": {str(i): p.pid for i, p in self.procs.items()}}
        tmp = path.with_name(f".{PIDS_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(body))
        tmp.replace(path)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        # the first signal is handed on in run(); another one ends the children at once
        if len(self.signals) > 1:
            self._send(signal.SIGKILL)

    def _send(self, signum: int) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        for child in self.children:
            self._spawn(child)
        self.say(f"{len(self.children)} processes: " + ", ".join(
            f"p{c.index} pid {self.procs[c.index].pid}"
            + (f" port {c.port}" if c.port is not None else "") for c in self.children)
            + (f"; front port {self.settings.web_port}" if self.settings.web_enabled else ""))
        while not self.signals:
            code = self._watch()
            if code is not None:
                self._send(signal.SIGTERM)
                self._wait()
                return code
            time.sleep(POLL_S)
        self._send(self.signals[0])
        codes = self._wait()
        return exit_code(codes, stopped_by_signal=True)

    def _watch(self) -> int | None:
        """One look at the children: restarts due, ends noticed; a code to exit with."""
        now = time.monotonic()
        for child in self.children:
            i = child.index
            if i in self.due:
                if now >= self.due[i] and not self.signals:
                    del self.due[i]
                    self._spawn(child)
                    self.say(f"p{i} restarted (pid {self.procs[i].pid})")
                continue
            code = self.procs[i].poll()
            if code is None:
                continue
            ran = now - self.started[i]
            self.failures[i] = failures_after(self.failures.get(i, 0), ran)
            decision = after_exit(code, bool(self.signals), self.failures[i])
            if decision.exit_code is not None:
                self.say(f"p{i} refused its configuration (exit {code}): stopping all")
                return decision.exit_code
            if decision.restart:
                self.due[i] = now + decision.delay_s
                self.say(f"p{i} (pid {self.procs[i].pid}) ended with {code} after "
                         f"{ran:.0f}s; restarting in {decision.delay_s:.0f}s")
        return None

    def _wait(self) -> list[int | None]:
        codes: list[int | None] = []
        for i in sorted(self.procs):
            if i in self.due:  # ended earlier, its restart not begun
                codes.append(None)
                continue
            codes.append(self.procs[i].wait())
        with contextlib.suppress(OSError):
            (Path(self.settings.data_dir) / PIDS_FILE).unlink()
        return codes


def supervise(settings: Settings, n: int, loglevel: str = "info") -> int:
    """Plan, check and run ``n`` children; the exit code (a refusal raises first)."""
    return Supervisor(settings, prepare(settings, n), loglevel).run()
