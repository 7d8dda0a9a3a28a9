"""A real single-node Apache Kafka broker (KRaft) run from Maven Central jars.

``memstream broker start`` resolves ``org.apache.kafka:kafka_2.13`` with ``mvn`` into a jar
cache, formats KRaft storage, starts one combined broker+controller on 127.0.0.1 and waits
until a client round-trip (create topic, produce, consume) succeeds. ``stop`` sends SIGTERM
to the recorded PID (controlled shutdown). No Docker and no tarball are needed.
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
from dataclasses import dataclass
from pathlib import Path

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
  username="broker" password="{broker}" user_broker="{broker}" user_{user}="{password}";
"""
_SASL_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class BrokerPaths:
    """Where one broker installation keeps its jars, config, data, log and PID."""

    home: Path
    version: str
    port: int

    @property
    def lib(self) -> Path:
        return self.home / f"kafka-{self.version}" / "lib"

    @property
    def run(self) -> Path:
        return self.home / f"broker-{self.port}"

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


def _sasl_block(settings: Settings) -> str:
    user, password = settings.kafka_sasl_username, settings.kafka_sasl_password
    if not user or password is None:
        raise BrokerError("broker start --sasl needs MEMSTREAM_KAFKA_SASL_USERNAME and "
                          "MEMSTREAM_KAFKA_SASL_PASSWORD (the user clients log in as)")
    if not _SASL_USER.fullmatch(user) or user == "broker":
        raise BrokerError(f"SASL user {user!r}: letters, digits, '.', '_', '-' only "
                          "(and not 'broker')")
    secret = password.get_secret_value()
    if any(c in secret for c in '"\\\n'):
        raise BrokerError("the SASL password must not contain quotes, backslashes or newlines")
    return _SASL.format(broker=uuid.uuid4().hex, user=user, password=secret)


def configure(paths: BrokerPaths, settings: Settings, sasl: bool = False) -> Path:
    """Write server.properties and log4j2.xml; format KRaft storage once."""
    paths.run.mkdir(parents=True, exist_ok=True)
    props = paths.run / "server.properties"
    listener = "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
    props.touch(mode=0o600)
    props.chmod(0o600)  # it holds the SASL passwords
    props.write_text(_SERVER.format(
        port=settings.kafka_port, cport=settings.kafka_controller_port, logdir=paths.data,
        listener=listener, sasl=_sasl_block(settings) if sasl else "",
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
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


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


async def round_trip(settings: Settings, timeout: float = 10.0) -> None:
    """Create a topic, produce one record and read it back: the broker really serves."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    from memstream.core import kafka

    topic = "__memstream_ready"
    admin = kafka.admin(settings, request_timeout_ms=5000)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(topic, 1, 1)])
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


def start(settings: Settings, timeout: float = 90.0, sasl: bool = False) -> int:
    """Start the local broker (idempotent) and return its PID once it serves clients.

    ``sasl``: its client listener is SASL_PLAINTEXT (PLAIN), the one user being
    ``kafka_sasl_username`` / ``kafka_sasl_password``; clients without them are refused.
    """
    paths = paths_for(settings)
    pid = read_pid(paths)
    if pid is not None:
        wait_ready(settings, paths, timeout)
        return pid
    fetch_jars(paths)
    props = configure(paths, settings, sasl=sasl)
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
