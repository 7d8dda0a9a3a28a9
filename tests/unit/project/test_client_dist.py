"""The light client distribution (clients/python, ``memstream-client``) seen from the
server: one version, the server pinned to it, every import of the client declared, and the
server's Settings taken as the client's Kafka connection, field for field."""

from __future__ import annotations

import ast
import asyncio
import re
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import SecretStr

from memstream.client import AsyncMemoryClient, KafkaConnection
from memstream.core import kafka
from memstream.core.settings import Settings

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
CLIENT = ROOT / "clients" / "python"


def project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


def test_one_version_and_the_server_pins_the_client_to_it():
    version = (ROOT / "VERSION").read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+\n", version)
    assert (CLIENT / "VERSION").is_symlink()
    assert (CLIENT / "VERSION").resolve() == (ROOT / "VERSION").resolve()
    assert f"memstream-client=={version.strip()}" in project(ROOT)["dependencies"]


def declared(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=; ]", r)[0].replace("-", "_").lower() for r in requirements}


def imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """Every imported module with whether it is imported at module level."""
    top = {id(node) for node in tree.body}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top))
    return found


def test_every_import_of_the_client_is_declared_and_aiokafka_only_when_used():
    meta = project(CLIENT)
    base = declared(meta["dependencies"])
    extras = set().union(*(declared(v) for v in meta["optional-dependencies"].values()))
    assert base == {"pydantic", "urllib3"} and extras == {"aiokafka", "cryptography"}
    own = ("memstream.client", "memstream.contract", "memstream.consumer", "memstream.sealing")
    seen: set[str] = set()
    for path in (CLIENT / "memstream").rglob("*.py"):
        # memstream.consumer and memstream.sealing are the kafka extra's own packages
        of_extra = path.parent.name in ("consumer", "sealing")
        for module, at_top in imports(ast.parse(path.read_text())):
            name = module.split(".")[0]
            seen.add(name)
            if name == "memstream":
                assert module.startswith(own), (path, module)
                assert of_extra or not module.startswith(own[2:]), (path, module)
            elif name not in sys.stdlib_module_names and name != "__future__":
                assert name in base | extras, (path, module)
                # an extra is imported where it is used, so the base install imports
                assert name in base or of_extra or not at_top, (path, module)
    assert {"pydantic", "urllib3", "aiokafka", "cryptography"} <= seen


def test_the_servers_settings_are_a_client_connection_field_for_field():
    assert set(KafkaConnection.model_fields) <= set(Settings.model_fields)
    for name, field in KafkaConnection.model_fields.items():
        assert Settings.model_fields[name].default == field.default, name
    settings = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="chat",
                        kafka_sasl_password=SecretStr("pw"), kafka_sasl_mechanism="SCRAM-SHA-256",
                        bootstrap_servers="k1:9093,k2:9093")
    server = kafka.connection(settings)
    client = KafkaConnection.of(settings).aiokafka_options()
    assert set(server) == set(client)
    assert {k: v for k, v in server.items() if k != "ssl_context"} == \
        {k: v for k, v in client.items() if k != "ssl_context"}


def test_the_client_takes_the_servers_settings_for_the_per_tenant_layout():
    client = AsyncMemoryClient("http://w:6066", "k", tenant_id="acme", topic_prefix="ms",
                               kafka=Settings(input_topics="per-tenant", tenants="acme"))
    try:
        records = client._message_records(client._chat("hello", "ana", "s1", "user"))
        assert [r.topic for r in records] == ["ms.tenant.acme.messages"]
    finally:
        asyncio.run(client.aclose())
