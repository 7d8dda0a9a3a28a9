"""``memstream status``: every worker asked (the first one names the others), one that does
not answer listed as such, and the table names owners, standbys and shard states."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from memstream.core.errors import ConfigError
from memstream.core.settings import Settings
from memstream.ops.status import gather, render, serves_what_it_owns

pytestmark = pytest.mark.unit
W1 = {"worker": "w1", "url": "http://w1:1", "store": "partitioned", "groups_aligned": True,
      "workers": {"w1": "http://w1:1", "w2": "http://w2:1"},
      "partitions": {"0": {"owner": "w1", "standbys": ["w2"]},
                     "1": {"owner": "w2", "standbys": []}},
      "shards": {"0": "serving", "1": "standby"}, "lag": {"0": 3},
      "restores": [{"partition": 0, "changes": 42, "seconds": 0.5}], "requests": {}}


def test_every_worker_is_asked_and_one_that_does_not_answer_is_listed():
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        assert request.headers["Authorization"] == f"Bearer {ADMIN}"
        if request.url.host == "w2":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json=W1)

    settings = Settings(metrics_key=SecretStr("mk"), admin_key=SecretStr(ADMIN))
    found = gather(settings, ["http://w1:1/"], transport=httpx.MockTransport(answer))
    assert asked == ["w1", "w2"] and found["http://w1:1"] == W1
    assert found["http://w2:1"] == {"error": "ConnectError"}
    text = render(found)
    assert "worker http://w2:1: not answering (ConnectError)" in text
    assert "serving: partitions 0" in text and "standby: partitions 1" in text
    assert "0  w1  w2" in text and "1  w2  -" in text and "42 changes" in text


ADMIN = "admin-key-status-0123456789abcdef0123"


def test_the_admin_key_is_needed():
    """``/v1/cluster`` names every worker's URL: the metrics key does not open it."""
    with pytest.raises(ConfigError):
        gather(Settings(), ["http://w1:1"])
    with pytest.raises(ConfigError, match="MEMSTREAM_ADMIN_KEY"):
        gather(Settings(metrics_key=SecretStr("mk")), ["http://w1:1"])


def test_a_worker_serves_what_it_owns_only_once_every_owned_shard_is_serving():
    assert serves_what_it_owns(W1)  # owns 0 (serving); 1 is a standby here
    restoring = {**W1, "shards": {"0": "restoring", "1": "standby"}}
    assert not serves_what_it_owns(restoring)
    extra = {**W1, "shards": {"0": "serving", "1": "serving"}}  # serves one it no longer owns
    assert not serves_what_it_owns(extra)
