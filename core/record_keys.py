"""The keys records that carry authority are signed and verified with (:mod:`core.record_auth`).

From ``MEMSTREAM_CLUSTER_SECRET`` (and ``MEMSTREAM_CLUSTER_SECRET_PREVIOUS``, verified only,
during a rotation) when it is set. A single worker needs none configured: at its start
(:func:`provide`) it generates a random secret once and keeps it in ``data_dir/record-secret``
(mode 0600), logging the path (never the secret); every later start, and every tool run with
the same ``data_dir`` (the demo's, a stand-in extractor), uses that file. A second worker has
no such file in common with it: it must share ``MEMSTREAM_CLUSTER_SECRET`` with the others,
and without it is refused as before (:mod:`streams.cluster_trust`). A process that has no
secret at all (another Kafka client) signs nothing, and its records change nothing.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path

from memstream.core.record_auth import RecordKeys
from memstream.core.settings import Settings

log = logging.getLogger(__name__)
SECRET_FILE = "record-secret"
_lock = threading.Lock()
_cache: dict[tuple[str, str, str], RecordKeys] = {}


def secret_path(settings: Settings) -> Path:
    return settings.data_dir / SECRET_FILE


def _value(secret: object) -> str:
    getter = getattr(secret, "get_secret_value", None)
    return str(getter()) if getter is not None else ""


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def _create(path: Path) -> str:
    """A new random secret in ``path`` (0600), written whole before it appears (another
    process starting on the same directory at once reads the one that won)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(32)
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(made + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return _read(path) or made
    finally:
        tmp.unlink(missing_ok=True)
    log.info("records that carry authority are signed with a secret generated for this "
             "worker, kept in %s (set MEMSTREAM_CLUSTER_SECRET to run more than one "
             "worker)", path)
    return made


def keys_for(settings: Settings) -> RecordKeys:
    """The keys of ``settings``: the cluster secret's (and the previous one's), else the
    secret kept in the data dir, else none (nothing signed, nothing verifies)."""
    configured = _value(settings.cluster_secret)
    previous = _value(settings.cluster_secret_previous)
    where = "" if configured else str(secret_path(settings))  # no file system call: a
    # key is looked up per record sent or read on the topics that carry authority
    entry = (configured, previous, where)
    with _lock:
        found = _cache.get(entry)
    if found is not None:
        return found
    secret = configured or _read(secret_path(settings))
    keys = RecordKeys.of(secret, previous or None)
    if secret:  # (no secret yet: read again next time, the worker may create it)
        with _lock:
            _cache[entry] = keys
    return keys


def provide(settings: Settings) -> RecordKeys:
    """At a worker's start: its keys, the data dir's secret generated first if there is no
    cluster secret and none is kept yet."""
    if not _value(settings.cluster_secret):
        path = secret_path(settings)
        if _read(path) is None:
            _create(path)
        else:
            log.info("records that carry authority are signed with the secret kept in %s",
                     path)
    return keys_for(settings)
