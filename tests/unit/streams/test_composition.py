"""The composition root (streams/app.py build_app, memstream/worker.py): every part the
Pipeline declares is built once, in one place, and the parts the app runs are added in the
order it starts them (it stops them in the reverse order: streams.lifecycle)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from memstream.core.settings import Settings
from memstream.memory.crypto.user_keys import UserKeys
from memstream.streams import lifecycle
from memstream.streams.cluster import Cluster
from memstream.streams.owned_loop import OwnedLoop
from memstream.streams.shards import ShardKeeper
from memstream.streams.standby import GlobalCopy, Standbys
from memstream.worker import build_worker

pytestmark = pytest.mark.unit
ADMIN = SecretStr("k-1-admin-0123456789abcdef01234567")


def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: object):
    """The worker built from settings, and the names of the parts added to its app."""
    added: list[str] = []
    run = lifecycle.run

    def recorded(app, name, *args, **kwargs):  # type: ignore[no-untyped-def]
        added.append(name)
        return run(app, name, *args, **kwargs)

    monkeypatch.setattr(lifecycle, "run", recorded)
    settings = Settings(data_dir=tmp_path, embedder="hashing",  # type: ignore[arg-type]
                        admin_key=ADMIN, **overrides)
    return build_worker(settings), added


def test_every_declared_part_with_the_partitioned_store_and_a_master_key(tmp_path, monkeypatch):
    p, added = built(tmp_path, monkeypatch, extract_enabled=True, web_enabled=True,
                     jobs_enabled=True, store_partitioned=True,
                     master_key=SecretStr("a master key of the composition test"))
    assert added == ["store-shards", "ingest-loop", "user-keys", "extract-loop", "apply-loop",
                     "access-loop", "http-api"]  # shards closed last, the API stopped first
    assert isinstance(p.cluster, Cluster) and isinstance(p.user_keys, UserKeys)
    assert isinstance(p.shards, ShardKeeper) and isinstance(p.standbys, Standbys)
    assert isinstance(p.global_copy, GlobalCopy)
    assert p.shards.standbys is p.standbys  # the keeper hands over the standbys' copies
    assert p.shards.store is p.services.store is p.global_copy.store
    assert len(p.cluster.listeners) == 1  # the standbys follow the apply group's maps
    assert [loop.stage.name for loop in p.loops if isinstance(loop, OwnedLoop)] == [
        "ingest", "extract", "apply", "access"]  # every loop here, in start order
    assert p.api is not None and p.api.started is False  # serving once the app started


def test_the_parts_a_worker_without_them_does_not_build(tmp_path, monkeypatch):
    p, added = built(tmp_path, monkeypatch, extract_enabled=True, web_enabled=False,
                     store_partitioned=False)
    assert added == ["ingest-loop", "extract-loop", "apply-loop", "access-loop", "store-swap"]
    assert isinstance(p.cluster, Cluster)
    assert (p.user_keys, p.shards, p.standbys, p.global_copy, p.api) == (None,) * 5


def test_the_windowed_jobs_alone_run_in_the_apply_loop(tmp_path, monkeypatch):
    p, added = built(tmp_path, monkeypatch, ingest_enabled=False, extract_enabled=False,
                     web_enabled=False, jobs_enabled=True,
                     master_key=SecretStr("a master key of the composition test"))
    assert added == ["store-shards", "jobs-loop"]  # no user keys: it seals and serves nothing
    assert p.user_keys is None and len(p.loops) == 1
