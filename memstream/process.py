"""Run a memstream worker as a child process (demo, integration tests, benchmarks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from memstream.errors import MemstreamError
from memstream.settings import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``MEMSTREAM_*`` environment that reproduces ``settings`` in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump(exclude_none=True).items():
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"MEMSTREAM_{name.upper()}"] = str(value)
    return env


class WorkerProcess:
    """``memstream worker`` in a subprocess, with its log in a file."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        start_offset = self.log_path.stat().st_size
        env = {**os.environ, **settings_env(self.settings), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream.cli", "worker"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[start_offset:].decode(errors="replace")
            if "[^Worker]: Ready" in text:
                return self
            if self.proc.poll() is not None:
                raise MemstreamError(f"worker exited ({self.proc.returncode}):\n{text[-3000:]}")
            time.sleep(0.2)
        self.stop()
        raise MemstreamError(f"worker not ready after {timeout:.0f}s; see {self.log_path}")

    def stop(self, timeout: float = 30.0, kill: bool = False) -> int | None:
        """SIGTERM (graceful) or SIGKILL (crash) the worker; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
