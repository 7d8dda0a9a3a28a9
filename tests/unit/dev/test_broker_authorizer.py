"""The local broker's authorizing mode (memstream broker start --sasl --authorizer --user):
several PLAIN users, KRaft's StandardAuthorizer, the configured user a super user."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.core.errors import BrokerError
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker

pytestmark = pytest.mark.unit


def _settings(tmp_path: Path) -> Settings:
    return Settings(kafka_home=tmp_path, kafka_port=1, kafka_sasl_username="admin",
                    kafka_sasl_password="pw-admin")  # type: ignore[arg-type]


def test_every_user_may_log_in_and_only_acls_decide_with_the_authorizer(tmp_path: Path):
    users = {"worker": "pw-w", "chat-acme": "pw-a", "admin": "ignored"}
    block = local_broker._sasl_block(_settings(tmp_path), users, authorizer=True)
    assert 'user_admin="pw-admin"' in block and 'user_admin="ignored"' not in block
    assert 'user_worker="pw-w"' in block and 'user_chat-acme="pw-a"' in block
    assert ("authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            in block)
    assert "allow.everyone.if.no.acl.found=false" in block
    assert "super.users=User:broker;User:ANONYMOUS;User:admin" in block
    plain = local_broker._sasl_block(_settings(tmp_path), users)
    assert "authorizer" not in plain and 'user_worker="pw-w"' in plain


def test_each_user_is_checked_before_it_is_written(tmp_path: Path):
    with pytest.raises(BrokerError, match="letters, digits"):
        local_broker._sasl_block(_settings(tmp_path), {"a b": "x"})
    with pytest.raises(BrokerError, match="quotes"):
        local_broker._sasl_block(_settings(tmp_path), {"svc": 'x"; user_root="y'})
    with pytest.raises(BrokerError, match="need --sasl"):
        local_broker.start(_settings(tmp_path), authorizer=True)
