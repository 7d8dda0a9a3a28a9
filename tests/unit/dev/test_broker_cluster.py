"""The local cluster's pure parts (memstream.dev.broker): node ids, ports, voters and each
node's server.properties for N nodes, and the ``broker`` commands that need no broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.errors import BrokerError
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.broker import (
    MAX_NODES,
    Cluster,
    cluster_nodes,
    cluster_replication,
    node_properties,
    voters,
)

pytestmark = pytest.mark.unit


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(kafka_home=tmp_path, kafka_port=29192, kafka_controller_port=29193)


def test_three_nodes_have_their_own_ids_ports_and_data(settings: Settings, tmp_path: Path):
    nodes = cluster_nodes(settings, 3)
    assert [(n.node_id, n.port, n.controller_port) for n in nodes] == [
        (1, 29192, 29193), (2, 29202, 29203), (3, 29212, 29213)]
    assert [n.paths.run for n in nodes] == [
        tmp_path / "cluster-29192" / f"node-{i}" for i in (1, 2, 3)]
    assert len({n.paths.data for n in nodes}) == 3
    assert nodes[0].paths.lib == local_broker.paths_for(settings).lib  # the same jars
    assert Cluster(settings, 3).bootstrap == "127.0.0.1:29192,127.0.0.1:29202,127.0.0.1:29212"


def test_every_node_names_every_voter_and_the_replication_asked(settings: Settings):
    nodes = cluster_nodes(settings, 3)
    assert voters(nodes) == "1@127.0.0.1:29193,2@127.0.0.1:29203,3@127.0.0.1:29213"
    rendered = [props(node_properties(n, nodes)) for n in nodes]
    for node, p in zip(nodes, rendered, strict=True):
        assert p["node.id"] == str(node.node_id)
        assert p["process.roles"] == "broker,controller"
        assert p["controller.quorum.voters"] == voters(nodes)
        assert p["listeners"] == (f"PLAINTEXT://127.0.0.1:{node.port},"
                                  f"CONTROLLER://127.0.0.1:{node.controller_port}")
        assert p["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{node.port}"
        assert p["log.dirs"] == str(node.paths.data)
        assert {k: p[k] for k in (
            "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr", "default.replication.factor",
            "min.insync.replicas", "unclean.leader.election.enable")} == {
            "offsets.topic.replication.factor": "3",
            "transaction.state.log.replication.factor": "3",
            "transaction.state.log.min.isr": "2", "default.replication.factor": "3",
            "min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
    # the same cluster-wide settings on every node, only the node's own lines differ
    own = {"node.id", "listeners", "advertised.listeners", "log.dirs"}
    assert len({tuple(sorted((k, v) for k, v in p.items() if k not in own))
                for p in rendered}) == 1


@pytest.mark.parametrize(("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)),
                                                   (5, (3, 2))])
def test_replication_follows_the_node_count(brokers: int, expected: tuple[int, int]):
    assert cluster_replication(brokers) == expected


def test_no_port_of_a_cluster_is_another_instances_single_broker(settings: Settings):
    """Instances 100 ports apart (19092, 19292, 29092, ...): a cluster of up to MAX_NODES
    nodes on one of them uses no port of a single broker on another."""
    for base in (19092, 19292, 29092, 29192):
        nodes = cluster_nodes(settings.model_copy(update={"kafka_port": base}), MAX_NODES)
        ports = [p for n in nodes for p in (n.port, n.controller_port)]
        assert len(set(ports)) == len(ports)
        others = {q + d for q in range(base - 1000, base + 1001, 100) if q != base
                  for d in (0, 1)}
        assert not others & set(ports)
        assert (nodes[0].port, nodes[0].controller_port) == (base, base + 1)


@pytest.mark.parametrize("brokers", [0, MAX_NODES + 1])
def test_a_cluster_size_out_of_range_is_refused(settings: Settings, brokers: int):
    with pytest.raises(BrokerError):
        cluster_nodes(settings, brokers)


def test_a_configured_cluster_is_found_by_its_port(settings: Settings):
    assert Cluster.found(settings) is None
    local_broker.cluster_dir(settings).mkdir(parents=True)
    (local_broker.cluster_dir(settings) / "brokers").write_text("3")
    found = Cluster.found(settings)
    assert found is not None and len(found.nodes) == 3 and not found.running()
    assert Cluster.found(settings.model_copy(update={"kafka_port": 29292})) is None


def _cli(settings: Settings, *args: str) -> tuple[int, str]:
    env = {"MEMSTREAM_KAFKA_HOME": str(settings.kafka_home),
           "MEMSTREAM_KAFKA_PORT": str(settings.kafka_port)}
    result = CliRunner().invoke(main, ["broker", *args], env=env)
    return result.exit_code, result.output


def test_the_broker_commands_without_a_broker(settings: Settings):
    assert _cli(settings, "status") == (1, "not running\n")
    assert _cli(settings, "stop") == (0, "not running\n")
    code, out = _cli(settings, "start", "--brokers", "3", "--sasl")
    assert code == 1 and "--sasl is for a single broker only" in out
    code, out = _cli(settings, "start", "--brokers", str(MAX_NODES + 1))
    assert code == 2 and "--brokers" in out
    local_broker.cluster_dir(settings).mkdir(parents=True)
    (local_broker.cluster_dir(settings) / "brokers").write_text("3")
    assert _cli(settings, "status") == (1, "not running\n")  # configured, none running
    assert _cli(settings, "wipe") == (0, "wiped\n")
    assert not local_broker.cluster_dir(settings).exists()


def test_a_stale_pid_file_never_names_another_process(tmp_path):
    """A PID file outlives its broker, and the number is reused: a live process that is not
    this broker's JVM (here: the test itself) is not the broker, so stop() leaves it be."""
    import os

    settings = Settings(kafka_home=tmp_path, kafka_port=19992)
    paths = local_broker.paths_for(settings)
    paths.run.mkdir(parents=True)
    paths.pid_file.write_text(str(os.getpid()))
    assert local_broker.read_pid(paths) is None
    assert local_broker.stop(settings) is False  # and this process is still here
