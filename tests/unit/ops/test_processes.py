"""``memstream worker --processes N``: the children's plan and the restart policy, as plain
data (ops/processes.py); no process is started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.settings import Settings
from memstream.ops import processes as procs
from memstream.ops.processes import Refusal, after_exit, backoff_s, plan, resolve
from memstream.ops.supervisor import busy_port, prepare

pytestmark = pytest.mark.unit
SECRET = "s" * 64


def _settings(tmp: Path, **over: object) -> Settings:
    base: dict[str, object] = {"data_dir": tmp / "d", "web_enabled": True, "web_port": 7000,
                               "group_instance_id": "host-abc", "cluster_secret": SECRET}
    return Settings(**{**base, **over})  # type: ignore[arg-type]


def test_resolve_numbers_auto_and_nonsense() -> None:
    assert resolve(1, 8) == 1
    assert resolve("3", 8) == 3
    assert resolve("auto", 2) == 2
    assert resolve("AUTO", 0) == 1
    for bad in (0, -1, "0", "many"):
        with pytest.raises(Refusal, match="MEMSTREAM_PROCESSES"):
            resolve(bad, 2)


def test_cpu_count_is_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs.os, "sched_getaffinity", lambda _pid: {0, 3, 5}, raising=False)
    assert procs.cpu_count() == 3
    monkeypatch.delattr(procs.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(procs.os, "cpu_count", lambda: None)
    assert procs.cpu_count() == 1


def test_each_child_its_data_dir_instance_id_and_port(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    children = plan(s, 3)
    assert [c.data_dir for c in children] == [s.data_dir / f"p{i}" for i in range(3)]
    assert [c.instance_id for c in children] == ["host-abc-p0", "host-abc-p1", "host-abc-p2"]
    assert [c.port for c in children] == [7001, 7002, 7003]
    env = children[1].env
    assert env["MEMSTREAM_PROCESSES"] == "1"  # a child never supervises
    assert env["MEMSTREAM_DATA_DIR"] == str(s.data_dir / "p1")
    assert env["MEMSTREAM_GROUP_INSTANCE_ID"] == "host-abc-p1"
    assert env["MEMSTREAM_WEB_PORT"] == "7002"
    assert env["MEMSTREAM_WEB_SHARED_PORT"] == "7000"  # the front port, shared by all
    assert "MEMSTREAM_ADVERTISED_URL" not in env  # derived from its own port
    assert "MEMSTREAM_CLUSTER_SECRET" not in env  # the configured one is inherited
    child = Settings(**{k.removeprefix("MEMSTREAM_").lower(): v for k, v in env.items()})
    assert child.api_url() == "http://127.0.0.1:7002"
    assert child.instance_id() == "host-abc-p1"


def test_derived_instance_ids_differ_and_off_stays_off(tmp_path: Path) -> None:
    derived = plan(_settings(tmp_path, group_instance_id=None), 2)
    assert derived[0].instance_id.endswith("-p0") and derived[1].instance_id.endswith("-p1")
    assert derived[0].instance_id != derived[1].instance_id
    off = plan(_settings(tmp_path, group_instance_id=""), 2)
    assert [c.instance_id for c in off] == ["", ""]


def test_advertised_url_keeps_its_host_with_each_childs_port(tmp_path: Path) -> None:
    s = _settings(tmp_path, advertised_url="https://pod-1.memstream.ns:7000/")
    urls = [c.env["MEMSTREAM_ADVERTISED_URL"] for c in plan(s, 2)]
    assert urls == ["https://pod-1.memstream.ns:7001", "https://pod-1.memstream.ns:7002"]
    assert procs.child_url("http://[::1]:7000", 7005) == "http://[::1]:7005"


def test_without_a_cluster_secret_the_children_share_the_given_one(tmp_path: Path) -> None:
    s = _settings(tmp_path, cluster_secret=None)
    assert all(c.env["MEMSTREAM_CLUSTER_SECRET"] == SECRET for c in plan(s, 2, SECRET))
    with pytest.raises(Refusal, match="MEMSTREAM_CLUSTER_SECRET"):
        plan(s, 2)


def test_without_the_api_no_ports(tmp_path: Path) -> None:
    children = plan(_settings(tmp_path, web_enabled=False), 2)
    assert [c.port for c in children] == [None, None]
    assert "MEMSTREAM_WEB_PORT" not in children[0].env


@pytest.mark.parametrize(("over", "says"), [
    ({"web_port": 0}, "MEMSTREAM_WEB_PORT=0"),
    ({"web_port": 65535}, "beyond 65535"),
    ({"web_port": 9090, "kafka_port": 9092}, "MEMSTREAM_KAFKA_PORT=9092"),
    ({"store_partitioned": False}, "MEMSTREAM_STORE_PARTITIONED"),
])
def test_refusals_are_one_line(tmp_path: Path, over: dict[str, object], says: str) -> None:
    with pytest.raises(Refusal, match=says) as caught:
        plan(_settings(tmp_path, **over), 3)
    assert "\n" not in str(caught.value)


def test_a_port_in_use_is_refused_before_any_child_starts(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert busy_port("127.0.0.1", [port]) == port
        with pytest.raises(Refusal, match=f"port {port} is in use"):
            prepare(_settings(tmp_path, web_port=port - 2), 2)  # p1 would take it


def test_the_supervisor_shares_the_data_dirs_secret(tmp_path: Path) -> None:
    s = _settings(tmp_path, cluster_secret=None, web_enabled=False)
    first = prepare(s, 2)[0].env["MEMSTREAM_CLUSTER_SECRET"]
    again = prepare(s, 2)[1].env["MEMSTREAM_CLUSTER_SECRET"]
    assert first == again == (s.data_dir / "record-secret").read_text().strip()


def test_restart_policy() -> None:
    assert after_exit(-9, stopping=False, failures=1) == procs.AfterExit(True, 1.0)
    assert after_exit(1, stopping=False, failures=3).delay_s == 4.0
    assert after_exit(0, stopping=False, failures=1).restart  # ended by itself: back
    assert after_exit(0, stopping=True, failures=1) == procs.AfterExit(False)  # we stopped it
    assert after_exit(-15, stopping=True, failures=1) == procs.AfterExit(False)
    config = after_exit(78, stopping=False, failures=1)
    assert not config.restart and config.exit_code == 78  # no restart loop
    assert backoff_s(100) == procs.MAX_BACKOFF_S
    assert procs.failures_after(4, ran_s=procs.STABLE_S) == 1  # it ran long: start afresh
    assert procs.failures_after(4, ran_s=1.0) == 5


def test_exit_code_after_a_stop() -> None:
    assert procs.exit_code([0, -15, None], stopped_by_signal=True) == 0
    assert procs.exit_code([0, -9], stopped_by_signal=True) == 1
    assert procs.exit_code([0, 3], stopped_by_signal=True) == 3


def test_cli_refuses_nonsense_in_one_line(tmp_path: Path) -> None:
    env = {"MEMSTREAM_DATA_DIR": str(tmp_path / "d")}
    got = CliRunner().invoke(main, ["worker", "--processes", "0"], env=env)
    assert got.exit_code == 78
    assert got.output.strip().count("\n") == 0 and "at least 1" in got.output
    got = CliRunner().invoke(main, ["worker", "--processes", "2"], env={
        **env, "MEMSTREAM_WEB_ENABLED": "true", "MEMSTREAM_WEB_PORT": "0"})
    assert got.exit_code == 78 and "MEMSTREAM_WEB_PORT=0" in got.output


async def test_two_servers_share_the_front_port() -> None:
    """Each child binds its own port and the front port (SO_REUSEPORT): the second child's
    bind of the front port must not fail, and the front port answers while either serves."""
    import httpx
    from aiohttp import web

    from memstream.web.http import HttpServer

    def app(name: str) -> web.Application:
        async def who(_: web.Request) -> web.Response:
            return web.Response(text=name)

        made = web.Application()
        made.router.add_get("/who", who)
        return made

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        front = probe.getsockname()[1]
    a = HttpServer(app("a"), "127.0.0.1", 0, shared_port=front)
    b = HttpServer(app("b"), "127.0.0.1", 0, shared_port=front)
    await a.start()
    try:
        await b.start()
        assert a.port not in (0, front) and b.port not in (0, front, a.port)
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"http://127.0.0.1:{b.port}/who")).text == "b"
            await a.stop()  # one child down: the front port still answers, from the other
            assert (await c.get(f"http://127.0.0.1:{front}/who")).text == "b"
    finally:
        await a.stop()
        await b.stop()


def test_one_process_is_the_plain_worker(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    """N=1 (the default, or MEMSTREAM_PROCESSES=1): the worker runs in this process, as
    before; no supervisor is started."""
    import memstream.cli as cli
    import memstream.ops.supervisor as supervisor

    ran: list[str] = []
    monkeypatch.setattr(cli, "_run_worker", lambda s, level: ran.append("worker"))
    monkeypatch.setattr(supervisor, "supervise", lambda *a: ran.append("supervisor") or 0)
    env = {"MEMSTREAM_DATA_DIR": str(tmp_path / "d")}
    assert CliRunner().invoke(main, ["worker"], env=env).exit_code == 0
    assert CliRunner().invoke(main, ["worker"], env={**env, "MEMSTREAM_PROCESSES": "1"}
                              ).exit_code == 0
    assert ran == ["worker", "worker"]
    got = CliRunner().invoke(main, ["worker", "--processes", "2"], env=env)
    assert got.exit_code == 0 and ran[-1] == "supervisor"
