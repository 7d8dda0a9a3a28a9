"""A local 3-node KRaft cluster (``memstream broker start --brokers 3``,
:class:`memstream.dev.broker.Cluster`): the leader of a partition SIGKILLed while an
acks=all producer writes to it (replication 3, min.insync.replicas 2), then restarted:
every acknowledged record is on the partition, and the ISR is full again. Then the chaos
benchmark's cluster mode at its smoke size on the same cluster (started once for the
module: a second cluster would add its start and stop to the test command): it must
finish and print its JSON line with its keys, like every benchmark in
test_benchmarks_smoke.py. Its own ports (``MEMSTREAM_TEST_CLUSTER_PORT``, default 19692:
nodes on 19692, 19702, 19712)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from benchmarks.run_all import by_name, dig, run_one
from memstream.core import kafka
from memstream.core.kafka_io import start_producer
from memstream.core.settings import Settings
from memstream.dev.broker import Cluster
from memstream.topics.layout import prepare
from memstream.topics.registry import all_topic_names, delete_topics

pytestmark = pytest.mark.integration
CLUSTER_PORT = int(os.environ.get("MEMSTREAM_TEST_CLUSTER_PORT", "19692"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(Settings(kafka_port=CLUSTER_PORT), 3)
    c.stop()  # a leftover of an interrupted run; its data is kept (formatted once)
    c.start()
    try:
        yield c
    finally:
        # the test's data is disposable: no waiting for a controlled shutdown that the
        # last node may not get (its peers gone); a SIGKILLed node recovers its log
        c.stop(timeout=5.0)


async def test_memstream_topics_are_created_3_2_replicated_on_three_brokers(cluster: Cluster):
    name = f"it-cl-{uuid.uuid4().hex[:8]}"
    settings = cluster.client_settings().model_copy(update={"topic_prefix": name,
                                                            "app_id": name})
    try:
        layout = await prepare(settings)
        assert (layout.replication.factor, layout.replication.min_insync,
                layout.replication.brokers) == (3, 2, 3)
        described = await cluster.describe([f"{name}.messages"])
        assert all(len(p["replicas"]) == 3 for p in described[0]["partitions"])
    finally:
        await delete_topics(settings, all_topic_names(settings))


async def test_a_killed_leader_loses_nothing_acknowledged(cluster: Cluster):
    settings = cluster.client_settings()
    topic = f"it-cl-{uuid.uuid4().hex[:8]}"
    admin = kafka.admin(settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 3, topic_configs={
            "min.insync.replicas": "2", "unclean.leader.election.enable": "false"})])
    finally:
        await admin.close()
    await cluster.wait_in_sync(60)
    acked: list[int] = []
    sent = 0
    stop = asyncio.Event()

    async def producing() -> None:
        nonlocal sent
        producer = await start_producer(settings, request_timeout_ms=60_000)
        pending: list[asyncio.Future[object]] = []
        try:
            while not stop.is_set():
                fut = await producer.send(topic, str(sent).encode(), partition=0)
                fut.add_done_callback(
                    lambda f, i=sent: acked.append(i) if not f.exception() else None)
                pending.append(fut)
                sent += 1
                await asyncio.sleep(0.01)
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await producer.stop()

    async def until_acked(n: int, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while len(acked) < n:
            assert time.monotonic() < end, f"{len(acked)} of {n} acknowledged"
            await asyncio.sleep(0.1)

    task = asyncio.create_task(producing())
    try:
        await until_acked(50)
        leader = await cluster.leader(topic, 0)
        assert leader in (1, 2, 3)
        await asyncio.to_thread(cluster.kill, leader)
        at_kill = len(acked)
        await until_acked(at_kill + 100)  # a new leader takes the writes
        assert await cluster.leader(topic, 0) not in (leader, -1)
        await asyncio.to_thread(cluster.restart, leader)
        await cluster.wait_in_sync(90)
        await until_acked(len(acked) + 50)
    finally:
        stop.set()
        await task
    consumer = kafka.consumer(settings, enable_auto_commit=False,
                              isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        seen: list[int] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=2000)
            seen += [int(r.value) for r in batch.get(tp, [])]
    finally:
        await consumer.stop()
    lost = sorted(set(acked) - set(seen))
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
    assert len(seen) == len(set(seen))  # the idempotent producer wrote none twice
    assert not await cluster.out_of_sync()


def test_the_chaos_benchmark_runs_on_the_cluster_at_its_smoke_size(cluster: Cluster):
    """chaos.py --brokers 3 --kill-leader 1 at its smoke size on this cluster
    (--reuse-broker: it neither starts nor stops it): one partition leader SIGKILLed and
    back after 1 s, the librdkafka producer placing records by CRC-32 (each re-routed), no
    worker kill (the registry's chaos smoke has one). ~35 s."""
    (chaos,) = by_name(["chaos"])
    bench = replace(
        chaos, broker=False,
        smoke=("--smoke", "--brokers", "3", "--kill-leader", "1", "--leader-down", "1",
               "--kills", "0", "--producer", "librdkafka", "--port", str(CLUSTER_PORT),
               "--reuse-broker"),
        keys=(*chaos.keys, "brokers", "leader_kills_done", "acked_lost", "acked_uncovered",
              "misplaced_acked", "misplaced_on_topics", "repartition_records"))
    command = bench.command(smoke=True, bootstrap=None)
    assert command is not None
    result = run_one(bench, command, 300.0)
    assert result["exit"] == 0, result["stderr_tail"]
    found = result["json"]
    assert found is not None, "no JSON object on the last stdout line"
    assert not [k for k in bench.keys if dig(found, k) is None], found
    assert all(pid is not None for pid in cluster.pids().values())  # left running
