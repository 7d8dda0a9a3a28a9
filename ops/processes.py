"""``memstream worker --processes N``: the plan of the children and their restart policy.

Pure decisions over plain data (no process is started here; :mod:`memstream.ops.supervisor`
is the thin shell that runs them). With N > 1 one supervisor starts N ``memstream worker``
children, each an ordinary member of the same groups with

- its own data dir ``<data_dir>/p<i>`` (its shards, tables, Faust state),
- its own static group instance id ``<instance id>-p<i>`` (static membership: a restarted
  child takes its partitions back at once; ``''`` stays off for all),
- its own API port ``web_port + 1 + i``, which it advertises to the other workers (reads,
  forwarding and standbys go between the children exactly as between machines), and
- the front port ``web_port`` bound by every child with SO_REUSEPORT once its API serves:
  the kernel spreads client connections over the serving children, no proxy hop.

All children share one cluster secret (``MEMSTREAM_CLUSTER_SECRET``, else the secret kept in
``<data_dir>/record-secret``): a worker without one is alone by design, and the children
sign and verify each other's records and forwarded requests with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from memstream.core.settings import Settings
from memstream.streams.store_layout import single_layout

EXIT_CONFIG = 78  # EX_CONFIG: a setting, not a fault; a restart alone does not help
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # a child that ran this long before it ended starts its backoff afresh


class Refusal(ValueError):
    """A plan that cannot run: one line naming the setting."""


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this OS
        return max(1, os.cpu_count() or 1)


def resolve(value: int | str, cpus: int) -> int:
    """The number of processes ``value`` asks for (``auto``: ``cpus``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return max(1, cpus)
        try:
            value = int(text)
        except ValueError:
            raise Refusal(f"MEMSTREAM_PROCESSES={value!r}: a number of processes (1 or "
                          "more) or auto") from None
    if value < 1:
        raise Refusal(f"MEMSTREAM_PROCESSES={value}: a worker runs at least 1 process "
                      "(auto: one per CPU)")
    return value


@dataclass(frozen=True)
class Child:
    """One child worker: its index and the environment it runs with (on top of the
    supervisor's own)."""

    index: int
    data_dir: Path
    instance_id: str
    port: int | None  # its own API port (advertised), None without the API
    env: Mapping[str, str]


def child_url(advertised: str | None, port: int) -> str | None:
    """A configured advertised URL with the child's port (its host kept), None if unset."""
    if not advertised:
        return None
    parts = urlsplit(advertised.rstrip("/"))
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


def plan(settings: Settings, n: int, secret: str | None = None) -> list[Child]:
    """The N children of ``settings`` (N > 1), or :class:`Refusal` (one line).

    ``secret``: the cluster secret the children share when ``cluster_secret`` is not set
    (the supervisor's data dir's); required then."""
    if n < 2:
        raise Refusal("a supervisor runs 2 or more processes (1 is the plain worker)")
    if single_layout(settings):
        raise Refusal("MEMSTREAM_STORE_PARTITIONED=false keeps one store for one worker: "
                      "run it with MEMSTREAM_PROCESSES=1, or the partitioned store")
    if settings.cluster_secret is None and not secret:
        raise Refusal("the processes share a cluster secret: set MEMSTREAM_CLUSTER_SECRET")
    ports = _ports(settings, n)
    base = settings.instance_id()
    children = []
    for i in range(n):
        data_dir = settings.data_dir / f"p{i}"
        instance = f"{base}-p{i}" if base else ""
        env = {"MEMSTREAM_PROCESSES": "1", "MEMSTREAM_DATA_DIR": str(data_dir),
               "MEMSTREAM_GROUP_INSTANCE_ID": instance}
        if settings.cluster_secret is None and secret:
            env["MEMSTREAM_CLUSTER_SECRET"] = secret
        port = ports[i] if ports else None
        if port is not None:
            env["MEMSTREAM_WEB_PORT"] = str(port)
            env["MEMSTREAM_WEB_SHARED_PORT"] = str(settings.web_port)
            url = child_url(settings.advertised_url, port)
            if url is not None:
                env["MEMSTREAM_ADVERTISED_URL"] = url
        children.append(Child(i, data_dir, instance, port, env))
    return children


def _ports(settings: Settings, n: int) -> list[int]:
    """The children's own ports (none without the API), or a refusal."""
    if not settings.web_enabled:
        return []
    front = settings.web_port
    if front == 0:
        raise Refusal("MEMSTREAM_WEB_PORT=0 with more than one process: the children "
                      "share one front port, name it")
    ports = [front + 1 + i for i in range(n)]
    if ports[-1] > 65535:
        raise Refusal(f"MEMSTREAM_WEB_PORT={front}: the {n} processes use the ports "
                      f"{ports[0]}-{ports[-1]} above it, beyond 65535")
    taken = {"MEMSTREAM_KAFKA_PORT": settings.kafka_port,
             "MEMSTREAM_KAFKA_CONTROLLER_PORT": settings.kafka_controller_port}
    for name, port in taken.items():
        if port in ports:
            raise Refusal(f"MEMSTREAM_WEB_PORT={front}: the {n} processes use the ports "
                          f"{ports[0]}-{ports[-1]}, which hold {name}={port}")
    return ports


# --- restarts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AfterExit:
    """What the supervisor does when a child ends: restart it after ``delay_s``, or stop
    every child and exit with ``exit_code``, or (stopping) just let it be ended."""

    restart: bool
    delay_s: float = 0.0
    exit_code: int | None = None  # stop everything with this code


def backoff_s(failures: int) -> float:
    """The wait before the restart after ``failures`` (1, 2, ...) quick ends in a row."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** max(0, failures - 1))


def after_exit(code: int, stopping: bool, failures: int) -> AfterExit:
    """A child ended with ``code`` (negative: the signal that ended it). ``stopping``: the
    supervisor was told to stop (the child was sent the signal); ``failures``: its quick
    ends in a row, this one included (see :func:`failures_after`)."""
    if stopping:
        return AfterExit(restart=False)
    if code == EXIT_CONFIG:  # a refusal: every child would refuse alike, restarts loop
        return AfterExit(restart=False, exit_code=EXIT_CONFIG)
    return AfterExit(restart=True, delay_s=backoff_s(failures))


def failures_after(previous: int, ran_s: float) -> int:
    """Quick ends in a row once a child that ran ``ran_s`` ended."""
    return 1 if ran_s >= STABLE_S else previous + 1


def exit_code(codes: list[int | None], stopped_by_signal: bool) -> int:
    """The supervisor's exit code once every child ended after a stop: 0 when each ended
    cleanly (0, or by the signal it was sent), else the first other code (1 for a signal)."""
    for code in codes:
        if code is None or code == 0:
            continue
        if code < 0:
            if stopped_by_signal and -code in (2, 15):  # SIGINT, SIGTERM: what it was sent
                continue
            return 1
        return code
    return 0
