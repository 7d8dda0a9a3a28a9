"""A real single-node Apache Kafka broker (KRaft) run from Maven Central jars.

``memstream broker start`` resolves ``org.apache.kafka:kafka_2.13`` with ``mvn`` into a jar
cache, formats KRaft storage, starts one combined broker+controller on 127.0.0.1 and waits
until a client round-trip (create topic, produce, consume) succeeds. ``stop`` sends SIGTERM
to the recorded PID (controlled shutdown). No Docker and no tarball are needed.

``memstream broker start --brokers N`` (:class:`Cluster`) runs N such nodes from the same
jars as one KRaft cluster (every node broker and controller, N voters, one cluster id;
internal and default topics replicated 3 / min.insync.replicas 2 from three nodes on).
Port scheme: node i (1..N) serves clients on ``kafka_port + 10·(i-1)``, its controller one
above; node 1 holds the pair a single broker of this instance would, so instances 100
ports apart never collide. ``Cluster`` also serves benchmarks and tests: a partition's
leader from the metadata, SIGKILL a node, restart it on its config and data, wait until
every partition's ISR is full again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstream.core.errors import BrokerError
from memstream.core.settings import Settings

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>memstream</groupId><artifactId>kafka-runtime</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{version}</version></dependency>{extra}
  </dependencies>
</project>
"""
# Kafka 4.x logs through slf4j 1.7 with log4j2 on the runtime path but no binding: add the
# binding at exactly the log4j version the broker resolves to.
_SLF4J_BINDING = """
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>"""
_LOG4J_CORE = re.compile(r"org\.apache\.logging\.log4j:log4j-core:jar:([\w.\-]+):")

_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log}" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="INFO"/>
    <Logger name="org.apache.kafka" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""

_SERVER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners={listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners={listener}://127.0.0.1:{port}
inter.broker.listener.name={listener}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,{listener}:{listener}
{sasl}log.dirs={logdir}
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.check.interval.ms=5000
log.cleaner.backoff.ms=2000
"""


# ``--sasl``: the client listener asks every client to log in (SASL/PLAIN); the broker
# itself logs in as an internal user whose password is made anew at each start.
_SASL = """sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=\\
  org.apache.kafka.common.security.plain.PlainLoginModule required \\
  username="broker" password="{broker}" user_broker="{broker}" {users};
"""
_SASL_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")
# ``--authorizer`` (with ``--sasl``): ACLs decide what each user may do (KRaft's
# StandardAuthorizer, nothing allowed without an ACL). The configured user is a super user
# (it applies the ACLs), as is the broker's internal one; so is ANONYMOUS, the principal of
# the loopback-only PLAINTEXT controller listener the broker's own controller calls use.
_AUTHORIZER = """authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:broker;User:ANONYMOUS;User:{user}
"""


@dataclass(frozen=True)
class BrokerPaths:
    """Where one broker installation keeps its jars, config, data, log and PID."""

    home: Path
    version: str
    port: int
    run_dir: Path | None = None  # a cluster's node: <home>/cluster-<port>/node-<id>

    @property
    def lib(self) -> Path:
        return self.home / f"kafka-{self.version}" / "lib"

    @property
    def run(self) -> Path:
        return self.run_dir or self.home / f"broker-{self.port}"

    @property
    def data(self) -> Path:
        return self.run / "data"

    @property
    def pid_file(self) -> Path:
        return self.run / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.run / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.run / "stdout.log"

    @property
    def listener_file(self) -> Path:
        return self.run / "listener"  # PLAINTEXT or SASL_PLAINTEXT: how clients connect


def paths_for(settings: Settings) -> BrokerPaths:
    return BrokerPaths(settings.kafka_home, settings.kafka_version, settings.kafka_port)


def _mvn(build: Path, pom: str, *goal: str) -> None:
    (build / "pom.xml").write_text(pom)
    proc = subprocess.run(["mvn", "-q", "-B", *goal], cwd=build, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise BrokerError(f"mvn {goal[0]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-1000:]}")


def fetch_jars(paths: BrokerPaths) -> Path:
    """Resolve the broker and its log4j2 slf4j binding from Maven Central into ``paths.lib``."""
    marker = paths.lib / ".complete"
    if marker.exists():
        return paths.lib
    if shutil.which("mvn") is None:
        raise BrokerError("mvn is not on PATH: install Maven (apt-get install maven)")
    build = paths.lib.parent / "resolve"
    build.mkdir(parents=True, exist_ok=True)
    listing = build / "deps.txt"
    _mvn(build, _POM.format(version=paths.version, extra=""),
         "dependency:list", "-DincludeScope=runtime", f"-DoutputFile={listing}")
    found = _LOG4J_CORE.search(listing.read_text())
    if found is None:
        raise BrokerError(f"kafka_2.13:{paths.version} brings no log4j-core: only Kafka 4.x "
                          "is supported by this script")
    extra = _SLF4J_BINDING.format(log4j=found.group(1))
    _mvn(build, _POM.format(version=paths.version, extra=extra),
         "dependency:copy-dependencies", "-DincludeScope=runtime",
         f"-DoutputDirectory={paths.lib}")
    marker.write_text(paths.version)
    return paths.lib


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _java(paths: BrokerPaths, main: str, *args: str, heap: str = "256m") -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH: Kafka 4.x needs Java 17 or newer")
    return [
        java, f"-Xmx{heap}", f"-Xms{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={paths.run / 'log4j2.xml'}",
        f"-Dkafka.logs.dir={paths.run}",
        "-cp", f"{paths.lib}/*", main, *args,
    ]


def _sasl_user(user: str, secret: str) -> str:
    if not _SASL_USER.fullmatch(user) or user == "broker":
        raise BrokerError(f"SASL user {user!r}: letters, digits, '.', '_', '-' only "
                          "(and not 'broker')")
    if any(c in secret for c in '"\\\n'):
        raise BrokerError("the SASL password must not contain quotes, backslashes or newlines")
    return f'user_{user}="{secret}"'


def _sasl_block(settings: Settings, users: Mapping[str, str] | None = None,
                authorizer: bool = False) -> str:
    """The SASL/PLAIN listener: the configured user and ``users`` (name -> password) may
    log in; with ``authorizer``, ACLs decide what each may do (the configured user: all)."""
    user, password = settings.kafka_sasl_username, settings.kafka_sasl_password
    if not user or password is None:
        raise BrokerError("broker start --sasl needs MEMSTREAM_KAFKA_SASL_USERNAME and "
                          "MEMSTREAM_KAFKA_SASL_PASSWORD (the user clients log in as)")
    first = _sasl_user(user, password.get_secret_value())
    others = " ".join(_sasl_user(u, p) for u, p in (users or {}).items() if u != user)
    block = _SASL.format(broker=uuid.uuid4().hex, users=f"{first} {others}".strip())
    return block + (_AUTHORIZER.format(user=user) if authorizer else "")


def configure(paths: BrokerPaths, settings: Settings, sasl: bool = False,
              users: Mapping[str, str] | None = None, authorizer: bool = False) -> Path:
    """Write server.properties and log4j2.xml; format KRaft storage once."""
    paths.run.mkdir(parents=True, exist_ok=True)
    props = paths.run / "server.properties"
    listener = "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
    props.touch(mode=0o600)
    props.chmod(0o600)  # it holds the SASL passwords
    props.write_text(_SERVER.format(
        port=settings.kafka_port, cport=settings.kafka_controller_port, logdir=paths.data,
        listener=listener, sasl=_sasl_block(settings, users, authorizer) if sasl else "",
    ))
    paths.listener_file.write_text(listener)
    (paths.run / "log4j2.xml").write_text(_LOG4J2.format(log=paths.log_file))
    if not (paths.data / "meta.properties").exists():
        cmd = _java(paths, "kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}",
                    f"--config={props}", "--ignore-formatted")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(f"formatting KRaft storage failed:\n{proc.stdout}{proc.stderr}")
    return props


def read_pid(paths: BrokerPaths) -> int | None:
    """The PID of this broker, if it runs. A PID file outlives its process (a SIGKILLed run,
    a reboot) and the number is reused: the PID counts only while that process is the JVM
    started with this broker's properties (never stop someone else's process)."""
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid if _runs_here(pid, paths) else None


def _runs_here(pid: int, paths: BrokerPaths) -> bool:
    """Whether process ``pid`` was started with this broker's server.properties, or is a
    child this process just started (between its fork and its exec the child still shows
    our command line). Linux's /proc; elsewhere the PID file is trusted."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        parent = int(_stat(pid)[1])
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc here: trust the file
    except OSError:
        return True
    return str(paths.run / "server.properties").encode() in cmdline or parent == os.getpid()


def client_settings(settings: Settings) -> Settings:
    """``settings`` as a client of the local broker: its address, and SASL/PLAIN with the
    configured user when it was started with ``--sasl``."""
    paths = paths_for(settings)
    update: dict[str, object] = {"bootstrap_servers": f"127.0.0.1:{settings.kafka_port}"}
    try:
        sasl = paths.listener_file.read_text().strip() == "SASL_PLAINTEXT"
    except OSError:
        sasl = False
    if sasl:
        update.update(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN")
    elif settings.kafka_security_protocol == "SASL_PLAINTEXT":
        update.update(kafka_security_protocol="PLAINTEXT")
    return settings.model_copy(update=update)


async def round_trip(settings: Settings, timeout: float = 10.0, replication: int = 1) -> None:
    """Create a topic, produce one record and read it back: the broker really serves.
    ``replication`` above 1 (a cluster): the topic has that many replicas and
    min.insync.replicas one less, so the acks=all write needs that many nodes in sync."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    from memstream.core import kafka

    topic = "__memstream_ready"
    admin = kafka.admin(settings, request_timeout_ms=5000)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            configs = {"min.insync.replicas": str(replication - 1)} if replication > 1 else {}
            await admin.create_topics([NewTopic(topic, 1, replication,
                                                topic_configs=configs)])
    finally:
        await admin.close()
    token = uuid.uuid4().bytes
    producer = kafka.producer(settings, request_timeout_ms=5000)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, token)
    finally:
        await producer.stop()
    consumer = kafka.consumer(settings, enable_auto_commit=False)
    await consumer.start()
    try:
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, meta.partition)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        batch = await consumer.getmany(tp, timeout_ms=int(timeout * 1000))
        if not any(r.value == token for r in batch.get(tp, [])):
            raise BrokerError("round trip: produced record was not read back")
    finally:
        await consumer.stop()


def wait_ready(settings: Settings, paths: BrokerPaths, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if read_pid(paths) is None:
            tail = paths.stdout_file.read_text(errors="replace")[-3000:]
            raise BrokerError(f"broker exited during start-up:\n{tail}")
        started = paths.log_file.exists() and "Kafka Server started" in paths.log_file.read_text(
            errors="replace"
        )
        if started:
            try:
                asyncio.run(asyncio.wait_for(round_trip(client_settings(settings)), 20))
                return
            except Exception as exc:
                last = exc
        time.sleep(0.5)
    raise BrokerError(f"broker not ready after {timeout:.0f}s (last error: {last!r})")


def start(settings: Settings, timeout: float = 90.0, sasl: bool = False,
          users: Mapping[str, str] | None = None, authorizer: bool = False) -> int:
    """Start the local broker (idempotent) and return its PID once it serves clients.

    ``sasl``: its client listener is SASL_PLAINTEXT (PLAIN), the users being
    ``kafka_sasl_username`` / ``kafka_sasl_password`` and ``users`` (name -> password);
    clients without them are refused. ``authorizer`` (with ``sasl``): Kafka's
    StandardAuthorizer, the configured user a super user, every other one allowed only
    what an ACL allows (``memstream acls --apply``).
    """
    if (users or authorizer) and not sasl:
        raise BrokerError("users and the authorizer need --sasl (the users log in)")
    paths = paths_for(settings)
    pid = read_pid(paths)
    if pid is not None:
        wait_ready(settings, paths, timeout)
        return pid
    fetch_jars(paths)
    props = configure(paths, settings, sasl=sasl, users=users, authorizer=authorizer)
    if paths.log_file.exists():
        paths.log_file.unlink()
    out = paths.stdout_file.open("ab")
    cmd = _java(paths, "kafka.Kafka", str(props), heap=settings.kafka_heap)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    paths.pid_file.write_text(str(proc.pid))
    wait_ready(settings, paths, timeout)
    return proc.pid


def stop(settings: Settings, timeout: float = 60.0) -> bool:
    """SIGTERM the broker (controlled shutdown); SIGKILL after ``timeout``."""
    paths = paths_for(settings)
    pid = read_pid(paths)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
    paths.pid_file.unlink(missing_ok=True)
    return True


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wipe(settings: Settings) -> None:
    """Delete the local broker's data (it must be stopped)."""
    paths = paths_for(settings)
    if read_pid(paths) is not None:
        raise BrokerError("stop the broker before wiping its data")
    shutil.rmtree(paths.run, ignore_errors=True)


# --- a cluster of N nodes on this machine --------------------------------------------------
#
# ``memstream broker start --brokers N``: N combined broker+controller nodes (KRaft, N static
# controller voters) from the same jars, one cluster id, each with its own ports, data dir,
# log and PID under ``<kafka_home>/cluster-<kafka_port>/node-<id>``. Port scheme: node i
# (1..N) serves clients on ``kafka_port + 10·(i-1)`` and its controller one above, so node 1
# holds the very pair a single broker of this instance would (one instance is either a
# single broker or a cluster) and the others sit 10 and 20 above it: instances 100 apart
# (19092, 19292, 29092, ...) never share a port. Ports already taken refuse the start.

NODE_STRIDE = 10
MAX_NODES = 9  # node 9 listens on kafka_port + 80: still below the next instance
STARTED = "Kafka Server started"


@dataclass(frozen=True)
class Node:
    """One node of a local cluster: broker and controller in one JVM."""

    node_id: int
    port: int
    controller_port: int
    paths: BrokerPaths

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def cluster_dir(settings: Settings) -> Path:
    return settings.kafka_home / f"cluster-{settings.kafka_port}"


def cluster_nodes(settings: Settings, brokers: int) -> list[Node]:
    """The nodes of a cluster of ``brokers`` on ``settings.kafka_port`` (the port scheme)."""
    if not 1 <= brokers <= MAX_NODES:
        raise BrokerError(f"a local cluster has 1 to {MAX_NODES} nodes, not {brokers}")
    home = cluster_dir(settings)
    out = []
    for node_id in range(1, brokers + 1):
        port = settings.kafka_port + NODE_STRIDE * (node_id - 1)
        out.append(Node(node_id, port, port + 1, BrokerPaths(
            settings.kafka_home, settings.kafka_version, port, home / f"node-{node_id}")))
    return out


def cluster_replication(brokers: int) -> tuple[int, int]:
    """The replication factor and min.insync.replicas of a cluster's internal and default
    topics: 3 / 2 from three nodes on, else the node count / one less (at least 1)."""
    factor = min(3, brokers)
    return factor, max(1, factor - 1)


def voters(nodes: list[Node]) -> str:
    """``controller.quorum.voters``: every node is a voter."""
    return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)


def port_scheme(nodes: list[Node]) -> str:
    """One line per node: its id, client and controller ports (for ``broker status``)."""
    return "\n".join(f"node {n.node_id}: 127.0.0.1:{n.port} (controller {n.controller_port})"
                     for n in nodes)


_CLUSTER_SERVER = """process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={logdir}
num.partitions=1
default.replication.factor={factor}
min.insync.replicas={min_isr}
unclean.leader.election.enable=false
offsets.topic.replication.factor={factor}
offsets.topic.num.partitions=8
transaction.state.log.replication.factor={factor}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor={factor}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.check.interval.ms=5000
log.cleaner.backoff.ms=2000
"""


def node_properties(node: Node, nodes: list[Node]) -> str:
    """server.properties of one node of the cluster ``nodes``."""
    factor, min_isr = cluster_replication(len(nodes))
    return _CLUSTER_SERVER.format(node_id=node.node_id, voters=voters(nodes), port=node.port,
                                  cport=node.controller_port, logdir=node.paths.data,
                                  factor=factor, min_isr=min_isr)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _running(pid: int) -> bool:
    """Alive and not a zombie: a node started by another process (a test's fixture) and
    SIGKILLed here stays a zombie until that process reaps it."""
    if not _alive(pid):
        return False
    try:
        state = _stat(pid)[0]
    except OSError:
        return True  # no /proc: as alive as the signal says
    return state != "Z"


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: state, parent PID, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()


def _started_since(paths: BrokerPaths, offset: int) -> bool:
    try:
        with paths.log_file.open("rb") as f:
            f.seek(offset)
            return STARTED.encode() in f.read()
    except OSError:
        return False


class Cluster:
    """A local KRaft cluster of ``brokers`` nodes on ``settings.kafka_port`` (see the port
    scheme above), for ``memstream broker start --brokers N``, benchmarks and tests: start
    it, its bootstrap string, a partition's leader, SIGKILL a node and restart it on the
    same config and data, wait until every partition's ISR is full again."""

    def __init__(self, settings: Settings, brokers: int = 3) -> None:
        self.settings = settings
        self.nodes = cluster_nodes(settings, brokers)
        self.home = cluster_dir(settings)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._log_at: dict[int, int] = {}  # where a node's current run starts in its log

    @classmethod
    def found(cls, settings: Settings) -> Cluster | None:
        """The cluster configured on ``settings.kafka_port`` (running or not), if any."""
        try:
            brokers = int((cluster_dir(settings) / "brokers").read_text())
        except (OSError, ValueError):
            return None
        return cls(settings, brokers)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def client_settings(self) -> Settings:
        """``settings`` as a client of this cluster (every node a bootstrap server)."""
        return self.settings.model_copy(update={"bootstrap_servers": self.bootstrap,
                                                "kafka_security_protocol": "PLAINTEXT"})

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def pid(self, node_id: int) -> int | None:
        """The running node's PID (a node this object killed is reaped first)."""
        proc = self._procs.get(node_id)
        if proc is not None and proc.poll() is not None:
            del self._procs[node_id]
        pid = read_pid(self.node(node_id).paths)
        return pid if pid is not None and _running(pid) else None

    def pids(self) -> dict[int, int | None]:
        return {n.node_id: self.pid(n.node_id) for n in self.nodes}

    def running(self) -> bool:
        return any(pid is not None for pid in self.pids().values())

    def configure(self) -> None:
        """Write every node's server.properties and log4j2.xml; format each node's storage
        once, all with the cluster's one id."""
        self.home.mkdir(parents=True, exist_ok=True)
        marker = self.home / "brokers"
        if marker.exists() and marker.read_text().strip() != str(len(self.nodes)):
            raise BrokerError(f"{self.home} holds a cluster of {marker.read_text().strip()} "
                              f"nodes: stop and wipe it before starting {len(self.nodes)}")
        id_file = self.home / "cluster.id"
        if not id_file.exists():
            id_file.write_text(_cluster_id())
        cluster_id = id_file.read_text().strip()
        marker.write_text(str(len(self.nodes)))
        formats: list[tuple[Node, subprocess.Popen[str]]] = []
        for node in self.nodes:
            paths = node.paths
            paths.run.mkdir(parents=True, exist_ok=True)
            props = paths.run / "server.properties"
            props.write_text(node_properties(node, self.nodes))
            paths.listener_file.write_text("PLAINTEXT")
            (paths.run / "log4j2.xml").write_text(_LOG4J2.format(log=paths.log_file))
            if not (paths.data / "meta.properties").exists():  # the nodes side by side
                cmd = _java(paths, "kafka.tools.StorageTool", "format",
                            f"--cluster-id={cluster_id}", f"--config={props}",
                            "--ignore-formatted")
                formats.append((node, subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for node, proc in formats:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise BrokerError(f"formatting node {node.node_id} failed:\n{out}")

    def _spawn(self, node: Node) -> int:
        paths = node.paths
        busy = [p for p in (node.port, node.controller_port) if not _port_free(p)]
        if busy:
            raise BrokerError(f"node {node.node_id}: port {busy[0]} is taken (another broker "
                              f"or instance?); choose another MEMSTREAM_KAFKA_PORT\n"
                              f"{port_scheme(self.nodes)}")
        log = paths.log_file
        self._log_at[node.node_id] = log.stat().st_size if log.exists() else 0
        cmd = _java(paths, "kafka.Kafka", str(paths.run / "server.properties"),
                    heap=self.settings.kafka_heap)
        with paths.stdout_file.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._procs[node.node_id] = proc
        paths.pid_file.write_text(str(proc.pid))
        return proc.pid

    def start(self, timeout: float = 180.0) -> dict[int, int]:
        """Start every node that is not running (idempotent) and return the PIDs once every
        node logged "Kafka Server started" and an acks=all round trip on a replicated topic
        succeeded."""
        if read_pid(paths_for(self.settings)) is not None:
            raise BrokerError(f"a single broker runs on {self.settings.kafka_port}: stop it "
                              "first (one instance is a single broker or a cluster)")
        fetch_jars(self.nodes[0].paths)
        down = [n for n in self.nodes if self.pid(n.node_id) is None]
        if down:
            self.configure()
        for node in down:
            node.paths.log_file.unlink(missing_ok=True)
            self._spawn(node)
        self.wait_ready(timeout)
        return {n: pid for n, pid in self.pids().items() if pid is not None}

    def _check_alive(self, node: Node) -> None:
        if self.pid(node.node_id) is None:
            tail = node.paths.stdout_file.read_text(errors="replace")[-3000:]
            raise BrokerError(f"node {node.node_id} exited during start-up:\n{tail}")

    def wait_started(self, node_id: int, timeout: float = 120.0) -> None:
        """Until the node's current run logged "Kafka Server started"."""
        node = self.node(node_id)
        deadline = time.monotonic() + timeout
        while not _started_since(node.paths, self._log_at.get(node_id, 0)):
            self._check_alive(node)
            if time.monotonic() > deadline:
                raise BrokerError(f"node {node_id} not started after {timeout:.0f}s; see "
                                  f"{node.paths.log_file}")
            time.sleep(0.3)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            self.wait_started(node.node_id, max(1.0, deadline - time.monotonic()))
        factor, _ = cluster_replication(len(self.nodes))
        last: Exception | None = None
        while time.monotonic() < deadline:
            for node in self.nodes:
                self._check_alive(node)
            try:
                asyncio.run(asyncio.wait_for(
                    round_trip(self.client_settings(), replication=factor), 30))
                return
            except Exception as exc:
                last = exc
            time.sleep(0.5)
        raise BrokerError(f"cluster not ready after {timeout:.0f}s (last error: {last!r})")

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (a crash: no controlled shutdown, no flush)."""
        pid = self.pid(node_id)
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._procs.pop(node_id, None)

    def restart(self, node_id: int, timeout: float = 120.0) -> int:
        """Start a stopped (or killed) node again on its config and data; returns its PID
        once it logged "Kafka Server started" (its replicas then catch up: see
        :meth:`wait_in_sync`)."""
        if self.pid(node_id) is not None:
            raise BrokerError(f"node {node_id} is running")
        pid = self._spawn(self.node(node_id))
        self.wait_started(node_id, timeout)
        return pid

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM every node at once (controlled shutdown, ~5-10 s); SIGKILL what is left
        after ``timeout``: a node whose peers are gone can wait for a controller quorum
        that will not come back (seen once in ~20 stops: the last node hung until killed).
        False when none ran."""
        pids = [pid for pid in self.pids().values() if pid is not None]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in pids:
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            node.paths.pid_file.unlink(missing_ok=True)
        self._procs.clear()
        return bool(pids)

    def wipe(self) -> None:
        """Delete every node's data (the cluster must be stopped)."""
        if self.running():
            raise BrokerError("stop the cluster before wiping its data")
        shutil.rmtree(self.home, ignore_errors=True)

    # --- what the cluster reports (metadata) ---------------------------------------------

    async def describe(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        """Metadata of ``topics`` (every topic, internal ones included, when None): one
        dict per topic with its partitions' leader, replicas and ISR."""
        from memstream.core import kafka

        admin = kafka.admin(self.client_settings(), request_timeout_ms=10_000)
        await admin.start()
        try:
            return list(await admin.describe_topics(topics))
        finally:
            await admin.close()

    async def leaders(self, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
        """Each partition's leader (node id; -1 while it has none), of every topic when
        ``topics`` is None."""
        return {(str(t["topic"]), int(p["partition"])): int(p["leader"])
                for t in await self.describe(topics) for p in t["partitions"]}

    async def leader(self, topic: str, partition: int) -> int:
        return (await self.leaders([topic])).get((topic, partition), -1)

    async def out_of_sync(self) -> list[tuple[str, int, list[int], list[int]]]:
        """Partitions (internal ones included) whose ISR is not all their replicas, or
        without a leader: (topic, partition, replicas, isr)."""
        out = []
        for t in await self.describe():
            for p in t["partitions"]:
                replicas, isr = sorted(p["replicas"]), sorted(p["isr"])
                if replicas != isr or p["leader"] < 0:
                    out.append((str(t["topic"]), int(p["partition"]), replicas, isr))
        return sorted(out)

    async def wait_in_sync(self, timeout: float = 120.0) -> float:
        """Seconds until every node runs and every partition's ISR is full again
        (BrokerError after ``timeout``)."""
        t0 = time.monotonic()
        lagging: list[tuple[str, int, list[int], list[int]]] = []
        while time.monotonic() - t0 < timeout:
            if all(pid is not None for pid in self.pids().values()):
                with contextlib.suppress(Exception):
                    lagging = await self.out_of_sync()
                    if not lagging:
                        return time.monotonic() - t0
            await asyncio.sleep(0.5)
        raise BrokerError(f"ISR not full after {timeout:.0f}s: {lagging[:5]}")
