"""docker-compose.yml and the Dockerfile stay consistent with the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _kafka_nodes(services: dict) -> dict[str, dict]:
    return {name: svc for name, svc in services.items()
            if str(svc.get("image", "")).startswith("apache/kafka:")}


def _workers(services: dict) -> dict[str, dict]:
    """The services that run the image built from this repository."""
    (image,) = {svc["image"] for svc in services.values() if svc.get("build") == "."}
    return {name: svc for name, svc in services.items() if svc.get("image") == image}


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in value.split(","):
        name, address = item.split("://")
        host, port = address.rsplit(":", 1)
        out[name] = (host, int(port))
    return out


def _published(svc: dict) -> dict[int, tuple[str, int]]:
    """The service's ports: container port -> (host address, host port)."""
    out = {}
    for spec in svc.get("ports", []):
        *host_ip, host_port, container = str(spec).split(":")
        out[int(container)] = (host_ip[0] if host_ip else "0.0.0.0", int(host_port))
    return out


def _seconds(duration: str) -> float:
    """A compose duration (``2m``, ``1m30s``, ``90s``) in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and any(parts.groups()), duration
    h, m, s = (int(g or 0) for g in parts.groups())
    return 3600 * h + 60 * m + s


def test_compose_has_kafka_and_workers_and_builds_the_image_once():
    services = _compose()["services"]
    assert {"worker", "worker-2"} <= set(services)
    # no service left unused: the workers keep the embedded store (docs/operations.md says
    # how to point them at a Qdrant server instead)
    assert not any("qdrant" in name or "qdrant" in str(svc.get("image", ""))
                   for name, svc in services.items())
    assert [name for name, svc in services.items() if "build" in svc] == ["worker"]
    assert len(_kafka_nodes(services)) == 3
    for node in _kafka_nodes(services).values():
        roles = node["environment"]["KAFKA_PROCESS_ROLES"]
        assert "broker" in roles and "controller" in roles
    assert set(_workers(services)) == {"worker", "worker-2"}


def test_the_kafka_nodes_form_one_consistent_cluster():
    """Node ids, quorum voters, advertised listeners, the published EXTERNAL ports and the
    workers' bootstrap servers all name the same three nodes."""
    services = _compose()["services"]
    nodes = _kafka_nodes(services)
    envs = {name: node["environment"] for name, node in nodes.items()}
    ids = {name: int(env["KAFKA_NODE_ID"]) for name, env in envs.items()}
    assert len(set(ids.values())) == len(nodes)
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    bootstrap = []
    for name, env in envs.items():
        assert nodes[name]["hostname"] == name
        listeners = _listeners(env["KAFKA_LISTENERS"])
        advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
        voters = {f"{ids[n]}@{n}:{listeners[controller][1]}" for n in nodes}
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == voters
        inter = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
        assert advertised[inter] == (name, listeners[inter][1])
        bootstrap.append(f"{name}:{listeners[inter][1]}")
        # producers on the host: the advertised EXTERNAL address is the published port
        ext_host, ext_port = advertised["EXTERNAL"]
        assert ext_host == "localhost" and listeners["EXTERNAL"][1] == ext_port
        assert _published(nodes[name])[ext_port] == ("127.0.0.1", ext_port)
        protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
                         .split(","))
        assert set(listeners) == set(protocols) and controller not in advertised
    for worker in _workers(services).values():
        assert worker["environment"]["MEMSTREAM_BOOTSTRAP_SERVERS"].split(",") == bootstrap


def test_kafka_replicates_its_internal_topics_across_the_nodes():
    nodes = _kafka_nodes(_compose()["services"])
    for env in (node["environment"] for node in nodes.values()):
        for rf, isr in (("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_MIN_INSYNC_REPLICAS"),
                        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                         "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"),
                        ("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
                         "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR")):
            # a write acknowledged by min ISR replicas survives the loss of one broker
            assert int(env[rf]) == len(nodes) == 3, rf
            assert int(env[isr]) == int(env[rf]) - 1, isr
        assert int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]) == len(nodes)
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_kafka_keeps_its_log_dirs_in_a_named_volume():
    compose = _compose()
    for name, node in _kafka_nodes(compose["services"]).items():
        mounts = dict(v.split(":")[:2] for v in node["volumes"])
        log_dirs = node["environment"]["KAFKA_LOG_DIRS"]
        assert log_dirs in mounts.values(), name
        source = next(s for s, target in mounts.items() if target == log_dirs)
        assert source in compose["volumes"], name
        # the apache/kafka image creates this dir for its user (appuser) and declares it a
        # volume: an empty named volume mounted there takes that owner
        assert log_dirs == "/var/lib/kafka/data"


def test_compose_runs_two_workers_each_with_its_own_id_url_port_and_volume():
    services = _compose()["services"]
    one, two = services["worker"], services["worker-2"]
    assert "build" not in two and two["image"] == one["image"]
    assert two["depends_on"] == one["depends_on"]
    for key in ("MEMSTREAM_GROUP_INSTANCE_ID", "MEMSTREAM_ADVERTISED_URL"):
        assert one["environment"][key] != two["environment"][key]
    for name, worker in (("worker", one), ("worker-2", two)):
        env = worker["environment"]
        # the URL the other worker forwards to: this service's name, its container port
        (port,) = _published(worker)
        assert env["MEMSTREAM_ADVERTISED_URL"] == f"http://{name}:{port}"
        assert env["MEMSTREAM_STORE_PARTITIONED"] == "true"
        assert env["MEMSTREAM_PARTITIONS"] == "12"
        assert env["MEMSTREAM_WEB_ENABLED"] == "true" and env["MEMSTREAM_WEB_HOST"] == "0.0.0.0"
    assert one["ports"] != two["ports"] and one["volumes"] != two["volumes"]


def _worker_env(env: dict[str, str], **overrides: str) -> dict[str, str]:
    """A worker's compose environment with the ``${VAR:?...}`` secrets filled in."""
    filled = {k: ("x" * 32 if str(v).startswith("${") else str(v)) for k, v in env.items()}
    return {**filled, **overrides}


def test_every_memstream_variable_in_compose_is_a_setting_and_parses(monkeypatch, tmp_path):
    from memstream.core.settings import Settings

    fields = {f"MEMSTREAM_{name.upper()}" for name in Settings.model_fields}
    for name, worker in _workers(_compose()["services"]).items():
        env = worker["environment"]
        names = {k for k in env if k.startswith("MEMSTREAM_")}
        assert names and names <= fields, (name, sorted(names - fields))
        for key, value in _worker_env(env).items():
            monkeypatch.setenv(key, value)
        settings = Settings()
        assert settings.partitions == 12 and settings.web_enabled and settings.store_partitioned
        assert str(settings.data_dir) == env["MEMSTREAM_DATA_DIR"]


def test_every_named_volume_is_declared_and_each_stateful_service_has_its_own():
    compose = _compose()
    declared = set(compose["volumes"])
    used: dict[str, list[str]] = {}
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith(("./", "/")):
                used.setdefault(source, []).append(name)
    assert set(used) <= declared, set(used) - declared
    assert declared <= set(used), declared - set(used)  # none left over
    assert all(len(owners) == 1 for owners in used.values()), used  # never shared
    stateful = [*_kafka_nodes(compose["services"]), *_workers(compose["services"]),
                "prometheus", "grafana"]
    owners = {owner for names in used.values() for owner in names}
    assert set(stateful) <= owners, set(stateful) - owners


def test_host_ports_are_published_on_loopback_only():
    """Kafka has no login in compose: nothing is reachable from other machines."""
    for name, svc in _compose()["services"].items():
        for host_ip, _ in _published(svc).values():
            assert host_ip == "127.0.0.1", name


def test_the_admin_and_metrics_keys_and_the_cluster_secret_are_required():
    """``${VAR:?message}``: compose refuses to start without them, saying what to set (an
    empty key would refuse every request and Prometheus would get 401; two workers without
    a cluster secret would each end itself, exit 78)."""
    for worker in _workers(_compose()["services"]).values():
        env = worker["environment"]
        for key in ("MEMSTREAM_ADMIN_KEY", "MEMSTREAM_METRICS_KEY", "MEMSTREAM_CLUSTER_SECRET"):
            assert re.fullmatch(r"\$\{" + key + r":\?[^}]*\S[^}]*\}", env[key]), env[key]


def test_the_stop_grace_period_covers_the_workers_graceful_shutdown(monkeypatch, tmp_path):
    """SIGTERM: the stage loops stop one after the other (a shutdown signal awaits its
    receivers in turn), each waiting up to STOP_WAIT_S for its batch and as long for a
    partition take in progress; then the shards are closed with a checkpoint, reading the
    topics' ends for up to CLOSE_ENDS_S. Docker's SIGKILL must not come first."""
    from memstream.core.settings import Settings
    from memstream.streams.owned_loop import STOP_WAIT_S
    from memstream.streams.shards import CLOSE_ENDS_S
    from memstream.worker import build_worker

    for name, worker in _workers(_compose()["services"]).items():
        env = _worker_env(worker["environment"], MEMSTREAM_DATA_DIR=str(tmp_path / name),
                          MEMSTREAM_EMBEDDER="hashing")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        loops = len(build_worker(Settings()).loops)
        assert loops >= 4  # ingest, extract, apply, access
        bound = loops * 2 * STOP_WAIT_S + CLOSE_ENDS_S
        assert _seconds(worker["stop_grace_period"]) >= bound + 10, (name, bound)
        assert worker["init"] is True  # SIGTERM reaches a worker that is still starting


def test_the_worker_healthcheck_asks_health_without_curl(tmp_path):
    """The healthcheck's own command, run against a server that answers 200 then 503: it
    passes on the first and fails on the second (and when nothing listens)."""
    import http.server
    import sys
    import threading

    from memstream.contract.http_api.paths import HEALTH
    from memstream.core.settings import Settings
    from memstream.web.serve import KEYS_READY_S

    statuses: list[int] = []
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(statuses.pop(0))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name, worker in _workers(_compose()["services"]).items():
            check = worker["healthcheck"]
            kind, *command = check["test"]
            assert kind == "CMD" and command[0] == "python" and "curl" not in str(command)
            (port,) = _published(worker)
            url = f"http://127.0.0.1:{port}{HEALTH}"
            assert url in command[-1], command
            local = [sys.executable, *[c.replace(f"127.0.0.1:{port}",
                                                 f"127.0.0.1:{server.server_port}")
                                       for c in command[1:]]]
            for status, passes in ((200, True), (503, False)):
                statuses.append(status)
                run = subprocess.run(local, capture_output=True, timeout=30)
                assert (run.returncode == 0) == passes, (name, status, run.stderr)
            assert asked[-1] == HEALTH
            # the worker waits for the brokers and for its keys before it serves at all
            assert _seconds(check["start_period"]) >= Settings().broker_wait_s + KEYS_READY_S
    finally:
        server.shutdown()
    dead = subprocess.run([*local[:-1], local[-1].replace(str(server.server_port), "9")],
                          capture_output=True, timeout=30)
    assert dead.returncode != 0


# --- the image (Dockerfile) --------------------------------------------------------------


def _dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return [ln.strip() for ln in "\n".join(lines).replace("\\\n", " ").splitlines()
            if ln.strip()]


def _instruction(lines: list[str], word: str) -> list[tuple[int, str]]:
    return [(i, ln.split(None, 1)[1]) for i, ln in enumerate(lines)
            if ln.split(None, 1)[0].upper() == word]


def _image_user(lines: list[str]) -> tuple[int, int]:
    ((_, user),) = _instruction(lines, "USER")
    uid, gid = (int(x) for x in user.split(":"))  # numeric: runAsNonRoot can check it
    return uid, gid


def test_the_image_runs_as_a_dedicated_non_root_user():
    lines = _dockerfile()
    uid, gid = _image_user(lines)
    assert uid >= 1000 and gid >= 1000 and uid != 65534  # not root, not a system id, not nobody
    runs = " ".join(run for _, run in _instruction(lines, "RUN"))
    assert re.search(rf"groupadd\b[^&;]*--gid {gid}\b", runs), runs
    assert re.search(rf"useradd\b[^&;]*--uid {uid}\b[^&;]*--gid {gid}\b", runs), runs


def test_the_image_data_dir_is_its_users_and_a_volume():
    """Docker copies the owner of an image directory into an empty named volume mounted on
    it: the data dir must exist in the image, belong to the worker's user, and be declared
    a volume after that (later changes to a volume path are discarded)."""
    lines = _dockerfile()
    uid, gid = _image_user(lines)
    ((_, env),) = [(i, e) for i, e in _instruction(lines, "ENV")
                   if e.startswith("MEMSTREAM_DATA_DIR")]
    data_dir = env.split("=", 1)[1].split()[0]
    chowned = [i for i, run in _instruction(lines, "RUN")
               if f"mkdir -p {data_dir}" in run and f"chown {uid}:{gid} {data_dir}" in run]
    ((volume_at, volume),) = _instruction(lines, "VOLUME")
    assert json.loads(volume) == [data_dir]
    ((user_at, _),) = _instruction(lines, "USER")
    assert chowned and chowned[0] < volume_at and chowned[0] < user_at
    for worker in _workers(_compose()["services"]).values():
        assert worker["environment"]["MEMSTREAM_DATA_DIR"] == data_dir
        assert [v.split(":")[1] for v in worker["volumes"]] == [data_dir]


def test_dockerfile_copies_existing_packages():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    sources = [ln.split()[1] for ln in lines if ln.startswith("COPY")]
    for src in sources:
        for part in src.split():
            assert (ROOT / part).exists(), part


def test_docker_compose_config_is_valid(tmp_path):
    """What `docker compose config -q` checks (no compose client here): the compose-spec
    loader in scripts/compose_check (interpolation, anchors, the JSON schema, its rules).
    A broken copy is refused, so the check can fail."""
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists() \
            and not list(Path.home().glob(".cache/memstream/bin/compose_check-*")):
        pytest.fail("no Go toolchain to build scripts/compose_check (scripts/bootstrap.sh)")
    check = [str(ROOT / "scripts" / "check_compose.sh")]
    good = subprocess.run(check, capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stderr
    text = (ROOT / "docker-compose.yml").read_text()
    for broken in (text.replace("stop_grace_period: 2m", "stop_grace_perod: 2m"),
                   text.replace('"127.0.0.1:6066:6066"', "{port: 6066}"),
                   text.replace("  worker-2:\n    <<: *worker", "  worker-2:\n    <<: *workr")):
        assert broken != text
        (tmp_path / "docker-compose.yml").write_text(broken)
        bad = subprocess.run([*check, str(tmp_path / "docker-compose.yml")],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and "invalid compose file" in bad.stderr, bad.stderr


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (1, 1), (70, 70), (75, 75), (78, 0)])
def test_the_compose_entrypoint_stops_on_a_config_error_only(code, expected):
    """Docker's `restart: on-failure` restarts every non-zero exit: the workers'
    entrypoint turns 78 (EX_CONFIG, a restart cannot mend it) into 0 and passes every other
    code on, so 70 and 75 are restarted."""
    compose = _compose()["services"]
    for worker in _workers(compose).values():
        assert worker["restart"] == "on-failure"
        assert worker["entrypoint"] == ["stop-on-config-error", "memstream"]
    script = ROOT / "deploy" / "docker" / "stop-on-config-error.sh"
    copied = [ln.split()[1:] for ln in _dockerfile() if ln.startswith("COPY ")]
    assert [str(script.relative_to(ROOT)), "/usr/local/bin/stop-on-config-error"] in copied
    run = subprocess.run(["sh", str(script), "sh", "-c", f"exit {code}"], capture_output=True,
                         text=True, timeout=30)
    assert run.returncode == expected, run.stderr
    assert ("not restarted" in run.stderr) == (code == 78)


def test_the_compose_entrypoint_hands_sigterm_on_and_keeps_the_exit_code(tmp_path):
    """`docker stop`: SIGTERM reaches the worker, and the wrapper ends with its code."""
    import signal
    import time

    script = ROOT / "deploy" / "docker" / "stop-on-config-error.sh"
    ready = tmp_path / "ready"
    child = f"trap 'exit 70' TERM; touch {ready}; while :; do sleep 0.05; done"
    proc = subprocess.Popen(["sh", str(script), "sh", "-c", child], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not ready.exists():  # a barrier: the child has installed its handler
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 70


# --- metrics: Prometheus, alerts, Grafana (deploy/) --------------------------------------
DEPLOY = ROOT / "deploy"
_METRIC = re.compile(r"\bmemstream_[a-z_]+\b")


def exposed_samples() -> set[str]:
    """Every sample name the worker's /metrics can expose (all families populated)."""
    from memstream.streams.counters import Counters
    from memstream.web.prometheus import PipelineCollector, StoreSize

    c = Counters()
    c.changes[("add", "extraction")] = 1
    c.jobs_by_trigger["threshold"] = 1
    c.dead_letters_by_class["schema"] = 1
    c.batches_set_aside[("t", "UnsupportedCodecError")] = 1
    c.fetch_failures[("ingest", "KafkaError")] = 1
    store = StoreSize(lambda: 1, 30.0)
    store.value = 1
    names: set[str] = set()
    for family in PipelineCollector(c, lambda: {("t", 0): 1}, store).collect():
        suffixes = {"counter": ["_total"], "gauge": [""],
                    "histogram": ["_bucket", "_sum", "_count"]}[family.type]
        names |= {family.name + s for s in suffixes}
    return names


def _dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "memstream-dashboard.json").read_text())


def _alert_rules() -> list[dict]:
    groups = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]
    return [rule for g in groups for rule in g["rules"]]


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_compose_runs_prometheus_and_grafana_on_the_deploy_files():
    compose = _compose()
    services = compose["services"]
    assert {"prometheus", "grafana"} <= set(services)
    assert services["worker"]["environment"]["MEMSTREAM_METRICS_KEY"].startswith(
        "${MEMSTREAM_METRICS_KEY")
    assert compose["secrets"]["memstream_metrics_key"] == {"environment": "MEMSTREAM_METRICS_KEY"}
    assert services["prometheus"]["secrets"] == ["memstream_metrics_key"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
            else:
                assert source in compose["volumes"], source


def test_prometheus_scrapes_the_worker_with_the_metrics_key_file():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    services = _compose()["services"]
    workers = sorted(_workers(services))
    assert workers == ["worker", "worker-2"]
    targets = [f"{name}:{services[name]['ports'][0].split(':')[-1]}" for name in workers]
    assert job["static_configs"][0]["targets"] == targets
    assert job["authorization"]["credentials_file"] == "/run/secrets/memstream_metrics_key"
    mounted = {v.split(":")[1] for v in _compose()["services"]["prometheus"]["volumes"]}
    assert set(config["rule_files"]) <= mounted


def test_every_alert_and_panel_queries_metrics_the_worker_exposes():
    exposed = exposed_samples()
    exprs = [rule["expr"] for rule in _alert_rules()]
    exprs += [t["expr"] for panel in _dashboard()["panels"] for t in panel["targets"]]
    assert exprs
    for expr in exprs:
        assert _balanced(expr), expr
        assert set(_METRIC.findall(expr)) <= exposed, expr


def test_the_alerts_cover_the_spec_and_the_dashboard_every_metric():
    names = {rule["alert"] for rule in _alert_rules()}
    assert all(rule.get("labels", {}).get("severity") for rule in _alert_rules())
    for topic in ("WriteVolume", "HitRate", "ConflictRate", "UserDeletionRate",
                  "ConsolidationRate", "RetrievalLatency", "ConsumerLag", "DeadLetters",
                  "ExtractionLag"):
        assert any(topic in n for n in names), topic
    queried = {name.removesuffix("_bucket") for panel in _dashboard()["panels"]
               for t in panel["targets"] for name in _METRIC.findall(t["expr"])}
    wanted = {"memstream_memory_changes_total", "memstream_retrievals_with_results_total",
              "memstream_conflicts_total", "memstream_user_deletions_total",
              "memstream_consolidation_merges_total", "memstream_retrieval_latency_seconds",
              "memstream_llm_calls_total", "memstream_llm_tokens_total",
              "memstream_messages_total", "memstream_jobs_total",
              "memstream_trivial_jobs_total", "memstream_extraction_lag_seconds",
              "memstream_consumer_lag", "memstream_dead_letters_total",
              "memstream_store_records"}
    assert wanted <= queried, wanted - queried


def test_grafana_provisions_the_datasource_the_dashboard_names():
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
        assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/memstream.yml")
                               .read_text())["providers"]
    mounted = {v.split(":")[1] for v in _compose()["services"]["grafana"]["volumes"]}
    assert any(m.startswith(providers[0]["options"]["path"] + "/") for m in mounted)
