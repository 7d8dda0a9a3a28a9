"""The ``memstream`` console command."""

from __future__ import annotations

import asyncio
import logging
import sys

import click
from aiokafka.errors import KafkaConnectionError

from memstream import __version__
from memstream.core.errors import BrokerError, ConfigError
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.ops.changes_cli import changes, schemas
from memstream.ops.rebuild import rebuild
from memstream.ops.replay_cli import replay

EXIT_LAYOUT = 78  # EX_CONFIG: the topics do not have the layout the worker needs


class _Main(click.Group):
    """A broker that cannot be reached, or refuses the login, is one clear line."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KafkaConnectionError as exc:
            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            where = settings.bootstrap_servers if settings else "the bootstrap servers"
            how = settings.kafka_security_protocol if settings else "?"
            raise click.ClickException(
                f"Kafka at {where} ({how}): {exc}. Check MEMSTREAM_BOOTSTRAP_SERVERS and, "
                "for a cluster that wants a login, MEMSTREAM_KAFKA_SECURITY_PROTOCOL and "
                "MEMSTREAM_KAFKA_SASL_USERNAME / _PASSWORD") from exc


@click.group(cls=_Main)
@click.version_option(__version__, prog_name="memstream", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """memstream: long-term memory for LLM agents on Kafka."""
    ctx.obj = Settings()


@main.group()
def broker() -> None:
    """The local Apache Kafka broker (KRaft, from Maven Central jars), or a local cluster
    of N nodes (``start --brokers N``).

    A cluster's node i (1..N) serves clients on MEMSTREAM_KAFKA_PORT + 10·(i-1) and its
    controller one port above: node 1 holds the pair a single broker would, the others
    sit 10 and 20 above it, so instances 100 ports apart never collide. Its nodes live in
    <kafka_home>/cluster-<port>/node-<i>; stop, status and wipe handle every node.
    """


def _cluster(settings: Settings) -> local_broker.Cluster | None:
    return local_broker.Cluster.found(settings)


@broker.command("start")
@click.option("--sasl", is_flag=True, help="Clients must log in (SASL_PLAINTEXT, PLAIN) as "
              "MEMSTREAM_KAFKA_SASL_USERNAME / MEMSTREAM_KAFKA_SASL_PASSWORD")
@click.option("--brokers", type=click.IntRange(1, local_broker.MAX_NODES), default=1,
              show_default=True, help="Nodes: more than 1 starts a KRaft cluster (each node "
              "broker and controller; topics 3/2-replicated from 3 nodes on)")
@click.option("--authorizer", is_flag=True, help="With --sasl: ACLs decide what each user "
              "may do (StandardAuthorizer; MEMSTREAM_KAFKA_SASL_USERNAME is a super user; "
              "memstream acls --apply)")
@click.option("--user", "users", multiple=True, metavar="NAME=PASSWORD",
              help="With --sasl: another user who may log in (repeat)")
@click.pass_obj
def broker_start(settings: Settings, sasl: bool, brokers: int, authorizer: bool,
                 users: tuple[str, ...]) -> None:
    """Fetch (once), format (once) and start the broker; wait until it serves clients."""
    cluster = _cluster(settings)
    if brokers == 1:
        if cluster is not None and cluster.running():
            raise click.ClickException(f"a {len(cluster.nodes)}-node cluster runs on "
                                       f"{settings.kafka_port}: `memstream broker stop` first")
        logins = dict(u.split("=", 1) for u in users if "=" in u)
        if len(logins) != len(users):
            raise click.UsageError("--user takes NAME=PASSWORD")
        try:
            pid = local_broker.start(settings, sasl=sasl, users=logins, authorizer=authorizer)
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from exc
        how = (" (SASL_PLAINTEXT, PLAIN" + (", ACLs" if authorizer else "") + ")"
               if sasl else "")
        click.echo(f"kafka {settings.kafka_version} ready on 127.0.0.1:{settings.kafka_port}"
                   f"{how} (pid {pid})")
        return
    if sasl or authorizer or users:
        raise click.ClickException("--sasl is for a single broker only")
    cluster = local_broker.Cluster(settings, brokers)
    try:
        pids = cluster.start()
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    factor, min_isr = local_broker.cluster_replication(brokers)
    click.echo(f"kafka {settings.kafka_version} cluster of {brokers} ready (replication "
               f"{factor}, min.insync.replicas {min_isr}), pids "
               f"{', '.join(str(p) for p in pids.values())}")
    click.echo(f"bootstrap: {cluster.bootstrap}")


@broker.command("stop")
@click.pass_obj
def broker_stop(settings: Settings) -> None:
    """Stop the broker, or every node of the cluster (SIGTERM: controlled shutdown)."""
    cluster = _cluster(settings)
    if cluster is not None and cluster.running():
        running = sum(pid is not None for pid in cluster.pids().values())
        cluster.stop()
        click.echo(f"stopped {running} of {len(cluster.nodes)} nodes")
        return
    stopped = local_broker.stop(settings)
    click.echo("stopped" if stopped else "not running")


@broker.command("status")
@click.pass_obj
def broker_status(settings: Settings) -> None:
    """Exit 0 if the broker (every node of the cluster) runs and serves a round trip, 1
    otherwise; a cluster's status lists its nodes' ports and PIDs."""
    paths = local_broker.paths_for(settings)
    pid = local_broker.read_pid(paths)
    cluster = _cluster(settings)
    if pid is None and cluster is not None and cluster.running():
        _cluster_status(cluster)
        return
    if pid is None:
        click.echo("not running")
        sys.exit(1)
    try:
        asyncio.run(asyncio.wait_for(
            local_broker.round_trip(local_broker.client_settings(settings)), 20))
    except Exception as exc:
        click.echo(f"pid {pid} runs but does not serve: {exc}")
        sys.exit(1)
    click.echo(f"running (pid {pid}), round trip ok; log: {paths.log_file}")


def _cluster_status(cluster: local_broker.Cluster) -> None:
    pids = cluster.pids()
    factor, min_isr = local_broker.cluster_replication(len(cluster.nodes))
    click.echo(f"cluster of {len(cluster.nodes)} nodes in {cluster.home} (replication "
               f"{factor}, min.insync.replicas {min_isr}); port scheme: node i serves on "
               f"{cluster.settings.kafka_port} + {local_broker.NODE_STRIDE}·(i-1), its "
               "controller one above")
    for node in cluster.nodes:
        pid = pids[node.node_id]
        state = f"pid {pid}" if pid is not None else "NOT RUNNING"
        click.echo(f"  node {node.node_id}: 127.0.0.1:{node.port} (controller "
                   f"{node.controller_port}) {state}; log: {node.paths.log_file}")
    click.echo(f"bootstrap: {cluster.bootstrap}")
    try:
        asyncio.run(asyncio.wait_for(local_broker.round_trip(
            cluster.client_settings(), replication=factor), 20))
        lagging = asyncio.run(asyncio.wait_for(cluster.out_of_sync(), 20))
    except Exception as exc:
        click.echo(f"does not serve: {exc}")
        sys.exit(1)
    if lagging:
        click.echo(f"{len(lagging)} partition(s) with an ISR short of their replicas, "
                   f"e.g. {lagging[0][0]}/{lagging[0][1]}: replicas {lagging[0][2]}, "
                   f"ISR {lagging[0][3]}")
    if None in pids.values() or lagging:
        sys.exit(1)
    click.echo("round trip ok (acks=all), every partition's ISR full")


@broker.command("wipe")
@click.pass_obj
def broker_wipe(settings: Settings) -> None:
    """Delete the stopped broker's data directory (and a stopped cluster's nodes')."""
    cluster = _cluster(settings)
    if cluster is not None:
        try:
            cluster.wipe()
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from exc
    local_broker.wipe(settings)
    click.echo("wiped")


@main.group()
def topics() -> None:
    """The topics memstream owns."""


@topics.command("create")
@click.pass_obj
def topics_create(settings: Settings) -> None:
    """Create every topic of the registry that does not exist yet (idempotent) and check
    the existing ones: partitions, replication, cleanup policy, retention (also with
    MEMSTREAM_TOPICS_CREATE=false, which only the worker heeds)."""
    from memstream.topics.layout import LayoutError, prepare

    try:
        layout = asyncio.run(prepare(settings, create=True))
    except LayoutError as exc:
        for line in exc.lines:
            click.echo(line, err=True)
        sys.exit(EXIT_LAYOUT)
    created = layout.created
    click.echo(f"created {len(created)} topic(s): {', '.join(created) or '-'}")
    click.echo(f"every topic checked: {layout.partitions} partitions, "
               f"{layout.replication.describe()}")


@topics.command("grow")
@click.option("--prefix", required=True, help="topic prefix of the new set")
@click.option("--app-id", default=None, help="app id of the new set (default: its prefix)")
@click.option("--partitions", type=click.IntRange(1), required=True,
              help="partition count of the new set")
@click.pass_obj
def topics_grow(settings: Settings, prefix: str, app_id: str | None, partitions: int) -> None:
    """Build a topic set with another partition count from this one's durable topics
    (memory changes, access, events, keys, dead letters), with this set drained and its
    workers stopped; then start the workers on the new set (docs/operations.md, "Growing
    the partition count")."""
    from memstream.ops.topics_grow import grow, target_settings
    from memstream.topics.layout import LayoutError

    new = target_settings(settings, prefix, app_id or prefix, partitions)
    try:
        copied = asyncio.run(grow(settings, new))
    except LayoutError as exc:
        for line in exc.lines:
            click.echo(f"memstream topics grow refuses: {line}", err=True)
        sys.exit(EXIT_LAYOUT)
    for name, (_, written) in copied.items():
        click.echo(f"{name:48} {written:>10} records")
    if any(read != written for read, written in copied.values()):
        click.echo("copy incomplete: records read and written differ", err=True)
        sys.exit(1)
    click.echo(f"copied: {sum(w for _, w in copied.values())} records into {prefix}.* "
               f"({partitions} partitions). Start the workers with "
               f"MEMSTREAM_TOPIC_PREFIX={prefix} MEMSTREAM_APP_ID={new.app_id} "
               f"MEMSTREAM_PARTITIONS={partitions} and a new MEMSTREAM_DATA_DIR, then point "
               f"the producers at {prefix}.messages")


@topics.command("list")
@click.pass_obj
def topics_list(settings: Settings) -> None:
    """Print the registry: name, partitions, cleanup policy, retention."""
    from memstream.topics.registry import registry

    for spec in registry(settings).all():
        keep = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms / 86_400_000:.0f}d"
        click.echo(f"{spec.name:40} {spec.partitions:>3}  {spec.cleanup_policy:8} "
                   f"{keep:>7}  {spec.schema.__name__}")


@topics.command("manifest")
@click.option("--format", "fmt", type=click.Choice(["strimzi", "kafka-topics"]),
              default="strimzi", show_default=True, help="Strimzi KafkaTopic and KafkaUser "
              "resources, or kafka-topics.sh commands")
@click.option("--cluster", default="my-cluster", show_default=True,
              help="the Strimzi Kafka cluster (label strimzi.io/cluster)")
@click.option("--namespace", default=None, help="metadata.namespace (default: none)")
@click.option("--brokers", type=click.IntRange(1), default=3, show_default=True,
              help="the cluster's broker count: the replication where "
                   "MEMSTREAM_REPLICATION_FACTOR is not set, as the worker decides it")
@click.option("--api-version", type=click.Choice(["v1", "v1beta2"]), default="v1",
              show_default=True, help="kafka.strimzi.io/v1 (Strimzi 0.49 on) or v1beta2 "
                                      "(before 1.0)")
@click.option("--authentication", default="scram-sha-512", show_default=True,
              type=click.Choice(["scram-sha-512", "tls", "tls-external"]))
@click.option("--worker-principal", default="User:memstream", show_default=True)
@click.option("--chat-principal", default="User:chat-{tenant}", show_default=True)
@click.option("--reader-principal", default="User:memstream-reader", show_default=True)
@click.option("--reader-group", default="memory-reader", show_default=True)
@click.pass_obj
def topics_manifest(settings: Settings, fmt: str, cluster: str, namespace: str | None,
                    brokers: int, api_version: str, authentication: str,
                    worker_principal: str, chat_principal: str, reader_principal: str,
                    reader_group: str) -> None:
    """Print every topic as `topics create` would create it (partitions, replicas,
    configs) and, for Strimzi, a KafkaUser per principal with its ACLs (memstream acls),
    for a cluster whose topics are managed elsewhere: run the workers with
    MEMSTREAM_TOPICS_CREATE=false then."""
    from memstream.ops import acls as acl_ops
    from memstream.ops import topics_manifest as manifest
    from memstream.topics.layout import LayoutError
    from memstream.topics.registry import tenancy_problems

    problems = tenancy_problems(settings)
    if problems:
        raise click.ClickException("; ".join(problems))
    try:
        if fmt == "kafka-topics":
            click.echo(manifest.kafka_topics_commands(settings, brokers,
                                                      settings.bootstrap_servers), nl=False)
            return
        names = acl_ops.Names(worker_principal, chat_principal, reader_principal,
                              reader_group)
        click.echo(manifest.strimzi_manifest(
            settings, acl_ops.principals(settings, names), brokers=brokers, cluster=cluster,
            api_version=manifest.STRIMZI_API[api_version], namespace=namespace,
            authentication=authentication), nl=False)
    except LayoutError as exc:
        raise click.ClickException("; ".join(exc.lines)) from exc
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command("acls")
@click.option("--format", "fmt", type=click.Choice(["kafka-acls", "strimzi"]),
              default="kafka-acls", show_default=True, help="kafka-acls.sh commands, or "
              "Strimzi KafkaUser resources")
@click.option("--worker-principal", default="User:memstream", show_default=True)
@click.option("--chat-principal", default="User:chat-{tenant}", show_default=True,
              help="a chat service's principal, {tenant} replaced by each tenant")
@click.option("--reader-principal", default="User:memstream-reader", show_default=True)
@click.option("--reader-group", default="memory-reader", show_default=True,
              help="the downstream reader's consumer group")
@click.option("--tenant", "tenants", multiple=True,
              help="a tenant with a chat service (repeat; default MEMSTREAM_TENANTS)")
@click.option("--bootstrap", default=None, help="kafka-acls: --bootstrap-server (default: "
              "MEMSTREAM_BOOTSTRAP_SERVERS)")
@click.option("--command-config", default="admin.properties", show_default=True,
              help="kafka-acls: the admin client's properties (a super user's login)")
@click.option("--strimzi-cluster", default="my-cluster", show_default=True)
@click.option("--strimzi-authentication", default="scram-sha-512", show_default=True,
              type=click.Choice(["scram-sha-512", "tls", "tls-external"]))
@click.option("--strimzi-api-version", type=click.Choice(["v1", "v1beta2"]), default="v1",
              show_default=True, help="kafka.strimzi.io/v1 (Strimzi 0.49 on) or v1beta2 "
                                      "(before 1.0)")
@click.option("--apply", "apply_them", is_flag=True,
              help="create them on the cluster instead (the Kafka login of these settings "
                   "must be a super user's)")
@click.pass_obj
def acls(settings: Settings, fmt: str, worker_principal: str, chat_principal: str,
         reader_principal: str, reader_group: str, tenants: tuple[str, ...],
         bootstrap: str | None, command_config: str, strimzi_cluster: str,
         strimzi_authentication: str, strimzi_api_version: str, apply_them: bool) -> None:
    """Print the Kafka ACLs of every principal: the worker, a chat service per tenant (its
    tenant's input topics only, with MEMSTREAM_INPUT_TOPICS=per-tenant), a downstream
    reader (docs/tenancy.md)."""
    from memstream.ops import acls as acl_ops
    from memstream.topics.registry import tenancy_problems

    problems = tenancy_problems(settings)
    if problems:
        raise click.ClickException("; ".join(problems))
    names = acl_ops.Names(worker_principal, chat_principal, reader_principal, reader_group)
    found = acl_ops.principals(settings, names, tenants or None)
    if apply_them:
        n = asyncio.run(acl_ops.apply(settings, found))
        click.echo(f"{n} ACL bindings created for {len(found)} principals")
    elif fmt == "strimzi":
        try:
            users = acl_ops.strimzi_users(found, strimzi_cluster, strimzi_authentication,
                                          f"kafka.strimzi.io/{strimzi_api_version}")
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(users, nl=False)
    else:
        click.echo(acl_ops.kafka_acls_commands(found, bootstrap or settings.bootstrap_servers,
                                               command_config), nl=False)


@main.group()
def keys() -> None:
    """Per-tenant API keys of the HTTP API (stored hashed on a compacted topic); tenant
    read keys of sealed events (create --read-events) and master key rotation.

    API key records are signed with MEMSTREAM_ADMIN_KEY: create and revoke need it, and it
    must be the one the workers have (they ignore records that do not verify). Read keys
    and rotate-master need MEMSTREAM_MASTER_KEY instead.
    """


def _key_errors(exc: Exception) -> click.ClickException:
    """A readable message for a bad tenant/label or a broker failure (no traceback)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return click.UsageError("; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)))
    return click.ClickException(str(exc))


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant the key opens (only that one)")
@click.option("--label", default="", help="A note for operators (who holds the key)")
@click.option("--read-events", is_flag=True,
              help="Instead: a read key for downstream readers (MEMSTREAM_READ_KEYS): opens "
                   "the tenant's sealed memory events; needs MEMSTREAM_MASTER_KEY")
@click.pass_obj
def keys_create(settings: Settings, tenant: str, label: str, read_events: bool) -> None:
    """Mint a key for one tenant and print it, once."""
    from pydantic import ValidationError

    from memstream.core.errors import MemstreamError
    from memstream.web.keys_topic import create_key

    if read_events:
        from memstream.ops.keys_rotate import read_key

        try:
            key, kek_ids = asyncio.run(read_key(settings, tenant))
        except MemstreamError as exc:
            raise _key_errors(exc) from exc
        click.echo(f"tenant:   {tenant}")
        click.echo(f"kek ids:  {', '.join(kek_ids)}")
        click.echo(f"read key: {key}")
        click.echo("It opens every sealed event of this tenant (and survives a rotation of "
                   "the master key): give it to the tenant's readers as MEMSTREAM_READ_KEYS.")
        return
    try:
        plaintext, record = asyncio.run(create_key(settings, tenant, label))
    except (ValidationError, MemstreamError) as exc:
        raise _key_errors(exc) from exc
    click.echo(f"key id: {record.key_id}")
    click.echo(f"tenant: {record.tenant_id}")
    click.echo(f"key:    {plaintext}")
    click.echo("Only its SHA-256 is stored: the key cannot be shown again. Keep it now.")


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys")
@click.pass_obj
def keys_list(settings: Settings, tenant: str | None) -> None:
    """Key id, tenant, label, created and revoked time of every key (never a hash).

    SIGNED: "ok" when the record verifies with MEMSTREAM_ADMIN_KEY; "NO" when it does not
    (forged, unsigned or signed with another admin key: no worker with this admin key takes
    it); "?" without an admin key to check with.
    """
    from memstream.core.errors import MemstreamError
    from memstream.web.keys import verify
    from memstream.web.keys_topic import list_keys

    admin = settings.admin_key.get_secret_value() if settings.admin_key is not None else ""
    try:
        records = asyncio.run(list_keys(settings))
    except MemstreamError as exc:
        raise _key_errors(exc) from exc
    click.echo(f"{'KEY ID':16}  {'TENANT':24}  {'CREATED':25}  {'REVOKED':25}  {'SIGNED':6}  "
               "LABEL")
    for r in records:
        if tenant is None or r.tenant_id == tenant:
            revoked = r.revoked_at.isoformat(timespec="seconds") if r.revoked_at else "-"
            signed = "?" if not admin else "ok" if verify(r, admin) else "NO"
            click.echo(f"{r.key_id:16}  {r.tenant_id:24}  "
                       f"{r.created_at.isoformat(timespec='seconds'):25}  {revoked:25}  "
                       f"{signed:6}  {r.label}")


@keys.command("revoke")
@click.argument("key_id")
@click.option("--delete", is_flag=True, help="Also write the key's signed tombstone: "
              "compaction then removes its records, the revocation's audit record too")
@click.pass_obj
def keys_revoke(settings: Settings, key_id: str, delete: bool) -> None:
    """Revoke a key (its record stays on the topic, with the time of revocation)."""
    from memstream.core.errors import MemstreamError
    from memstream.web.keys_topic import delete_key, revoke_key

    try:
        record = asyncio.run(revoke_key(settings, key_id))
        if delete:
            asyncio.run(delete_key(settings, key_id))
    except MemstreamError as exc:
        raise _key_errors(exc) from exc
    assert record.revoked_at is not None
    click.echo(f"revoked {record.key_id} (tenant {record.tenant_id}) at "
               f"{record.revoked_at.isoformat(timespec='seconds')}"
               + ("; deleted (signed tombstone)" if delete else ""))


@keys.command("rotate-master")
@click.pass_obj
def keys_rotate_master(settings: Settings) -> None:
    """Rewrap every tenant key under MEMSTREAM_MASTER_KEY_VERSION, while workers run.

    Give the new master as MEMSTREAM_MASTER_KEY (+ _VERSION) and the old one in
    MEMSTREAM_MASTER_KEY_PREVIOUS ("<version>:<key>"), as the workers have them; legacy
    data keys are wrapped under their tenant's key.
    Afterwards, with nothing failed, drop the old version from every process.
    """
    from memstream.core.errors import MemstreamError
    from memstream.ops.keys_rotate import rotate_master

    try:
        report = asyncio.run(rotate_master(settings))
    except MemstreamError as exc:
        raise _key_errors(exc) from exc
    click.echo(f"master version {report.version}: {report.keks} tenant key(s) rewrapped, "
               f"{report.new_keks} made, {report.data_keys} legacy data key(s) rewrapped, "
               f"{report.markers} forget marker(s) signed again")
    if report.rejected.get("unsigned"):
        click.echo(f"{report.rejected['unsigned']} forget marker(s) not taken (unsigned, or "
                   "signed with the tenant key only: see MEMSTREAM_FORGET_MARKERS_LEGACY)")
    other = {k: n for k, n in report.rejected.items() if k not in ("undecryptable",
                                                                     "unsigned")}
    if other:
        click.echo(f"ignored malformed records: {other}")
    if not report.complete:
        raise click.ClickException(
            f"{report.unopened} record(s) did not open with these settings and were not "
            "rewrapped: add their master version to MEMSTREAM_MASTER_KEY_PREVIOUS and run "
            "again before dropping any old version")


@main.command()
@click.option("--loglevel", default="info")
@click.option("--processes", default=None, metavar="N|auto",
              help="Member processes under one supervisor (default: MEMSTREAM_PROCESSES, "
              "1; auto: one per CPU); see docs/processes.md")
@click.pass_obj
def worker(settings: Settings, loglevel: str, processes: str | None) -> None:
    """Run the stream-processing worker (ingest, extract/apply, jobs, API per settings)."""
    from memstream.ops.processes import Refusal, cpu_count, resolve

    try:
        n = resolve(processes if processes is not None else settings.processes, cpu_count())
    except Refusal as exc:
        click.echo(f"memstream worker refuses to start: {exc}", err=True)
        sys.exit(EXIT_LAYOUT)
    if n == 1:
        _run_worker(settings, loglevel)
        return
    from memstream.ops.supervisor import supervise

    try:
        code = supervise(settings, n, loglevel)
    except Refusal as exc:
        click.echo(f"memstream worker refuses to start: {exc}", err=True)
        sys.exit(EXIT_LAYOUT)
    sys.exit(code)


@main.group()
def jobs() -> None:
    """The windowed jobs (reflection, consolidation, decay)."""


@jobs.command("run")
@click.argument("which", nargs=-1, type=click.Choice(["reflect", "consolidate", "decay"]))
@click.option("--loglevel", default="info")
@click.pass_obj
def jobs_run(settings: Settings, which: tuple[str, ...], loglevel: str) -> None:
    """Run the jobs' triggers as their own process (all three by default).

    Triggers read only topics and send commands; the work itself runs in the worker that
    owns the store. Start the main workers with MEMSTREAM_JOBS_ENABLED=false then. The
    commands are signed: the workers' MEMSTREAM_CLUSTER_SECRET is required.
    """
    if settings.cluster_secret is None:  # its own data dir's secret: the workers refuse it
        raise click.ClickException(
            "memstream jobs run sends commands the workers verify: set "
            "MEMSTREAM_CLUSTER_SECRET to the workers' (a single worker without one keeps "
            f"its own in {settings.data_dir / 'record-secret'})")
    _run_worker(jobs_only(settings, which), loglevel)


def jobs_only(settings: Settings, which: tuple[str, ...] = ()) -> Settings:
    """The settings of a process that runs only the windowed jobs' triggers: its own
    consumer group and state, no ingest, no extract/apply, no API."""
    return settings.model_copy(update={
        "app_id": f"{settings.app_id}-jobs", "data_dir": settings.data_dir / "jobs",
        "ingest_enabled": False, "extract_enabled": False, "web_enabled": False,
        "jobs_enabled": True, "jobs": which or ("reflect", "consolidate", "decay")})


def _run_worker(settings: Settings, loglevel: str) -> None:
    import time

    from memstream.core.retry import RetryPolicy, retry_async
    from memstream.streams.faust_setup import Worker
    from memstream.streams.store_layout import data_dir_conflict
    from memstream.topics.layout import LayoutError, prepare
    from memstream.web import probes
    from memstream.worker import build_worker

    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    # /v1/live and a 503 /v1/health from now until the HTTP API serves (web_enabled).
    probes.start_early(settings)
    # A broker that is restarting is waited for (broker_wait_s), not a reason to exit at once;
    # topics that do not fit are a refusal (one line each), never a fallback.
    try:
        layout = asyncio.run(retry_async(
            lambda: prepare(settings), policy=RetryPolicy(first_delay_s=1.0, max_delay_s=10.0),
            deadline=time.time() + settings.broker_wait_s, clock=time.time))
    except LayoutError as exc:
        for line in exc.lines:
            click.echo(f"memstream worker refuses to start: {line}", err=True)
        sys.exit(EXIT_LAYOUT)
    click.echo(f"topics: {layout.partitions} partitions, {layout.replication.describe()}"
               f"{'; created ' + str(len(layout.created)) if layout.created else ''}", err=True)
    settings = layout.applied(settings)
    probes.waiting_for("worker")
    conflict = data_dir_conflict(settings)
    if conflict is not None:
        click.echo(f"memstream worker refuses to start: {conflict}", err=True)
        sys.exit(EXIT_LAYOUT)
    from memstream.core import tracing

    try:
        tracing.configure(settings)  # off unless MEMSTREAM_TRACING (docs/tracing.md)
    except ConfigError as exc:  # otlp without the exporter installed
        click.echo(f"memstream worker refuses to start: {exc}", err=True)
        sys.exit(EXIT_LAYOUT)
    pipeline = build_worker(settings)
    if settings.extract_enabled:
        # Load the embedder model now, not on the first job: it takes seconds, which the
        # extract and apply loops' first batches after every start would wait for.
        pipeline.services.embedder.embed(["warm-up"])
    Worker(pipeline.app, loglevel=loglevel, quiet=True, log_throttle_s=settings.log_throttle_s,
           log_format=settings.log_format).execute_from_commandline()


@main.command()
@click.option("--tenant", required=True)
@click.option("--user", required=True)
@click.option("-k", "k", default=None, type=int, help="How many memories (default: settings)")
@click.argument("query")
@click.pass_obj
def search(settings: Settings, tenant: str, user: str, k: int | None, query: str) -> None:
    """Top-k live memories of one user (plus global ones) for QUERY, with scores.

    Asks the running worker's HTTP view when MEMSTREAM_ADMIN_KEY is set and it answers;
    otherwise opens the store directly (the worker must not be running on it then).
    """
    import json

    from memstream.ops.search import search_http, search_local

    k = k or settings.retrieval_k
    result = search_http(settings, tenant, user, query, k)
    if result is None:
        result = search_local(settings, tenant, user, query, k)
    click.echo(json.dumps(result, ensure_ascii=False, indent=2))


@main.command()
@click.option("--url", "urls", multiple=True, help="A worker's API (default: this one's); "
              "the workers it names are asked too")
@click.option("--json", "as_json", is_flag=True, help="The workers' answers as JSON")
@click.pass_obj
def status(settings: Settings, urls: tuple[str, ...], as_json: bool) -> None:
    """Workers, partitions (owner, standbys), shards (serving, restoring, standby), lag."""
    import json

    from memstream.ops.status import gather, render

    found = gather(settings, urls or (settings.api_url(),))
    click.echo(json.dumps(found, indent=2) if as_json else render(found))
    if all("error" in s for s in found.values()):
        raise SystemExit(1)


@main.command()
@click.option("--reference", default=None, help="The dead letter's reason (it names topic, "
              "partition and offsets); or the four options below")
@click.option("--topic", default=None)
@click.option("--partition", default=None, type=int)
@click.option("--first", default=None, type=int, help="First offset of the range")
@click.option("--last", default=None, type=int, help="Last offset of the range (included)")
@click.option("--dry-run", is_flag=True, help="Read the range, produce nothing")
@click.pass_obj
def redrive(settings: Settings, reference: str | None, topic: str | None,
            partition: int | None, first: int | None, last: int | None,
            dry_run: bool) -> None:
    """Produce again a record batch set aside as undecodable (docs/operations.md)."""
    from memstream.ops.redrive import redrive as run
    from memstream.topics.batch_refs import Reference, parse_reference

    ref = parse_reference(reference) if reference else None
    if ref is None:
        if topic is None or partition is None or first is None or last is None:
            raise click.UsageError("give --reference, or --topic, --partition, --first, --last")
        ref = Reference(topic, partition, first, last)
    done = asyncio.run(run(settings, ref, dry_run=dry_run))
    click.echo(f"{ref.topic}[{ref.partition}] {ref.first}..{ref.last}: read {done.read}, "
               f"produced {done.produced}")


@main.group()
def forget() -> None:
    """Forget-me (right to erasure): verify that a forgotten user left nothing behind."""


@forget.command("verify")
@click.option("--tenant", required=True)
@click.option("--user", required=True)
@click.option("--needle", "needles", multiple=True,
              help="Plaintext to look for (a canary the user said); repeatable")
@click.pass_obj
def forget_verify(settings: Settings, tenant: str, user: str, needles: tuple[str, ...]) -> None:
    """Scan the store and every topic memstream owns for the user's content; exit 1 if any
    residue is left (see README: the erasure bound)."""
    from memstream.ops.forget_verify import verify

    found = verify(settings, tenant, user, list(needles))
    for what, n in found.rows():
        click.echo(f"{what:<58} {n}")
    click.echo(f"residues: {found.total}")
    if found.total or found.store_records is None:
        raise SystemExit(1)


@main.command()
@click.option("--keep-broker/--stop-broker", default=False,
              help="Leave a broker that the demo started running afterwards.")
@click.option("--serve", is_flag=True,
              help="Keep the worker (API, /metrics, inspector) running until Ctrl-C.")
@click.option("--workers", default=1, type=click.IntRange(1, 4),
              help="Workers sharing the partitions (more than one: a store shard per "
                   "partition, any worker answers)")
@click.pass_obj
def demo(settings: Settings, keep_broker: bool, serve: bool, workers: int) -> None:
    """Broker + worker + the bundled sample conversations: print the memories built."""
    from memstream.dev.demo import run_demo

    logging.basicConfig(level=logging.WARNING)
    run_demo(settings, keep_broker=keep_broker, serve=serve, workers=workers)


@main.command("mcp")
@click.option("--url", "urls", envvar="MEMSTREAM_URL", multiple=True, required=True,
              help="A worker's HTTP API (repeat, or separate by spaces / commas in "
                   "MEMSTREAM_URL, for several: any answers)")
@click.option("--api-key", envvar="MEMSTREAM_API_KEY", required=True,
              help="A tenant key (memstream keys create); its tenant is the one served. "
                   "Prefer the environment: a command line is visible to other users")
@click.option("--tenant", envvar="MEMSTREAM_TENANT", default=None,
              help="The admin key only: the tenant of calls that name none")
@click.option("--kafka", is_flag=True, help="Write turns to Kafka (the MEMSTREAM_BOOTSTRAP_"
              "SERVERS, _TOPIC_PREFIX, SASL / TLS settings) instead of the workers' HTTP "
              "way in")
@click.pass_obj
def mcp(settings: Settings, urls: tuple[str, ...], api_key: str, tenant: str | None,
        kafka: bool) -> None:
    """The MCP server on stdio, for a desktop agent (docs/mcp.md): stdout is the protocol,
    logs go to stderr."""
    from memstream.ops.mcp_stdio import serve

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    found = [u for raw in urls for u in raw.replace(",", " ").split()]
    asyncio.run(serve(found, api_key, tenant, settings if kafka else None))


main.add_command(replay)
main.add_command(rebuild)
main.add_command(changes)
main.add_command(schemas)


if __name__ == "__main__":
    main()
